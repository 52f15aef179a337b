// The host side of both trainers: the command line, setting up the model,
// the training loop, evaluation, sampling, checkpoints and exact resume, the
// metrics, FLOPs and the memory plan, and main's built-in default run. It
// computes nothing itself: a backend does, through the functions below.
//
// The backend contract. A trainer (train_llama2.c on the CPU, train_llama2.cu
// on the GPU) defines these with the same names, then includes this file:
//
//   typedef struct { ... } Model; with at least these members:
//       HostModel host;        config, host weights, LoRA (model.h). The trainer
//                              fills it before model_alloc; host.lora.training
//                              says whether LoRA dropout applies (off to evaluate);
//                              host.frozen_units: full fine-tuning's units that get no
//                              gradient and no optimizer state (--freeze_layers)
//       int B, T;              capacity: micro-batches of up to B rows of T tokens
//       int chunk_size;        C, positions per chunk (== T: whole sequences)
//       int recompute;         chunk memory mode: 1 recompute, 0 keep
//       int activation_checkpointing;  set by the trainer before model_alloc:
//                              keep only each layer's input per chunk and re-run
//                              a layer's forward before its backward (the same
//                              results, bit for bit, in less memory)
//       int s2_attn;           set by the trainer before model_alloc: --s2_attn, LongLoRA's
//                              shifted sparse attention (chunk.h) in
//                              model_forward_backward only: model_forward (evaluation)
//                              and model_next_logits (sampling) attend fully
//       int fp32, fp16;        set by the trainer before model_alloc: --precision fp32
//                              or fp16 (neither: bf16; fp16 and bf16 store the weights and
//                              activations in that type)
//       int pure_bf16;         set by the trainer before model_alloc: --pure_bf16 (full
//                              fine-tuning, --optimizer anyprecision): the weights (rounded
//                              to bf16 at load), gradients and optimizer state bf16, no fp32
//                              copy; each micro-batch's gradient rounded to bf16 once and
//                              added to the step's in bf16 (docs/precision.md)
//       int cpu_offload;       set by the trainer before model_alloc: --cpu_offload (full
//                              fine-tuning): the masters, gradients and optimizer state in
//                              host memory, the step on the CPU, the same results
//       const char *collectives;  set by the trainer before model_alloc: --collectives,
//                              one of backend_collectives
//       int dry_run;           set by the trainer before model_alloc: --dry_run, after
//                              which only the memory plan is read and model_free
//                              called; model_alloc may then count the bytes and
//                              allocate nothing (the GPU backend touches no GPU)
//       size_t weight_bytes;   bytes of the base weights as stored        }
//       size_t param_bytes;    bytes of the trainable parameters, their   }
//                              gradients, optimizer state and any copies  } for the
//       size_t act_bytes;      bytes of activations and scratch           } memory plan
//       size_t carry_bytes;    bytes of the KV and dKV carries            }
//       uint64_t dropout_key;  set by the trainer before each model_forward_backward
//       int row0;              set by the trainer: this rank's first row in the global
//                              micro-batch (LoRA dropout: lora_dropout_chunk)
//       Fsdp *fsdp;            set by the trainer before model_alloc: the ranks and the
//                              sharding strategy; host_sharded(&m->host) means the base
//                              weights are sharded (m->host.shards, or the backend's)
//       OptimizerSettings optimizer;  set by the trainer before model_alloc: what
//                              optimizer_init sets up and optimizer_step runs
//                              (support/optimizer.h; its state counts in param_bytes)
//   static const int backend_sharding;  1: the backend runs any number of ranks (a
//                              sharded host model, the collectives in its forward and
//                              backward, the gradient sums in optimizer_step); 0: one
//                              process only
//   static const int backend_context_parallel;  1: its model_forward_backward runs a
//                              context-parallel group's pieces of the rows
//                              (--context_parallel, fsdp.h's context group), its
//                              model_forward (evaluation) too, its carries this rank's
//                              positions only (B T / P a layer); 1: with every option the
//                              CPU trainer runs (--s2_attn, sampling, ...); 2: with what its
//                              tests cover so far (parse_args refuses the rest); 0: refused
//   static const char *const backend_precisions[];  the --precision values it runs,
//                              its default first
//   static const char *const backend_collectives[]; the --collectives values it runs,
//                              its default first (how its ranks' collectives move data)
//   static const char *const backend_memory;        where the memory plan's memory
//                              is ("resident memory", "GPU memory")
//   BACKEND_HOST_PLAN (a macro) where that is not host memory, with
//       HOST_PLAN_PARTS, host_plan_names[HOST_PLAN_PARTS] and
//       double model_host_bytes(const Model *m, int part): the host memory beside
//       it, part by part (the plan's host section); without it the plan is host memory
//   static const char *const model_host_advice;     what else makes the host plan smaller
//   BACKEND_STEP_IN_BACKWARD (a macro) where the optimizer may step parameters while the
//       backward runs, with void optimizer_begin_step(Optimizer *o, int step, float lr,
//       int micro_batches, int loss_scaled): before a step's first model_forward_backward,
//       its number (1-based), learning rate (optimizer_step's lr), micro-batches, and whether
//       a loss scale may skip it
//   size_t model_dequant_scratch_bytes(const Model *m);
//       QLoRA (m->host.quant_type): the bytes of the memory a layer's 4-bit weights are
//       dequantized into (part of m->weight_bytes)
//   double model_peak_mb(Model *m);
//       the most memory the run has held so far, in MiB (of backend_memory)
//   void model_plan(Model *m, int B, int T, int C, int recompute, int num_output_chunks);
//       before model_alloc: the bytes (weight_bytes .. carry_bytes) model_alloc would
//       plan for this capacity, allocating nothing (--batch_size auto tries several)
//   void model_alloc(Model *m, int B, int T, int C, int recompute, int num_output_chunks);
//       everything but m->host, for chunks of C positions (C <= 0 or > T: T);
//       a GPU backend uploads m->host here
//   static const int backend_measures_free_memory;  1: model_memory_budget knows what is
//                              free without --memory_limit; 0: --batch_size auto needs it
//   static const int backend_streams_base;  1: a base whole on one rank (LoRA's; full
//                              fine-tuning's without --cpu_offload's fp32 masters), or full fine-tuning's
//                              shards of it (without them too), is not loaded into m->host (base_deferred):
//                              model_alloc reads it (model_stream_base; a sharded checkpoint's:
//                              load_trainable through host.shards_put) where the backend
//                              computes from it, and full fine-tuning's saves read the weights
//                              back a piece at a time through host.weights_get (sharded:
//                              host.shards_get)
//   double model_memory_budget(Model *m, double limit);
//       before model_alloc: the bytes the memory plan may total under --memory_limit
//       (limit bytes; 0: none given)
//   void model_free(Model *m);
//       all of it, m->host included; safe on a zeroed Model and after a failed load
//   double model_forward(Model *m, const int *tokens, const int *targets, int B, int T, float *logits_out);
//       summed cross-entropy of B rows of T tokens over targets != -100, no
//       gradients; tokens, targets (B, T) in host memory; logits_out (B, T, V)
//       host memory, or NULL
//   double model_forward_backward(Model *m, const int *tokens, const int *targets, int B, int T, float grad_scale);
//       the same loss, and adds grad_scale * d(loss)/d(trainable) into the gradients
//   float *model_next_logits(Model *m, const int *seq, const Chunk *ch);
//       runs positions ch->t0 .. ch->t0 + ch->len - 1 of one sequence (ch->B = 1,
//       ch->T = m->T, or with context parallelism, whose carries hold m->B m->T / P
//       positions a layer, that many if fewer; ch->len <= m->B * m->chunk_size) through the model,
//       adding their keys and values to the KV carry; returns the last
//       position's logits (V) in host memory, valid until the next call
//   typedef struct { ... } Optimizer; with at least these members:
//       size_t n;              trainable parameters (LoRA's, or every weight of the
//                              units that train: model_trainable_numel)
//       int t;                 optimizer steps taken
//   void optimizer_init(Optimizer *o, Model *m);   m->optimizer's, state at zero, t = 0
//                              (a dry run's: n alone, nothing allocated)
//   void optimizer_free(Optimizer *o);             safe on a zeroed Optimizer
//   void optimizer_zero_grad(Optimizer *o);
//   double optimizer_step(Optimizer *o, float lr, float inv_scale, int update);
//       the gradients hold 1 / inv_scale times the true ones (a loss scale,
//       a power of two; 1 without one): the global norm of the true gradients
//       (returned, before clipping); then, if update and the norm is finite,
//       the gradients times inv_scale (torch's GradScaler.unscale_) and clipped
//       as torch.nn.utils.clip_grad_norm_ (grad_clip 0: off), and one step of
//       the optimizer (torch.optim.AdamW or torch.optim.SGD); else nothing (t
//       and the state stay)
//   const OptimTensors *opt_tensors  (a Model's member) AdamW8bit: the trainable tensors
//   int optimizer_state_get(Optimizer *o, int i, size_t first, size_t count, void *dst);
//   void optimizer_state_set(Optimizer *o, int i, size_t first, size_t count, const void *src);
//       elements [first, first + count) of state tensor i (optimizer_n_states of them,
//       optimizer_state_count's elements each: AdamW's moments, SGD's momentum buffer,
//       n floats; AdamW8bit's codes, absmax and fp32 moments; full fine-tuning in
//       model_trainable_runs' order) out to host memory and back in: checkpoints save
//       and load the state through these, a staging buffer at a time, so the CUDA
//       trainer keeps no host copy of it. get returns 0.
//   int optimizer_state_finite(Optimizer *o);   1 when every state element is finite
//   void model_sync_host(Model *m);
//       before a save: the trainable weights into m->host (sharded: host.shards; a streamed
//       base's: nothing, weights_get or shards_get reads them) (the CPU backend: nothing to do)
//   void optimizer_sync_device(Optimizer *o);
//       after a checkpoint's t (and a sharded one's weights, into m->host.shards or through
//       host.shards_put) were read into o and m (the CPU: nothing)
//
// A test or tool can include the trainer with -DTESTING and call any of it;
// main is the trainer's own, a call to train_main.
#ifndef TRAINER_H
#define TRAINER_H
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <errno.h>
#include <time.h>
#include <signal.h>
#include <limits.h>
#include <sys/resource.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "support/utils.h"
#include "support/json.h"
#include "support/safetensors.h"
#include "tokenizer.h"
#include "dataloader.h"
#include "support/checkpoint.h"
#include "support/default_model.h"
#include "support/tensorboard.h"
#include "support/profile.h"
#include "support/optimizer.h"
#include "model.h"
#include "support/export_gguf.h"

// ----------------------------------------------------------------------------
// learning-rate schedules as transformers'

// learning rate for optimizer step s (0-based), as transformers' get_*_schedule_with_warmup
static float lr_at(const char *sched, float base, int s, int warmup, int total) {
    if (s < warmup) return base * (float)s / (float)(warmup > 1 ? warmup : 1);
    if (strcmp(sched, "constant") == 0) return base;
    double progress = (double)(s - warmup) / (double)(total - warmup > 1 ? total - warmup : 1);
    if (strcmp(sched, "linear") == 0) return (float)(base * fmax(0.0, (double)(total - s) / fmax(1.0, total - warmup)));
    return (float)(base * fmax(0.0, 0.5 * (1.0 + cos(M_PI * progress)))); // cosine, half a cycle
}

// ----------------------------------------------------------------------------
// dynamic loss scaling as torch.amp.GradScaler's defaults
//
// fp16 has 5 exponent bits: gradients below 2^-24 flush to zero in its
// activations' backward. The loss (and so every gradient) is multiplied by a
// scale, a power of two, and the fp32 gradients divided by it again before
// clipping (exact: a power of two). A step whose gradients overflow (inf or
// NaN) is skipped and the scale halved; after LOSS_SCALE_GROWTH_INTERVAL steps
// in a row without one it doubles. The learning-rate schedule moves on over a
// skipped step (a torch loop calls scheduler.step() every iteration), AdamW's
// step count does not (optimizer.step() did not run).

#define LOSS_SCALE_INIT 65536.0f          // 2^16
#define LOSS_SCALE_GROWTH 2.0f
#define LOSS_SCALE_BACKOFF 0.5f
#define LOSS_SCALE_GROWTH_INTERVAL 2000
typedef struct {
    int on;             // --loss_scale dynamic (auto: with --precision fp16)
    float scale;        // the loss scale of the next step
    int growth_tracker; // steps in a row without an overflow since the last change
} LossScale;

static void loss_scale_init(LossScale *ls, int on) {
    ls->on = on;
    ls->scale = on ? LOSS_SCALE_INIT : 1.0f;
    ls->growth_tracker = 0;
}

// after a step: found_inf says whether its gradients had an inf or NaN (torch's _amp_update_scale_)
static void loss_scale_update(LossScale *ls, int found_inf) {
    if (!ls->on) return;
    if (found_inf) {
        ls->scale *= LOSS_SCALE_BACKOFF;
        ls->growth_tracker = 0;
    } else if (++ls->growth_tracker == LOSS_SCALE_GROWTH_INTERVAL) {
        if (isfinite(ls->scale * LOSS_SCALE_GROWTH)) ls->scale *= LOSS_SCALE_GROWTH;
        ls->growth_tracker = 0;
    }
}

// ----------------------------------------------------------------------------
// command line

#define MAX_LIST 16
#define BATCH_SIZE_MAX (1 << 16) // --batch_size's largest, and --batch_size auto's
typedef struct { const char *v[MAX_LIST]; int n; } StrList; // a repeatable option's values

typedef struct {
    const char *model, *data, *val_data, *output_dir, *tokenizer, *metrics_file, *tensorboard_dir, *from_peft_checkpoint;
    const char *profile_dir, *profile_steps;
    int profile_first, profile_last; // --profile_steps (parse_args)
    int max_seq_len, batch_size, grad_accum, global_batch_size, max_steps, num_epochs, warmup_steps, seed, shuffle;
    float memory_limit, host_memory_limit;
    int eval_every, full_finetune, pure_bf16, freeze_layers, cpu_offload, lora_r, use_rslora, use_dora, threads, chunk_size, num_output_chunks, activation_checkpointing, s2_attn, context_parallel;
    float lr, lora_alpha, lora_dropout;
    const char *optimizer;
    OptimizerSettings optim; // the optimizer's settings; its kind from --optimizer (parse_args)
    const char *lr_scheduler, *lora_target_modules, *trainable_params, *chunk_memory;
    const char *peft_method, *ia3_target_modules, *ia3_feedforward_modules;
    int adapter_len, adapter_layers, num_virtual_tokens;
    const char *resume;
    int save_every, keep_checkpoints, max_bad_steps;
    const char *data_format, *batching, *data_slice, *data_cache_dir;
    int train_on_prompt, max_samples;
    float val_split;
    StrList sample_prompt;
    int sample_every, max_new_tokens;
    float temperature, top_p;
    int dry_run, merge_adapter;
    float peak_tflops;
    const char *precision, *collectives, *loss_scale;
    const char *sharding_strategy, *export_hf;
    const char *export_gguf, *export_gguf_adapter, *gguf_type;
    int gguf_ftype;           // --gguf_type as an index of gguf_type_names (parse_args)
    int shard_group;
    int random_init;
    const char *quantize;
    int quant_type;           // --quantize as quant.h's type (parse_args)
    int double_quant;
} TrainConfig;

enum { OPT_STR, OPT_INT, OPT_INT_AUTO, OPT_FLOAT, OPT_FLAG, OPT_LIST }; // OPT_INT_AUTO: an integer, or auto (stored as 0)
typedef struct { const char *name; int type; void *ptr; const char *def, *help; double lo, hi; } Option;

#define OPTIONS(tc) { \
    {"model", OPT_STR, &(tc)->model, "", "Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.model or tokenizer.json)", 0, 0}, \
    {"data", OPT_STR, &(tc)->data, "", "training data: JSONL or a JSON array of records (see --data_format)", 0, 0}, \
    {"data_format", OPT_STR, &(tc)->data_format, "auto", "auto | text | prompt_response | alpaca | samsum | chat (auto: from the first record's keys)", 0, 0}, \
    {"train_on_prompt", OPT_INT, &(tc)->train_on_prompt, "0", "1: prompt tokens carry loss too; 0: only the response does", 0, 1}, \
    {"batching", OPT_STR, &(tc)->batching, "padding", "padding: one sample per row; packing: samples concatenated into full --max_seq_len rows", 0, 0}, \
    {"max_samples", OPT_INT, &(tc)->max_samples, "0", "use only the first N samples (0: all)", 0, 2147483647}, \
    {"data_slice", OPT_STR, &(tc)->data_slice, "", "records to use, HF datasets style: [:10%], [10%:20%], [:100], [50:]", 0, 0}, \
    {"data_cache_dir", OPT_STR, &(tc)->data_cache_dir, "", "where the token cache goes (default: next to the data file)", 0, 0}, \
    {"val_data", OPT_STR, &(tc)->val_data, "", "validation data (same format options; evaluated at the end and every --eval_every steps)", 0, 0}, \
    {"val_split", OPT_FLOAT, &(tc)->val_split, "0", "hold out this fraction of --data's samples for validation (seeded)", 0, 0.99}, \
    {"output_dir", OPT_STR, &(tc)->output_dir, "output", "where the PEFT adapter (or the full model) is written at the end", 0, 0}, \
    {"tokenizer", OPT_STR, &(tc)->tokenizer, "", "tokenizer to use: a sentencepiece tokenizer.model or a Hugging Face tokenizer.json with a byte-level BPE (default: --model's tokenizer.model, else its tokenizer.json)", 0, 0}, \
    {"metrics_file", OPT_STR, &(tc)->metrics_file, "", "write one JSON object per step and per evaluation to this file", 0, 0}, \
    {"tensorboard_dir", OPT_STR, &(tc)->tensorboard_dir, "", "write TensorBoard event files into this folder: the step's scalars under Hugging Face Trainer's names (train/loss, train/learning_rate, ...), the configuration as text", 0, 0}, \
    {"profile_dir", OPT_STR, &(tc)->profile_dir, "", "write a Chrome/Perfetto trace of the --profile_steps into this folder (trace.json; with several ranks one per rank, trace.rank<R>.json): data loading, each layer's forward and backward per chunk, the head, the collectives with their bytes, the optimizer, checkpoint writes, on the GPU per stream; open it in ui.perfetto.dev", 0, 0}, \
    {"profile_steps", OPT_STR, &(tc)->profile_steps, "3-5", "the steps --profile_dir traces, A-B (1-based, as printed; the first steps warm up)", 0, 0}, \
    {"max_seq_len", OPT_INT, &(tc)->max_seq_len, "512", "sequences are truncated to this many tokens", 2, 1 << 20}, \
    {"batch_size", OPT_INT_AUTO, &(tc)->batch_size, "4", "rows per micro-batch, or auto: the most that the memory plan fits in --memory_limit", 1, BATCH_SIZE_MAX}, \
    {"host_memory_limit", OPT_FLOAT, &(tc)->host_memory_limit, "0", "GiB of host memory the run may take (0: what the machine has available at start, MemAvailable); a run whose host memory plan exceeds it is refused before it trains (a --dry_run says so)", 0, 1 << 20}, \
    {"memory_limit", OPT_FLOAT, &(tc)->memory_limit, "0", "GiB the memory plan may take per process with --batch_size auto (0: on the GPU its free memory less a reserve; the CPU trainer needs it given)", 0, 1 << 20}, \
    {"gradient_accumulation_steps", OPT_INT, &(tc)->grad_accum, "0", "micro-batches per optimizer step (0: 1, or what --global_batch_size needs)", 0, 1 << 16}, \
    {"global_batch_size", OPT_INT, &(tc)->global_batch_size, "0", "rows per optimizer step over every rank: --gradient_accumulation_steps becomes this / (--batch_size x ranks), so any world size trains alike (0: --batch_size x ranks x --gradient_accumulation_steps)", 0, 1 << 30}, \
    {"max_steps", OPT_INT, &(tc)->max_steps, "-1", "optimizer steps (-1: as many as --num_epochs needs)", -1, 1 << 30}, \
    {"num_epochs", OPT_INT, &(tc)->num_epochs, "1", "passes over the data when --max_steps is -1", 1, 1 << 20}, \
    {"lr", OPT_FLOAT, &(tc)->lr, "1e-4", "peak learning rate", 0, 1e3}, \
    {"optimizer", OPT_STR, &(tc)->optimizer, "adamw", "adamw | sgd | adamw8bit | anyprecision: torch.optim.AdamW; torch.optim.SGD (dampening 0; with --momentum and --nesterov); llama-recipes' AnyPrecisionAdamW with bf16 moments (with --pure_bf16 1 only: it steps bf16 weights; --kahan_summation); torchao's AdamW8bit (tensors of 4096+ elements in whole blocks of 256 keep 8-bit moments, a code per element and an absmax per block, the rest fp32 ones; checkpoints keep the codes and absmax, so a resume is exact; bitsandbytes' AdamW8bit differs: it decays after the Adam step, places eps otherwise, and its newer unsigned map has one more bit; sharded full fine-tuning cuts the shards at whole blocks, which needs the 8-bit tensors to start at multiples of 256 in their units: every real Llama-family model)", 0, 0}, \
    {"weight_decay", OPT_FLOAT, &(tc)->optim.weight_decay, "0.0", "weight decay of every trainable tensor: AdamW's is decoupled (p -= lr * wd * p), SGD's is added to the gradient (g += wd * p), as torch's", 0, 1e3}, \
    {"adam_beta1", OPT_FLOAT, &(tc)->optim.beta1, "0.9", "AdamW beta1", 0, 0.999999}, \
    {"adam_beta2", OPT_FLOAT, &(tc)->optim.beta2, "0.999", "AdamW beta2", 0, 0.9999999}, \
    {"adam_epsilon", OPT_FLOAT, &(tc)->optim.eps, "1e-8", "AdamW epsilon", 0, 1}, \
    {"momentum", OPT_FLOAT, &(tc)->optim.momentum, "0", "SGD momentum (0: plain SGD, which keeps no optimizer state)", 0, 1}, \
    {"nesterov", OPT_INT, &(tc)->optim.nesterov, "0", "SGD: 1 for Nesterov momentum (needs --momentum > 0)", 0, 1}, \
    {"kahan_summation", OPT_INT, &(tc)->optim.kahan, "0", "--optimizer anyprecision: 1 keeps a bf16 compensation buffer (Kahan summation) that carries the part of each update the bf16 weights cannot take into later steps (llama-recipes' use_kahan_summation; 2 more bytes a parameter)", 0, 1}, \
    {"lr_scheduler", OPT_STR, &(tc)->lr_scheduler, "cosine", "constant | linear | cosine (each after --warmup_steps of linear warmup)", 0, 0}, \
    {"warmup_steps", OPT_INT, &(tc)->warmup_steps, "0", "linear warmup steps", 0, 1 << 30}, \
    {"grad_clip", OPT_FLOAT, &(tc)->optim.grad_clip, "1.0", "clip the global gradient norm to this (0: off)", 0, 1e9}, \
    {"seed", OPT_INT, &(tc)->seed, "42", "seed for LoRA init, dropout and shuffling", 0, 2147483647}, \
    {"shuffle", OPT_INT, &(tc)->shuffle, "1", "1: shuffle rows every epoch, 0: file order", 0, 1}, \
    {"eval_every", OPT_INT, &(tc)->eval_every, "0", "evaluate --val_data every N steps (0: only at the end)", 0, 1 << 30}, \
    {"full_finetune", OPT_FLAG, &(tc)->full_finetune, "0", "train every weight instead of LoRA adapters", 0, 1}, \
    {"pure_bf16", OPT_INT, &(tc)->pure_bf16, "0", "1: full fine-tuning in bf16 with no fp32 copy, as llama-recipes' --pure_bf16 (model.to(torch.bfloat16)): the weights (rounded to bf16 at load), gradients and optimizer state bf16; each micro-batch's gradient rounded to bf16 once and added to the step's in bf16, sums over ranks rounded to bf16; with --optimizer anyprecision. train_llama2cu: --precision bf16, the bf16 weights the parameters themselves (8 bytes a parameter, 10 with --kahan_summation 1; with --cpu_offload 1 on the host); the CPU trainer holds the same bf16 values and computes in fp32 from them", 0, 1}, \
    {"freeze_layers", OPT_INT, &(tc)->freeze_layers, "0", "with --full_finetune: the embedding (and a head tied to it) and the first N decoder layers do not train: no gradient, no optimizer state (llama-recipes' freeze_layers / num_freeze_layers, which leaves the embedding training)", 0, 1 << 20}, \
    {"lora_r", OPT_INT, &(tc)->lora_r, "8", "LoRA rank", 1, 65536}, \
    {"lora_alpha", OPT_FLOAT, &(tc)->lora_alpha, "16", "LoRA alpha (scale = alpha / r)", 0, 1e6}, \
    {"lora_dropout", OPT_FLOAT, &(tc)->lora_dropout, "0.05", "dropout on the LoRA input", 0, 0.99}, \
    {"lora_target_modules", OPT_STR, &(tc)->lora_target_modules, "q_proj,v_proj", "comma-separated peft module names, or all-linear", 0, 0}, \
    {"trainable_params", OPT_STR, &(tc)->trainable_params, "", "LoRA: base tensors that also train, whole in fp32 (LongLoRA's; peft's modules_to_save): a comma list of embed (the embedding, with tied embeddings the head too) and norm (every RMSNorm weight)", 0, 0}, \
    {"use_rslora", OPT_INT, &(tc)->use_rslora, "0", "1: scale = alpha / sqrt(r) (rank-stabilised LoRA)", 0, 1}, \
    {"use_dora", OPT_FLAG, &(tc)->use_dora, "0", "DoRA (peft's use_dora): a trained magnitude per output rescales each adapted layer's rows", 0, 1}, \
    {"peft_method", OPT_STR, &(tc)->peft_method, "lora", "lora | ia3 | llama_adapter | prefix: the adapter trained (ia3: peft's IA3, a learned vector scaling each target module's output, or a feedforward module's input; llama_adapter: peft's AdaptionPrompt, a learned prompt with a gate from 0 in the top layers' attention; prefix: peft's PrefixTuning, learned keys and values of --num_virtual_tokens positions ahead of the sequence in every layer)", 0, 0}, \
    {"ia3_target_modules", OPT_STR, &(tc)->ia3_target_modules, "k_proj,v_proj,down_proj", "with --peft_method ia3: comma-separated peft module names, or all-linear (peft's IA3Config target_modules)", 0, 0}, \
    {"ia3_feedforward_modules", OPT_STR, &(tc)->ia3_feedforward_modules, "down_proj", "with --peft_method ia3: the targets whose input the vector scales (the rest: their output), a subset of --ia3_target_modules", 0, 0}, \
    {"adapter_len", OPT_INT, &(tc)->adapter_len, "10", "with --peft_method llama_adapter: the prompt's rows (peft's adapter_len; at most 1024)", 1, ADAPTER_MAX_LEN}, \
    {"adapter_layers", OPT_INT, &(tc)->adapter_layers, "30", "with --peft_method llama_adapter: how many decoder layers, from the top, have a prompt (peft's adapter_layers; at most the model's)", 1, 1 << 20}, \
    {"num_virtual_tokens", OPT_INT, &(tc)->num_virtual_tokens, "30", "with --peft_method prefix: the learned positions ahead of the sequence (peft's num_virtual_tokens; llama-recipes' 30)", 1, PREFIX_MAX_TOKENS}, \
    {"from_peft_checkpoint", OPT_STR, &(tc)->from_peft_checkpoint, "", "start from this PEFT adapter folder (LoRA, IA3, llama_adapter or prefix, with its settings: r, alpha, targets, feedforward modules, adapter_len, adapter_layers, num_virtual_tokens)", 0, 0}, \
    {"chunk_size", OPT_INT, &(tc)->chunk_size, "0", "train each sequence in chunks of this many tokens with a KV carry (0: whole)", 0, 1 << 20}, \
    {"chunk_memory", OPT_STR, &(tc)->chunk_memory, "keep", "keep: every chunk's activations until its backward; recompute: re-run a chunk's forward before its backward", 0, 0}, \
    {"activation_checkpointing", OPT_FLAG, &(tc)->activation_checkpointing, "0", "keep only each layer's input and re-run the layer's forward before its backward: less activation memory, the same results (HF's gradient_checkpointing, torchtune's enable_activation_checkpointing)", 0, 1}, \
    {"s2_attn", OPT_INT, &(tc)->s2_attn, "0", "1: LongLoRA's shifted sparse attention (S2-Attn) in training: each row of T tokens is cut in 4 groups of T/4, half the query heads attend within them, the other half within groups shifted by T/8 (evaluation and sampling attend fully; needs --batching packing and a --max_seq_len that is a multiple of 4; not with a sliding-window model)", 0, 1}, \
    {"num_output_chunks", OPT_INT, &(tc)->num_output_chunks, "1", "run the output head and loss in this many pieces of a chunk", 1, 1 << 20}, \
    {"threads", OPT_INT, &(tc)->threads, "0", "OpenMP threads (0: OpenMP's default)", 0, 4096}, \
    {"save_every", OPT_INT, &(tc)->save_every, "0", "write a checkpoint every N steps (and at the end; 0: only at the end)", 0, 1 << 30}, \
    {"keep_checkpoints", OPT_INT, &(tc)->keep_checkpoints, "2", "keep the newest K checkpoints (0: all)", 0, 1 << 20}, \
    {"max_bad_steps", OPT_INT, &(tc)->max_bad_steps, "5", "stop when this many steps in a row have a NaN or infinite loss or gradient norm (each is skipped; with --loss_scale, gradient overflows under a finite loss do not count while the scale is >= 1)", 1, 1 << 30}, \
    {"resume", OPT_STR, &(tc)->resume, "", "continue from a checkpoint folder, or the newest checkpoint in an --output_dir", 0, 0}, \
    {"sample_prompt", OPT_LIST, &(tc)->sample_prompt, "", "print a continuation of this prompt before and after training (repeatable)", 0, 0}, \
    {"sample_every", OPT_INT, &(tc)->sample_every, "0", "also print the samples every N steps (0: only before and after)", 0, 1 << 30}, \
    {"max_new_tokens", OPT_INT, &(tc)->max_new_tokens, "48", "tokens to generate per sample", 1, 1 << 20}, \
    {"temperature", OPT_FLOAT, &(tc)->temperature, "0", "sampling temperature (0: greedy)", 0, 100}, \
    {"cpu_offload", OPT_INT, &(tc)->cpu_offload, "0", "1: full fine-tuning keeps the fp32 masters, gradients and optimizer state in host memory (--pure_bf16: the bf16 weights, the step's bf16 gradients and AnyPrecisionAdamW's bf16 state), steps on the CPU and copies the updated weights back to the GPU (llama-recipes' fsdp_cpu_offload, DeepSpeed's ZeRO-Offload); each rank offloads its shards; the results are those without it, bit for bit. With --grad_clip 0, no loss scale and no sum over replicas (one process, FULL_SHARD, SHARD_GRAD_OP; not --pure_bf16 with --chunk_size) each unit steps as soon as its gradient is final, overlapped with the rest of the backward, and a NaN or inf gradient then stops the run instead of skipping the step (--grad_clip 1e9: the same results, the step after the backward). The CPU trainer holds them there already", 0, 1}, \
    {"dry_run", OPT_FLAG, &(tc)->dry_run, "0", "print the configuration and the memory plan, then exit", 0, 1}, \
    {"merge_adapter", OPT_FLAG, &(tc)->merge_adapter, "0", "LoRA or IA3: also save OUTPUT_DIR/merged, a Hugging Face model with the adapter folded in", 0, 1}, \
    {"peak_tflops", OPT_FLOAT, &(tc)->peak_tflops, "0", "the machine's peak TFLOP/s, to report MFU (0: report TFLOP/s only)", 0, 1e6}, \
    {"top_p", OPT_FLOAT, &(tc)->top_p, "0.9", "nucleus sampling: draw from the smallest set of tokens with this much probability", 0, 1}, \
    {"sharding_strategy", OPT_STR, &(tc)->sharding_strategy, "FULL_SHARD", "FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD: how the ranks (mpirun -np W, torchrun, dev/launch.sh W) share the model (one process: no effect)", 0, 0}, \
    {"context_parallel", OPT_INT, &(tc)->context_parallel, "1", "context parallelism: groups of this many consecutive ranks hold different positions of the same rows (each row padded to a multiple of 2P and cut in 2P pieces, rank r taking pieces r and 2P-1-r; with --chunk_size C, in pieces of C, P to a group, in alternating order), each rank keeping its own positions' keys and values and gathering every rank's per layer (docs/long_context.md); it divides the world size, the rest is data parallelism", 1, 1 << 20}, \
    {"shard_group", OPT_INT, &(tc)->shard_group, "0", "HYBRID_SHARD: ranks per shard group, a divisor of the world size (0: the ranks of one node)", 0, 1 << 20}, \
    {"export_hf", OPT_STR, &(tc)->export_hf, "", "with --resume: write that checkpoint as a Hugging Face model (full fine-tuning) or PEFT adapter (LoRA) into this folder, then exit", 0, 0}, \
    {"export_gguf", OPT_STR, &(tc)->export_gguf, "", "also write the trained model as GGUF for llama.cpp and ollama to this file: full fine-tuning's weights, or the base with the LoRA adapter merged in (DoRA and QLoRA too); with --resume: that checkpoint's, then exit (docs/export.md)", 0, 0}, \
    {"export_gguf_adapter", OPT_STR, &(tc)->export_gguf_adapter, "", "LoRA: also write the adapter as a llama.cpp GGUF adapter to this file (llama-cli --lora, ollama's ADAPTER; not DoRA); with --resume: that checkpoint's, then exit", 0, 0}, \
    {"gguf_type", OPT_STR, &(tc)->gguf_type, "f16", "f32 | f16 | bf16 | q8_0: the type of the GGUF files' weight matrices (the norms stay f32)", 0, 0}, \
    {"precision", OPT_STR, &(tc)->precision, backend_precisions[0], "bf16 | fp16 | fp32: how weights and activations are stored (fp16: with --loss_scale; for GPUs without bf16, V100 and T4; fp32: all of it, e.g. to compare with the CPU trainer, which runs fp32 only)", 0, 0}, \
    {"loss_scale", OPT_STR, &(tc)->loss_scale, "auto", "auto | dynamic | none: dynamic loss scaling as torch.amp.GradScaler (initial scale 65536, x2 after 2000 steps without an overflow, x0.5 and the step skipped on one); auto: dynamic with --precision fp16, else none (as torch). The CPU trainer runs it too (fp32: exact, the same steps except the skipped ones)", 0, 0}, \
    {"collectives", OPT_STR, &(tc)->collectives, backend_collectives[0], "auto | nccl | host: how the ranks' device buffers are gathered and summed (train_llama2cu): nccl, or host: through host memory over MPI or TCP, summed in rank order as the CPU trainer sums (ranks may share a GPU); auto: nccl when every rank of a node has its own GPU, else host. The CPU trainer: host only", 0, 0}, \
    {"random_init", OPT_FLAG, &(tc)->random_init, "0", "for benchmarks only: random weights N(0, initializer_range) drawn from --seed, with --model holding just config.json and tokenizer.model", 0, 1}, \
    {"quantize", OPT_STR, &(tc)->quantize, "none", "none | nf4 | fp4: QLoRA, the decoder's linear weights quantized to 4 bits as they load, exactly as bitsandbytes (blocks of 64); LoRA or IA3", 0, 0}, \
    {"double_quant", OPT_INT, &(tc)->double_quant, "1", "with --quantize: 1 stores the absmax values in 8 bits too (bitsandbytes' bnb_4bit_use_double_quant)", 0, 1}, \
}

static void print_help(const Option *opts, int n) {
    printf("usage: train_llama2 --model DIR --data FILE.jsonl [options]\n\n");
    for (int i = 0; i < n; i++)
        printf("  --%-28s %s (default: %s)\n", opts[i].name, opts[i].help, opts[i].def[0] ? opts[i].def : "none");
    printf("  --%-28s %s\n", "help", "print this and exit");
}

static int set_option(const Option *o, const char *val) {
    char *end;
    errno = 0;
    if (o->type == OPT_STR) { *(const char **)o->ptr = val; return 0; }
    if (o->type == OPT_LIST) {
        StrList *l = (StrList *)o->ptr;
        if (!*val) { l->n = 0; return 0; } // the default: empty
        if (l->n == MAX_LIST) { fprintf(stderr, "error: --%s given more than %d times\n", o->name, MAX_LIST); return -1; }
        l->v[l->n++] = val;
        return 0;
    }
    if (o->type == OPT_INT_AUTO && !strcmp(val, "auto")) { *(int *)o->ptr = 0; return 0; }
    if (o->type == OPT_INT || o->type == OPT_INT_AUTO || o->type == OPT_FLAG) {
        long v = strtol(val, &end, 10);
        if (*val == 0 || *end != 0 || errno || v < o->lo || v > o->hi) {
            fprintf(stderr, "error: --%s: '%s' is not an integer in [%g, %g]%s\n", o->name, val, o->lo, o->hi,
                    o->type == OPT_INT_AUTO ? " or auto" : "");
            return -1;
        }
        *(int *)o->ptr = (int)v;
        return 0;
    }
    double v = strtod(val, &end);
    if (*val == 0 || *end != 0 || errno || !(v >= o->lo && v <= o->hi)) {
        fprintf(stderr, "error: --%s: '%s' is not a number in [%g, %g]\n", o->name, val, o->lo, o->hi);
        return -1;
    }
    *(float *)o->ptr = (float)v;
    return 0;
}

// an option's value as text; exact: floats with every digit (for resume checks)
static void option_value(const Option *o, char *buf, size_t n, int exact) {
    switch (o->type) {
    case OPT_STR: snprintf(buf, n, "%s", *(const char **)o->ptr); break;
    case OPT_FLOAT: snprintf(buf, n, exact ? "%.9g" : "%g", *(float *)o->ptr); break;
    case OPT_LIST: snprintf(buf, n, "(%d values)", ((StrList *)o->ptr)->n); break;
    case OPT_INT_AUTO:
        if (*(int *)o->ptr) snprintf(buf, n, "%d", *(int *)o->ptr);
        else snprintf(buf, n, "auto");
        break;
    default: snprintf(buf, n, "%d", *(int *)o->ptr);
    }
}

// The index of value among the n choices of --option; -1 with a message that lists
// them. backend: choices that depend on the backend ("one this trainer runs").
static int option_choice(const char *option, const char *value, const char *const *choices, size_t n, int backend) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(value, choices[i])) return (int)i;
    fprintf(stderr, "error: --%s: '%s' is not one %s", option, value, backend ? "this trainer runs (" : "of ");
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? ", " : "", choices[i]);
    fprintf(stderr, "%s\n", backend ? ")" : "");
    return -1;
}
#define OPTION_CHOICE(option, value, choices, backend) option_choice(option, value, choices, sizeof choices / sizeof *choices, backend)

// IA3's modules from --ia3_target_modules and --ia3_feedforward_modules (empty: none) as bit
// masks. 0 ok, -1 with a message.
static int ia3_modules(const TrainConfig *tc, unsigned *targets, unsigned *feedforward) {
    *feedforward = 0;
    if (lora_parse_targets(tc->ia3_target_modules, "--ia3_target_modules", targets) != 0) return -1;
    if (tc->ia3_feedforward_modules[0] &&
        lora_parse_targets(tc->ia3_feedforward_modules, "--ia3_feedforward_modules", feedforward) != 0) return -1;
    return 0;
}

// --pure_bf16, --optimizer anyprecision and --kahan_summation, which go together as
// llama-recipes has them (its pure_bf16 also runs AdamW on bf16 weights; here the bf16
// weights take AnyPrecisionAdamW, whose state is bf16 too). 0 ok, -1 with a message.
static int check_pure_bf16(const TrainConfig *tc) {
    int any = tc->optim.kind == OPTIMIZER_ANYPRECISION;
    const char *error = NULL;
    if (tc->optim.kahan && !any) error = "--kahan_summation is AnyPrecisionAdamW's: give it with --optimizer anyprecision";
    else if (any && !tc->pure_bf16)
        error = "--optimizer anyprecision steps bf16 weights with bf16 state: give it with --pure_bf16 1 (and --full_finetune)";
    else if (tc->pure_bf16 && !tc->full_finetune)
        error = "--pure_bf16 keeps full fine-tuning's weights in bf16 with no fp32 copy: give it with --full_finetune";
    else if (tc->pure_bf16 && !any)
        error = "--pure_bf16 has no fp32 weights for AdamW, SGD or AdamW8bit to update: give it with --optimizer anyprecision";
    else if (tc->pure_bf16 && !strcmp(backend_precisions[0], "bf16") && strcmp(tc->precision, "bf16")) // (the CPU
        error = "--pure_bf16 keeps the weights in bf16 on the GPU: give it with --precision bf16 (the default)"; // twin: fp32 only)
    if (error) fprintf(stderr, "error: %s\n", error);
    return error ? -1 : 0;
}

// --peft_method and the options that go with it; lora_option: a LoRA-only option the
// command line gave (NULL: none). 0 ok, -1 with a message.
static int check_peft_method(const TrainConfig *tc, const char *lora_option) {
    static const char *const methods[] = {"lora", "ia3", "llama_adapter", "prefix"};
    if (OPTION_CHOICE("peft_method", tc->peft_method, methods, 0) < 0) return -1;
    if (!strcmp(tc->peft_method, "lora")) return 0;
    if (tc->full_finetune) {
        fprintf(stderr, "error: --peft_method %s trains an adapter; with --full_finetune there is none\n", tc->peft_method);
        return -1;
    }
    if (lora_option) {
        fprintf(stderr, "error: --%s is LoRA's; with --peft_method %s give %s\n", lora_option, tc->peft_method,
                !strcmp(tc->peft_method, "ia3") ? "--ia3_target_modules and --ia3_feedforward_modules"
                : !strcmp(tc->peft_method, "prefix") ? "--num_virtual_tokens" : "--adapter_len and --adapter_layers");
        return -1;
    }
    if (!strcmp(tc->peft_method, "prefix") && tc->s2_attn) { // S2-Attn's groups are of the sequence's positions
        fprintf(stderr, "error: --s2_attn with --peft_method prefix is not supported (shifted sparse attention's groups "
                "would cut the virtual positions off most queries)\n");
        return -1;
    }
    if (strcmp(tc->peft_method, "ia3") != 0) return 0;
    if (tc->export_gguf_adapter[0]) { fprintf(stderr, "%s\n", gguf_adapter_no_ia3); return -1; }
    unsigned targets, feedforward;
    if (ia3_modules(tc, &targets, &feedforward) != 0) return -1;
    if (feedforward & ~targets) {
        fprintf(stderr, "error: --ia3_feedforward_modules %s: must be among --ia3_target_modules %s\n", tc->ia3_feedforward_modules,
                tc->ia3_target_modules);
        return -1;
    }
    return 0;
}

// 0: parsed, 1: --help printed, -1: error (message printed)
static int parse_args(TrainConfig *tc, int argc, char **argv) {
    Option opts[] = OPTIONS(tc);
    int n = (int)(sizeof opts / sizeof opts[0]);
    const char *lora_option = NULL; // the last LoRA-only option given (IA3 refuses them)
    for (int i = 0; i < n; i++) set_option(&opts[i], opts[i].def);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) { print_help(opts, n); return 1; }
        if (strncmp(arg, "--", 2) != 0) { fprintf(stderr, "error: unexpected argument '%s' (options start with --; see --help)\n", arg); return -1; }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const Option *o = NULL;
        for (int k = 0; k < n; k++)
            if (strlen(opts[k].name) == len && strncmp(opts[k].name, name, len) == 0) o = &opts[k];
        if (!o) { fprintf(stderr, "error: unknown option '--%.*s' (see --help)\n", (int)len, name); return -1; }
        if (!strncmp(o->name, "lora_", 5) || !strcmp(o->name, "use_rslora") || !strcmp(o->name, "use_dora")) lora_option = o->name;
        const char *val;
        if (eq) val = eq + 1;
        else if (o->type == OPT_FLAG) val = "1";
        else if (i + 1 < argc) val = argv[++i];
        else { fprintf(stderr, "error: --%s needs a value\n", o->name); return -1; }
        if (set_option(o, val) != 0) return -1;
    }
    static const char *const schedulers[] = {"constant", "linear", "cosine"}, *const batchings[] = {"padding", "packing"};
    static const char *const loss_scales[] = {"auto", "dynamic", "none"}, *const chunk_memories[] = {"keep", "recompute"};
    if ((tc->optim.kind = OPTION_CHOICE("optimizer", tc->optimizer, optimizer_names, 0)) < 0 ||
        OPTION_CHOICE("lr_scheduler", tc->lr_scheduler, schedulers, 0) < 0 || OPTION_CHOICE("batching", tc->batching, batchings, 0) < 0 ||
        OPTION_CHOICE("data_format", tc->data_format, data_format_names, 0) < 0 ||
        (tc->quant_type = OPTION_CHOICE("quantize", tc->quantize, quant_type_names, 0)) < 0 ||
        OPTION_CHOICE("loss_scale", tc->loss_scale, loss_scales, 0) < 0 ||
        OPTION_CHOICE("chunk_memory", tc->chunk_memory, chunk_memories, 0) < 0 ||
        (tc->gguf_ftype = OPTION_CHOICE("gguf_type", tc->gguf_type, gguf_type_names, 0)) < 0 ||
        OPTION_CHOICE("precision", tc->precision, backend_precisions, 1) < 0 ||
        OPTION_CHOICE("collectives", tc->collectives, backend_collectives, 1) < 0 ||
        profile_parse_steps(tc->profile_steps, &tc->profile_first, &tc->profile_last) < 0)
        return -1;
    if (tc->optim.kind != OPTIMIZER_SGD && (tc->optim.momentum != 0 || tc->optim.nesterov)) {
        fprintf(stderr, "error: --momentum and --nesterov are SGD's: give them with --optimizer sgd\n");
        return -1;
    }
    if (tc->optim.nesterov && tc->optim.momentum == 0) { // torch.optim.SGD refuses it too
        fprintf(stderr, "error: --nesterov 1 needs a --momentum above 0 (Nesterov momentum without momentum is plain SGD)\n");
        return -1;
    }
    if (tc->val_data[0] && tc->val_split > 0) {
        fprintf(stderr, "error: --val_data and --val_split do not go together (one validation set)\n");
        return -1;
    }
    if (tc->chunk_size > tc->max_seq_len) {
        fprintf(stderr, "error: --chunk_size %d is larger than --max_seq_len %d (use 0 for whole sequences)\n",
                tc->chunk_size, tc->max_seq_len);
        return -1;
    }
    if (tc->s2_attn && strcmp(tc->batching, "packing")) { // padding's micro-batches take their longest row's length
        fprintf(stderr, "error: --s2_attn needs --batching packing: its 4 groups cut rows of one length, a multiple of 4 "
                "(--max_seq_len)\n");
        return -1;
    }
    if (tc->s2_attn && tc->max_seq_len % 4) {
        fprintf(stderr, "error: --s2_attn cuts rows in 4 groups: --max_seq_len %d is not a multiple of 4\n", tc->max_seq_len);
        return -1;
    }
    if (tc->context_parallel > 1 && !backend_context_parallel) {
        fprintf(stderr, "error: --context_parallel is not supported yet by this trainer (train_llama2, the CPU trainer, has it)\n");
        return -1;
    }
    // (a prefix moves the carry's rows, which the context group gathers from; pure bf16's rounding of
    // each rank's part assumes ranks hold whole rows: neither is tested with context parallelism)
    if (tc->context_parallel > 1 && (!strcmp(tc->peft_method, "prefix") || tc->pure_bf16)) {
        fprintf(stderr, "error: --context_parallel with %s is not supported yet\n", tc->pure_bf16 ? "--pure_bf16" : "--peft_method prefix");
        return -1;
    }
    // the CUDA trainer's (2): what its tests cover so far
    const char *untested = tc->s2_attn ? "--s2_attn" : tc->cpu_offload ? "--cpu_offload" : NULL;
    if (tc->context_parallel > 1 && backend_context_parallel == 2 && untested) {
        fprintf(stderr, "error: --context_parallel with %s is not supported yet by this trainer (train_llama2, the CPU "
                "trainer, has it)\n", untested);
        return -1;
    }
    int chunk = tc->chunk_size ? tc->chunk_size : tc->max_seq_len;
    if (tc->num_output_chunks > chunk) {
        fprintf(stderr, "error: --num_output_chunks %d is more than the %d tokens of a chunk\n", tc->num_output_chunks, chunk);
        return -1;
    }
    unsigned mask;
    if (lora_parse_targets(tc->lora_target_modules, "--lora_target_modules", &mask) != 0) return -1;
    if (check_peft_method(tc, lora_option) != 0) return -1;
    if (lora_parse_saved(tc->trainable_params, &mask, "--trainable_params") != 0) return -1;
    if (mask && tc->full_finetune) {
        fprintf(stderr, "error: --trainable_params names base tensors that train beside a LoRA adapter; with --full_finetune "
                "every weight trains already\n");
        return -1;
    }
    if (mask && strcmp(tc->peft_method, "lora") != 0) { // (peft allows it; the saved tensors' files and resume are LoRA's here)
        fprintf(stderr, "error: --trainable_params with --peft_method %s is not supported yet (only with lora)\n", tc->peft_method);
        return -1;
    }
    if (mask && tc->export_gguf_adapter[0]) { fprintf(stderr, "%s\n", gguf_adapter_saved_error); return -1; }
    if (mask && tc->quant_type != QUANT_NONE) {
        fprintf(stderr, "error: --trainable_params with --quantize is not supported yet (QLoRA keeps the norms in its 4-bit runs)\n");
        return -1;
    }
    FsdpStrategy strategy;
    if (fsdp_strategy_parse(tc->sharding_strategy, &strategy) != 0) return -1;
    if (tc->random_init && tc->resume[0]) {
        fprintf(stderr, "error: --random_init is for benchmarks, which start fresh: it does not go with --resume\n");
        return -1;
    }
    if (tc->export_hf[0] && !tc->resume[0]) {
        fprintf(stderr, "error: --export_hf writes a checkpoint out: give it with --resume CHECKPOINT\n");
        return -1;
    }
    if (tc->memory_limit > 0 && tc->batch_size) {
        fprintf(stderr, "error: --memory_limit is what --batch_size auto fits the batch in; give --batch_size auto with it\n");
        return -1;
    }
    if (!tc->batch_size && !tc->memory_limit && !backend_measures_free_memory) {
        fprintf(stderr, "error: --batch_size auto needs --memory_limit GiB with this trainer (it cannot tell what memory is free)\n");
        return -1;
    }
    if (!tc->model[0]) { fprintf(stderr, "error: --model is required (see --help)\n"); return -1; }
    if (!tc->data[0]) { fprintf(stderr, "error: --data is required (see --help)\n"); return -1; }
    if (tc->full_finetune && tc->use_dora) {
        fprintf(stderr, "error: --use_dora trains a DoRA adapter; with --full_finetune there is none\n");
        return -1;
    }
    if (tc->full_finetune && tc->merge_adapter) {
        fprintf(stderr, "error: --merge_adapter folds a LoRA adapter in; with --full_finetune there is none\n");
        return -1;
    }
    if (tc->cpu_offload && !tc->full_finetune) {
        fprintf(stderr, "error: --cpu_offload moves full fine-tuning's masters, gradients and optimizer state to the host: give it "
                "with --full_finetune (LoRA's are small)\n");
        return -1;
    }
    if (check_pure_bf16(tc) != 0) return -1;
    if (tc->freeze_layers && !tc->full_finetune) {
        fprintf(stderr, "error: --freeze_layers freezes layers of full fine-tuning: give it with --full_finetune (LoRA trains no base weight)\n");
        return -1;
    }
    if (tc->full_finetune && tc->from_peft_checkpoint[0]) {
        fprintf(stderr, "error: --from_peft_checkpoint and --full_finetune do not go together\n");
        return -1;
    }
    if (tc->quant_type != QUANT_NONE && tc->full_finetune) {
        fprintf(stderr, "error: --quantize keeps the base weights frozen in 4 bits (QLoRA): it does not go with --full_finetune\n");
        return -1;
    }
    if (tc->export_gguf_adapter[0] && tc->full_finetune) {
        fprintf(stderr, "error: --export_gguf_adapter writes a LoRA adapter; with --full_finetune there is none (use --export_gguf)\n");
        return -1;
    }
    if (tc->export_gguf_adapter[0] && tc->use_dora) {
        fprintf(stderr, "error: --export_gguf_adapter: DoRA cannot be expressed as a llama.cpp adapter (it has no place for "
                "DoRA's magnitudes); use --export_gguf for the model with the adapter merged in\n");
        return -1;
    }
    if (tc->quant_type != QUANT_NONE && tc->merge_adapter) {
        fprintf(stderr, "error: --merge_adapter with --quantize is not supported yet (it would fold the adapter into 4-bit weights)\n");
        return -1;
    }
    return 0;
}

// The start-up table: every option with its value, three to a line in
// columns as wide as the longest name and CONFIG_VALUE_WIDTH; a longer value
// (a path, a list) comes after them, whole, on a line of its own.
#define CONFIG_VALUE_WIDTH 14
static void print_config(TrainConfig *tc) {
    Option opts[] = OPTIONS(tc);
    int n = (int)(sizeof opts / sizeof opts[0]), name_width = 0, col = 0;
    char val[PATH_MAX + 64];
    for (int i = 0; i < n; i++) name_width = (int)fmax(name_width, strlen(opts[i].name));
    printf("configuration:\n");
    for (int pass = 0; pass < 2; pass++) { // the values that fit their column, then the longer ones
        for (int i = 0; i < n; i++) {
            option_value(&opts[i], val, sizeof val, 0);
            if (!val[0]) snprintf(val, sizeof val, "-");
            if ((strlen(val) > CONFIG_VALUE_WIDTH) != pass) continue;
            int end = pass || ++col % 3 == 0;
            printf("  %-*s %-*s%s", name_width, opts[i].name, end ? 0 : CONFIG_VALUE_WIDTH, val, end ? "\n" : "");
        }
        if (pass == 0 && col % 3) printf("\n");
    }
}

// the configuration as a Markdown table (TensorBoard's text plugin renders it) into buf
static void config_markdown(TrainConfig *tc, char *buf, size_t n) {
    Option opts[] = OPTIONS(tc);
    char val[PATH_MAX + 64];
    size_t at = (size_t)snprintf(buf, n, "| option | value |\n|---|---|\n");
    for (size_t i = 0; i < sizeof opts / sizeof opts[0] && at < n; i++) {
        option_value(&opts[i], val, sizeof val, 0);
        at += (size_t)snprintf(buf + at, n - at, "| %s | %s |\n", opts[i].name, val[0] ? val : "-");
    }
}

// ----------------------------------------------------------------------------
// setting up the model

// a checkpoint written by sharded full fine-tuning: fsdp.h's shards and index, no model.safetensors
static int checkpoint_is_sharded(const char *dir) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, FSDP_INDEX_NAME);
    return access(path, F_OK) == 0;
}

// sets up the model for training as tc says: LoRA adapters (fresh or from a PEFT folder) or full
// fine-tuning; resume_dir, when given, is a checkpoint whose trained weights replace the starting ones
// (a sharded one's in load_checkpoint, so then nothing is read from --model but config.json). The base weights are whole, or with a shard group of more than
// one rank (f) this rank's shards. model_load_host sets up the host model; model_setup then has the
// backend's model_alloc take it from there, for micro-batches of B rows. -1 (nothing left allocated) on failure.
static int model_load_host(Model *m, Fsdp *f, const TrainConfig *tc, const char *resume_dir) {
    memset(m, 0, sizeof *m);
    m->fsdp = f;
    HostModel *h = &m->host;
    int resume_sharded = resume_dir && tc->full_finetune && checkpoint_is_sharded(resume_dir);
    const char *weights = resume_dir && tc->full_finetune ? resume_dir : tc->model;
    int G = f ? f->shard.size : 1, rc;
    h->quant_type = tc->quant_type;
    h->double_quant = tc->double_quant;
    h->align_blocks = tc->optim.kind == OPTIMIZER_ADAMW8BIT && tc->full_finetune;
    // a base whole on one rank, or full fine-tuning's shards of it, which the backend reads where it
    // keeps it (the GPU's): none here (--pure_bf16 --cpu_offload: the GPU's bf16 weights, copied
    // down once into the host's bf16 parameters); but --cpu_offload's fp32 masters, which are the
    // host's, a sharded checkpoint read into a whole model, LoRA's shards, and the shards of units
    // frozen in fp32 (a sharded checkpoint's could not be read again for a save: no --pure_bf16
    // weights hold them)
    int fp32_offload = tc->cpu_offload && !tc->pure_bf16;
    h->base_deferred = backend_streams_base && tc->quant_type == QUANT_NONE &&
                       (G == 1 ? !(tc->full_finetune && (fp32_offload || resume_sharded))
                               : tc->full_finetune && !fp32_offload && !(tc->freeze_layers && !tc->pure_bf16));
    h->base_resumed = h->base_deferred && resume_sharded; // (its weights come with its optimizer state)
    h->base_dir = weights, h->base_random = tc->random_init, h->base_seed = (uint64_t)tc->seed;
    int read_now = !tc->dry_run && !h->base_deferred;
    if (tc->random_init) rc = model_init_random(h, tc->model, (uint64_t)tc->seed, G > 1 ? f->shard.rank : 0, G, read_now);
    else if (resume_sharded) rc = model_shape(h, tc->model, G, read_now); // load_checkpoint reads every weight: none from --model
    else if (!read_now) rc = model_check(h, weights, G); // the shapes alone: nothing of the model's size
    else rc = G > 1 ? model_load_shard(h, weights, f->shard.rank, G) : model_load(h, weights);
    if (rc != 0) { host_model_free(h); return -1; }
    if (tc->pure_bf16 && read_now) model_round_bf16(h);
    h->full_finetune = tc->full_finetune;
    h->use_lora = !tc->full_finetune;
    if (tc->freeze_layers > h->config.n_layers) {
        fprintf(stderr, "error: --freeze_layers %d is more than the %d decoder layers of %s (num_hidden_layers)\n", tc->freeze_layers,
                h->config.n_layers, tc->model);
        host_model_free(h);
        return -1;
    }
    if (tc->s2_attn && (h->config.sliding_window || h->config.n_heads % 2)) { // S2-Attn's mask replaces the causal one
        if (h->config.sliding_window)
            fprintf(stderr, "error: --s2_attn: %s has a sliding window of %d keys (sliding_window), which shifted sparse "
                    "attention does not combine with\n", tc->model, h->config.sliding_window);
        else
            fprintf(stderr, "error: --s2_attn splits the query heads in halves: %s has %d (num_attention_heads), an odd "
                    "number\n", tc->model, h->config.n_heads);
        host_model_free(h);
        return -1;
    }
    h->frozen_units = tc->freeze_layers ? tc->freeze_layers + 1 : 0; // the embedding's unit, then the layers'
    if (h->use_lora) {
        int in[LORA_N_TARGETS], out[LORA_N_TARGETS];
        lora_shapes(&h->config, in, out);
        const char *adapter = resume_dir ? resume_dir : tc->from_peft_checkpoint;
        unsigned saved;
        lora_parse_saved(tc->trainable_params, &saved, "--trainable_params");
        if (adapter[0]) {
            if (lora_load_peft(&h->lora, adapter, h->config.n_layers, in, out, h->config.vocab_size, h->config.tied) != 0) {
                host_model_free(h);
                return -1;
            }
            if (h->lora.saved && (host_sharded(h) || h->quant_type != QUANT_NONE)) {
                fprintf(stderr, "error: %s saves base tensors (modules_to_save), which this trainer, sharded or with "
                        "--quantize, does not train yet\n", adapter);
                host_model_free(h);
                return -1;
            }
            if (saved && saved != h->lora.saved) {
                fprintf(stderr, "error: --trainable_params %s: %s trains %s (its modules_to_save)\n", tc->trainable_params,
                        adapter, lora_saved_json(h->lora.saved));
                host_model_free(h);
                return -1;
            }
            const char *kind = lora_method(&h->lora);
            if (!resume_dir && strcmp(tc->peft_method, "lora") && strcmp(tc->peft_method, kind)) { // (a resume's options match its own)
                fprintf(stderr, "error: --peft_method %s, but --from_peft_checkpoint %s holds %s\n", tc->peft_method, adapter,
                        !strcmp(kind, "lora") ? "a LoRA adapter" : !strcmp(kind, "ia3") ? "an IA3 adapter"
                        : !strcmp(kind, "prefix") ? "a prefix" : "a llama_adapter");
                host_model_free(h);
                return -1;
            }
        } else if (!strcmp(tc->peft_method, "llama_adapter")) {
            if (tc->adapter_layers > h->config.n_layers) { // (peft refuses it too)
                fprintf(stderr, "error: --adapter_layers %d is more than the %d decoder layers of %s (num_hidden_layers)\n",
                        tc->adapter_layers, h->config.n_layers, tc->model);
                host_model_free(h);
                return -1;
            }
            adapter_alloc(&h->lora, h->config.n_layers, in, out, tc->adapter_len, tc->adapter_layers, (uint64_t)tc->seed);
        } else if (!strcmp(tc->peft_method, "prefix")) {
            prefix_alloc(&h->lora, h->config.n_layers, in, out, tc->num_virtual_tokens, (uint64_t)tc->seed);
        } else if (!strcmp(tc->peft_method, "ia3")) {
            unsigned targets, feedforward;
            ia3_modules(tc, &targets, &feedforward); // (check_peft_method checked them)
            ia3_alloc(&h->lora, h->config.n_layers, in, out, targets, feedforward);
        } else {
            unsigned targets;
            lora_parse_targets(tc->lora_target_modules, "--lora_target_modules", &targets);
            lora_alloc(&h->lora, h->config.n_layers, in, out, tc->lora_r, tc->lora_alpha, tc->lora_dropout,
                       tc->use_rslora, tc->use_dora, targets);
            lora_init(&h->lora, (uint64_t)tc->seed);
            if (saved && host_sharded(h)) {
                fprintf(stderr, "error: --trainable_params with sharded base weights is not supported yet\n");
                host_model_free(h);
                return -1;
            }
            if (saved) { // they start as the base's (a dry run has no weights; a streamed base seeds them as it streams)
                lora_add_saved(&h->lora, saved, h->config.vocab_size, h->config.dim, h->config.tied, !tc->dry_run);
                if (!tc->dry_run && h->base_deferred) h->saved_from_base = 1;
                else if (!tc->dry_run) model_saved_copy(h, 1);
            }
        }
        h->lora.kv_heads = h->config.n_kv_heads;
        if (h->lora.prefix && h->config.sliding_window) { // (its window would count the virtual positions: untested)
            fprintf(stderr, "error: a prefix on %s, a model with a sliding window (sliding_window %d), is not supported yet\n",
                    tc->model, h->config.sliding_window);
            host_model_free(h);
            return -1;
        }
        if ((h->lora.adapter_len || h->lora.prefix) && (tc->merge_adapter || tc->export_gguf[0] || tc->export_gguf_adapter[0])) {
            fprintf(stderr, "error: %s: %s no weight change, so it cannot be merged into the model or exported (drop it)\n",
                    tc->merge_adapter ? "--merge_adapter" : tc->export_gguf[0] ? "--export_gguf" : "--export_gguf_adapter",
                    h->lora.prefix ? "a prefix's keys and values are" : "a llama_adapter's prompt is");
            host_model_free(h);
            return -1;
        }
        if (h->quant_type != QUANT_NONE && h->lora.use_dora) { // DoRA's row norms read W, which QLoRA keeps packed
            fprintf(stderr, "error: --quantize with DoRA (%s) is not supported yet\n", adapter[0] ? adapter : "--use_dora");
            host_model_free(h);
            return -1;
        }
    }
    m->fp32 = !strcmp(tc->precision, "fp32");
    m->fp16 = !strcmp(tc->precision, "fp16");
    m->collectives = tc->collectives;
    m->dry_run = tc->dry_run;
    m->activation_checkpointing = tc->activation_checkpointing;
    m->cpu_offload = tc->cpu_offload;
    m->pure_bf16 = tc->pure_bf16;
    m->s2_attn = tc->s2_attn;
    m->optimizer = tc->optim;
    return 0;
}
static int model_setup(Model *m, Fsdp *f, const TrainConfig *tc, int B, int T, const char *resume_dir) {
    if (model_load_host(m, f, tc, resume_dir) != 0) return -1;
    model_alloc(m, B, T, tc->chunk_size, strcmp(tc->chunk_memory, "recompute") == 0, tc->num_output_chunks);
    return 0;
}

// ----------------------------------------------------------------------------
// sampling: one sequence, with the KV carry as the cache

static int cmp_prob_desc(const void *a, const void *b) {
    float x = ((const float *)a)[0], y = ((const float *)b)[0];
    return (x < y) - (x > y);
}

// the next token from logits z (V): argmax at temperature 0, else a draw from
// softmax(z / temperature) restricted to the smallest set of tokens whose
// probability adds up to top_p (nucleus sampling). Ties go to the lower id.
static int sample_token(float *z, int V, float temperature, float top_p, uint64_t *rng) {
    int best = 0;
    for (int i = 1; i < V; i++) if (z[i] > z[best]) best = i;
    if (temperature <= 0.0f) return best;
    float (*pi)[2] = (float (*)[2])mallocCheck((size_t)V * sizeof *pi); // (probability, id) pairs
    double sum = 0;
    for (int i = 0; i < V; i++) { pi[i][0] = expf((z[i] - z[best]) / temperature); pi[i][1] = (float)i; sum += pi[i][0]; }
    qsort(pi, V, sizeof *pi, cmp_prob_desc);
    int n = 0;
    double kept = 0;
    while (n < V && (n == 0 || kept < top_p * sum)) kept += pi[n++][0];
    double r = rng_uniform(rng) * kept, acc = 0;
    int tok = (int)pi[n - 1][1];
    for (int i = 0; i < n; i++) if ((acc += pi[i][0]) > r) { tok = (int)pi[i][1]; break; }
    free(pi);
    return tok;
}

// Continues prompt (n_prompt >= 1 ids) by up to max_new tokens, stopping after eos.
// The prompt runs in chunks of the model's chunk size, then one token at a time,
// each step attending to the KV carry of everything before it. Returns the new
// tokens (malloc'd, *n_new of them); the length is capped by the model's T.
static int *generate(Model *m, const int *prompt, int n_prompt, int max_new, float temperature, float top_p,
                     uint64_t seed, int eos, int *n_new) {
    // positions the carry / a chunk's activations hold for one sequence: a row's, or with context
    // parallelism, whose carries hold B T / P positions a layer (every rank samples alike), at
    // most those
    int P = fsdp_context_size(m->fsdp), T = P > 1 && m->B < P ? m->B * m->T / P : m->T, cap = m->B * m->chunk_size;
    if (n_prompt > T - 1) n_prompt = T - 1;   // keep the end of a long prompt's room for one token
    if (max_new > T - n_prompt) max_new = T - n_prompt;
    int *seq = (int *)callocCheck(T, sizeof(int)), *out = (int *)mallocCheck((max_new + 1) * sizeof(int));
    memcpy(seq, prompt, n_prompt * sizeof(int));
    int training = m->host.lora.training;
    m->host.lora.training = 0; // no dropout
    uint64_t rng = seed;
    Chunk ch = {1, T, 0, 0, m->host.config.sliding_window, 0}; // full attention: --s2_attn is training's
    float *logits = NULL; // (V) of the last position run so far
    for (ch.t0 = 0; ch.t0 < n_prompt; ch.t0 += ch.len) {
        ch.len = n_prompt - ch.t0 < cap ? n_prompt - ch.t0 : cap;
        logits = model_next_logits(m, seq, &ch);
    }
    *n_new = 0;
    for (int pos = n_prompt; *n_new < max_new; pos++) {
        int tok = sample_token(logits, m->host.config.vocab_size, temperature, top_p, &rng);
        out[(*n_new)++] = tok;
        if (tok == eos || pos + 1 >= T) break;
        seq[pos] = tok;
        ch.t0 = pos; ch.len = 1;
        logits = model_next_logits(m, seq, &ch);
    }
    m->host.lora.training = training;
    free(seq);
    return out;
}

// ----------------------------------------------------------------------------
// evaluation (LoRA dropout off)

// mean cross-entropy over every label token of a dataset, in file order
static double evaluate(Model *m, const Dataset *ds, int B, int pad_id) {
    int *tokens = (int *)mallocCheck((size_t)B * m->T * sizeof(int)), *targets = (int *)mallocCheck((size_t)B * m->T * sizeof(int));
    double loss = 0;
    long count = 0;
    m->host.lora.training = 0;
    for (long r = 0; r < ds->n_rows; r += B) {
        int rows = ds->n_rows - r < B ? (int)(ds->n_rows - r) : B, T;
        count += dataset_get_rows(ds, r, rows, pad_id, tokens, targets, &T);
        loss += model_forward(m, tokens, targets, rows, T, NULL);
    }
    m->host.lora.training = 1;
    free(tokens); free(targets);
    return count ? loss / count : 0.0;
}

static void report_eval(Model *m, const Dataset *ds, int B, int pad_id, int step, FILE *metrics, TbWriter *tb) {
    double vl = evaluate(m, ds, B, pad_id);
    printf("step %d | val loss %.6f | val ppl %.4f\n", step, vl, exp(vl));
    if (metrics) {
        fprintf(metrics, "{\"step\": %d, \"val_loss\": %.9g, \"val_ppl\": %.9g}\n", step, vl, exp(vl));
        fflush(metrics);
    }
    const char *tag = "eval/loss";
    float v = (float)vl;
    if (tb->f && tb_scalars(tb, step, &tag, &v, 1) != 0) fprintf(stderr, "warning: cannot write %s: %s\n", tb->path, strerror(errno));
}

// ----------------------------------------------------------------------------
// checkpoints and exact resume (checkpoint.h makes each checkpoint folder atomic)
//
// A checkpoint holds everything the rest of the run depends on: the trainable
// weights (a PEFT adapter, or the whole model for full fine-tuning, in F32),
// the optimizer's state (AdamW's moments, SGD's momentum buffer) and step
// count, the optimizer step and the data position.
// Dropout masks and the shuffle order are functions of --seed, the step and
// the epoch, so no RNG state needs saving: a resumed run is bit-identical.

static volatile sig_atomic_t stop_requested = 0;
static void on_stop_signal(int sig) { (void)sig; stop_requested = 1; }

// Fault injection for the tests: LLAMA2TUNE_FAULT=<point>:<step> (or
// <point>:<first>-<last>, a range of steps) is on at <point> for those steps.
// At "step" and "checkpoint" the process is killed (SIGKILL, no cleanup); at
// "nan" and "huge" train_step scales the step's gradients by NaN or by 1e30.
static int fault_at(const char *point, int step) {
    const char *f = getenv("LLAMA2TUNE_FAULT");
    size_t n = strlen(point);
    if (!f || strncmp(f, point, n) != 0 || f[n] != ':') return 0;
    char *end;
    long first = strtol(f + n + 1, &end, 10), last = *end == '-' ? strtol(end + 1, NULL, 10) : first;
    return step >= first && step <= last;
}
static void fault_point(const char *point, int step) { if (fault_at(point, step)) raise(SIGKILL); }

// the options that shape the training trajectory: a resumed run must use the same
// (--max_steps and --num_epochs may change, to train longer; the schedule then
// spans the new length, so such a run differs from one planned that long)
// (and the global batch, the rows of an optimizer step over every rank: how they split
// into ranks, micro-batches and rows may change, e.g. the world size with --global_batch_size)
static const char *resume_must_match[] = {
    "model", "data", "max_seq_len", "lr", "optimizer", "momentum", "nesterov", "kahan_summation", "pure_bf16",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "lr_scheduler", "warmup_steps", "grad_clip", "seed",
    "shuffle", "full_finetune", "freeze_layers", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_rslora",
    "use_dora", "peft_method", "ia3_target_modules", "ia3_feedforward_modules", "adapter_len", "adapter_layers", "num_virtual_tokens",
    "from_peft_checkpoint", "data_format",
    "train_on_prompt", "batching", "max_samples", "data_slice", "val_split",
    "quantize", "double_quant", "s2_attn", "trainable_params"};

// a file's identity for resume: the one the token cache keys on (dataloader.h's
// data_identity: size, modification time and a hash of its first and last MiB)
static void file_fingerprint(const char *path, char *out, size_t n) {
    CacheHeader h;
    memset(&h, 0, sizeof h);
    if (data_identity(path, &h) != 0) { snprintf(out, n, "unreadable"); return; }
    snprintf(out, n, "%llu:%lld:%016llx", (unsigned long long)h.data_size, (long long)h.data_mtime_ns,
             (unsigned long long)h.data_hash);
}

// opt_t < step when steps were skipped (non-finite loss or gradient); bad_in_row counts the latest run of
// those that count as bad (train_run); the loss scale is part of the state (a resumed run goes on with it)
typedef struct { int step, opt_t, data_epoch, data_pos, bad_in_row; LossScale ls; } TrainState;

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

// state tensor i of an optimizer, to be saved through optimizer_state_get (StFillFn)
typedef struct { Optimizer *o; int i; const HostModel *h; } StateRef;
static int state_fill(void *ctx, size_t first, size_t count, void *dst) {
    const StateRef *r = (const StateRef *)ctx;
    return optimizer_state_get(r->o, r->i, first, count, dst);
}
// ... and loaded through optimizer_state_set, a piece at a time (FsdpPutFn: a sharded resume)
static void state_put(void *ctx, size_t first, size_t count, const void *src) {
    const StateRef *r = (const StateRef *)ctx;
    optimizer_state_set(r->o, r->i, first, count, src);
}
// AdamW8bit's state tensor i in a sharded checkpoint: a part of each unit (FsdpPartFn)
static size_t state_part(void *ctx, int unit, size_t x) {
    const StateRef *r = (const StateRef *)ctx;
    return model_state_part(&r->h->units.units[unit], r->i % ADAMW8BIT_PARTS, x);
}

// the optimizer's state tensors with their names, each saved through its fill (refs: where
// they point); returns how many (of the units that train: a sharded checkpoint holds none
// for frozen ones). AdamW8bit's are parts of the units (its codes, absmax, fp32 moments).
static int optimizer_state(Optimizer *o, const Model *m, FsdpBuffer states[OPTIMIZER_MAX_STATES], StateRef refs[OPTIMIZER_MAX_STATES]) {
    int n = optimizer_n_states(&m->optimizer), a8 = m->optimizer.kind == OPTIMIZER_ADAMW8BIT;
    for (int i = 0; i < n; i++) {
        StDtype d;
        optimizer_state_count(&m->optimizer, &m->opt_tensors, o->n, i, &d);
        refs[i] = (StateRef){o, i, &m->host};
        states[i] = (FsdpBuffer){optimizer_state_names[m->optimizer.kind][i], NULL, m->host.frozen_units, state_fill, &refs[i], d,
                                 a8 ? state_part : NULL, &refs[i], state_put};
    }
    return n;
}

// the buffers of a sharded checkpoint (fsdp.h): this rank's shards of the weights and the optimizer state
static int sharded_buffers(Model *m, Optimizer *o, FsdpBuffer bufs[1 + OPTIMIZER_MAX_STATES], StateRef refs[OPTIMIZER_MAX_STATES],
                           char fingerprint[17]) {
    const HostModel *h = &m->host; // (the shards on the host, or where the backend keeps them)
    bufs[0] = (FsdpBuffer){"params", h->shards, 0, h->shards ? NULL : h->shards_get, h->weights_ctx, ST_F32, NULL, NULL,
                           h->shards ? NULL : h->shards_put};
    fsdp_fingerprint(&m->host.units, "", fingerprint);
    return 1 + optimizer_state(o, m, bufs + 1, refs);
}

// Every file's digest, each rank digesting its share (file i on rank i % W), so a
// sharded checkpoint's shards are read once and in parallel; every rank ends up
// with all n of them (*digests, freed by the caller). Collective; 0 ok, -1 on
// every rank when one failed (with its message).
static int digest_files(Fsdp *fs, const char *dir, CheckpointName *names, int n, CheckpointDigest **digests) {
    FsdpComm *w = &fs->world;
    int W = w->size, k = (n + W - 1) / W, lo, hi; // k: files per rank
    fsdp_int_range(w, n, &lo, &hi);
    if (lo != hi) { // every rank lists the folder its shards went into: it must be the same one
        if (w->rank == 0) fprintf(stderr, "error: the ranks see different files in '%s': --output_dir must be on a filesystem every rank shares\n", dir);
        return -1;
    }
    CheckpointDigest *all = (CheckpointDigest *)callocCheck((size_t)n + 1, sizeof *all);
    CheckpointDigest *mine = (CheckpointDigest *)callocCheck((size_t)k + 1, sizeof *mine), *got = (CheckpointDigest *)callocCheck((size_t)W * k + 1, sizeof *got);
    int rc = checkpoint_digest_part(dir, names, all, n, w->rank, W);
    for (int j = 0; w->rank + j * W < n; j++) memcpy(mine[j], all[w->rank + j * W], sizeof *mine);
    if (!fsdp_any(w, rc != 0)) {
        fsdp_all_gather_bytes(w, got, mine, (size_t)k * sizeof *mine);
        for (int i = 0; i < n; i++) memcpy(all[i], got[(size_t)(i % W) * k + i / W], sizeof *all);
    } else rc = -1;
    free(mine);
    free(got);
    *digests = all;
    return rc;
}

// trainer_state.json: the position, the digests of the checkpoint's files, and the
// options, data and world size it belongs to. Collective (the digests); rank 0 writes.
static int save_trainer_state(TrainConfig *tc, const TrainState *ts, Fsdp *fs, const char *dir) {
    CheckpointName *names = (CheckpointName *)mallocCheck(CHECKPOINT_MAX_FILES * sizeof *names);
    CheckpointDigest *digests = NULL;
    int n = 0, rc = checkpoint_files(dir, names, &n);
    rc = fsdp_any(&fs->world, rc != 0) ? -1 : digest_files(fs, dir, names, n, &digests);
    if (rc != 0 || fs->world.rank != 0) {
        free(names);
        free(digests);
        return rc;
    }
    char *js, val[4096], fp[128], path[PATH_MAX + 64];
    size_t len;
    FILE *f = open_memstream(&js, &len);
    if (!f) die("out of memory");
    file_fingerprint(tc->data, fp, sizeof fp);
    fprintf(f, "{\n  \"step\": %d,\n  \"optimizer_step\": %d,\n  \"data_epoch\": %d,\n  \"data_position\": %d,\n"
            "  \"bad_steps_in_row\": %d,\n  \"data_fingerprint\": \"%s\",\n  \"world_size\": %d,\n", ts->step,
            ts->opt_t, ts->data_epoch, ts->data_pos, ts->bad_in_row, fp, fsdp_data_size(fs));
    if (ts->ls.on) // a power of two: %.9g is exact
        fprintf(f, "  \"loss_scale\": %.9g,\n  \"loss_scale_growth_tracker\": %d,\n", ts->ls.scale, ts->ls.growth_tracker);
    fprintf(f, "  \"files\": ");
    checkpoint_write_digests(f, names, digests, n); // what a resume checks before reading them
    free(names);
    free(digests);
    fprintf(f, ",\n  \"options\": {");
    Option opts[] = OPTIONS(tc);
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        option_value(&opts[i], val, sizeof val, 1);
        fprintf(f, "%s\n    \"%s\": ", i ? "," : "", opts[i].name);
        json_write_string(f, val);
    }
    fprintf(f, "\n  }\n}\n");
    if (fclose(f) != 0) die("out of memory writing trainer_state.json");
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    if (rc == 0) rc = write_bytes_atomic(path, js, len);
    free(js);
    return rc;
}

// Collective: rank 0 makes the .tmp folder, the trainable state goes in (each
// rank its shards in sharded full fine-tuning; else rank 0 writes the adapter
// or the model, and the moments), rank 0 commits. The ranks agree after each
// part, so a failure on any rank is a failure on every rank.
static int save_checkpoint(TrainConfig *tc, Fsdp *fs, Model *m, Optimizer *o, const TrainState *ts, const char *tokpath) {
    char dir[PATH_MAX], path[PATH_MAX + 64];
    model_sync_host(m);
    // finite losses and gradients can still overflow the update (AdamW's g^2 above FLT_MAX without --grad_clip): never save that
    const HostModel *h = &m->host;
    const float *w = h->use_lora ? h->lora.params : host_sharded(h) ? h->shards : h->params;
    size_t nw = h->use_lora ? h->lora.num_params : host_sharded(h) ? h->units.shard_numel : h->num_params;
    FsdpBuffer states[OPTIMIZER_MAX_STATES];
    StateRef refs[OPTIMIZER_MAX_STATES];
    int finite = h->weights_finite && !h->use_lora ? h->weights_finite(h->weights_ctx) : all_finite(w, nw);
    int n_states = optimizer_state(o, m, states, refs), bad = !finite || !optimizer_state_finite(o);
    if (fsdp_any(&fs->world, bad)) {
        if (fs->world.rank == 0)
            fprintf(stderr, "error: not saving checkpoint %d: the trainable weights or the optimizer state hold NaN or inf (an update "
                    "overflowed: a gradient above 1e19; keep --grad_clip on, lower --lr); the checkpoints before it are intact\n", ts->step);
        return -1;
    }
    int rank0 = fs->world.rank == 0, rc = rank0 ? checkpoint_begin(tc->output_dir, ts->step, dir, sizeof dir) : 0;
    if (fsdp_any(&fs->world, rc != 0)) return -1;
    snprintf(dir, sizeof dir, "%s/checkpoint-%d.tmp", tc->output_dir, ts->step);
    if (host_sharded(&m->host) && !m->host.use_lora) {
        FsdpBuffer bufs[1 + OPTIMIZER_MAX_STATES];
        char fp[17];
        rc = fsdp_save(fs, dir, &m->host.units, bufs, sharded_buffers(m, o, bufs, refs, fp), fp);
    } else if (rank0) { // optimizer.safetensors: the state tensors under their names (none for plain SGD)
        rc = m->host.use_lora ? lora_save_peft(&m->host.lora, dir, tc->model) : model_save_hf(&m->host, dir, tc->model, tokpath);
        StWriteTensor t[OPTIMIZER_MAX_STATES];
        for (int i = 0; i < n_states; i++) {
            StDtype d;
            size_t count = optimizer_state_count(&m->optimizer, &m->opt_tensors, o->n, i, &d);
            t[i] = (StWriteTensor){states[i].name, d, 1, {(int64_t)count}, NULL, state_fill, &refs[i]};
        }
        snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
        if (rc == 0) rc = st_write(path, t, n_states, NULL, 0);
    }
    fault_point("checkpoint", ts->step); // the tests kill the run here, halfway through a checkpoint
    rc = fsdp_any(&fs->world, rc != 0) ? -1 : save_trainer_state(tc, ts, fs, dir); // every rank: the digests
    if (fsdp_any(&fs->world, rc != 0)) {
        if (rank0) {
            fprintf(stderr, "error: writing checkpoint step %d failed; the previous checkpoints are intact\n", ts->step);
            remove_tree(dir);
        }
        return -1;
    }
    rc = rank0 ? checkpoint_commit(tc->output_dir, ts->step, tc->keep_checkpoints) : 0;
    return fsdp_any(&fs->world, rc != 0) ? -1 : 0;
}

// Where tensor j of unit u keeps its share of state buffer b in a whole model's state (w:
// the whole model's trainable tensors, AdamW8bit's): [*in_unit, *in_unit + count) of the
// unit's elements (or of its part: AdamW8bit's) lie at *at of the whole state tensor
// (model_tensor_offset_from's layout, or the part's); returns count.
static size_t state_whole_at(const HostModel *h, const OptimTensors *w, const FsdpBuffer *b, int u, int j, size_t *in_unit, size_t *at) {
    const FsdpTensor *t = &h->units.units[u].tensors[j];
    size_t off = model_tensor_offset_from(&h->config, h->frozen_units, u, j);
    if (!b->part) { *in_unit = t->offset, *at = off; return t->numel; }
    *in_unit = b->part(b->part_ctx, u, t->offset);
    int k = 0;
    while (k + 1 < w->n && w->first[k] != off) k++; // (w holds every trainable tensor)
    *at = ((const StateRef *)b->part_ctx)->i % ADAMW8BIT_PARTS == ADAMW8BIT_ABSMAX ? w->at[k] / ADAMW8BIT_BLOCK : w->at[k];
    return b->part(b->part_ctx, u, t->offset + t->numel) - *in_unit;
}

// A sharded checkpoint's weights and optimizer state into a whole model (one
// process, or NO_SHARD): each buffer read as one shard, in the units' order, then
// put into the whole model's layout (the state tensor by tensor through
// optimizer_state_set); it costs one more copy of the model meanwhile.
static int load_sharded_whole(const char *dir, Model *m, Optimizer *o) {
    const HostModel *h = &m->host;
    FsdpUnits one;
    model_units(&h->config, &one, 1);
    FsdpBuffer bufs[1 + OPTIMIZER_MAX_STATES];
    StateRef refs[OPTIMIZER_MAX_STATES];
    char fp[17];
    int nb = sharded_buffers(m, o, bufs, refs, fp), rc = 0;
    char *buf = (char *)mallocCheck(one.shard_numel * sizeof(float)); // (every buffer's whole is at most that)
    for (int b = 0; b < nb && rc == 0; b++) {
        FsdpBuffer one_buf = bufs[b];
        one_buf.data = buf, one_buf.fill = NULL, one_buf.put = NULL;
        rc = fsdp_load(dir, &one, &one_buf, 1, 0, fp);
        for (int i = one_buf.first; i < one.n_units && rc == 0; i++) {
            const char *unit = (const char *)fsdp__buffer_unit(&one, &one_buf, i, 0);
            if (b == 0) { model_put_unit(h, 0, i, (const float *)unit, m->host.params); continue; } // (sharded_buffers named the shards)
            for (int j = 0; j < one.units[i].n_tensors; j++) {
                size_t in_unit, at, n = state_whole_at(h, &m->opt_tensors, &bufs[b], i, j, &in_unit, &at);
                if (n) optimizer_state_set(o, b - 1, at, n, unit + in_unit * (size_t)st_dtype_size(one_buf.dtype));
            }
        }
    }
    free(buf);
    fsdp_units_free(&one);
    return rc;
}

// a flat state tensor of an unsharded full fine-tuning checkpoint (model_tensor_offset_from's
// layout of the units from `from` on: they have state, the frozen ones none), read by unit
typedef struct { StFile *sf; const StTensor *t; const Config *c; int from; } StateFile;
static int read_state(void *ctx, int unit, int tensor, size_t first, size_t count, float *dst) {
    const StateFile *sf = (const StateFile *)ctx;
    if (unit < sf->from) return 0; // frozen: fsdp_read_shard left it zero
    return st_read_f32(sf->sf, sf->t, model_tensor_offset_from(sf->c, sf->from, unit, tensor) + first, count, dst);
}

// this rank's pieces of AdamW8bit's state tensor b (a part of each unit) out of a whole
// checkpoint's tensor t (sf) into dst, the rank's layout of it: each piece of a tensor in
// the rank's shard read from where the whole state keeps it. 0 ok, -1 with a message.
static int read_state_part(StFile *sf, const StTensor *t, const Model *m, const OptimTensors *whole, const FsdpBuffer *b, char *dst) {
    const HostModel *h = &m->host;
    const FsdpUnits *u = &h->units;
    int rank = m->fsdp->shard.rank, rc = 0;
    size_t es = (size_t)st_dtype_size(b->dtype);
    for (int i = b->first; i < u->n_units && rc == 0; i++) {
        const FsdpUnit *un = &u->units[i];
        size_t begin, count = fsdp_shard_range(un->numel, u->n_shards, u->align, rank, &begin);
        size_t mine = b->part(b->part_ctx, i, begin); // the rank's piece of the unit's part starts there
        char *piece = dst + fsdp__unit_start(u, b, i, rank) * es;
        for (int j = 0; j < un->n_tensors && rc == 0; j++) {
            const FsdpTensor *tt = &un->tensors[j];
            size_t lo, n = range_overlap(begin, count, tt->offset, tt->numel, &lo);
            size_t p0 = b->part(b->part_ctx, i, lo), p1 = b->part(b->part_ctx, i, lo + n), in_unit, at;
            if (p0 == p1) continue; // (none of the tensor here, or none of it in this part)
            state_whole_at(h, whole, b, i, j, &in_unit, &at);
            rc = st_read_stored(sf, t, b->dtype, at + (p0 - in_unit), p1 - p0, piece + (p0 - mine) * es);
        }
    }
    return rc;
}

// The checkpoint's optimizer state (and a sharded checkpoint's weights) into o
// (and m): a sharded checkpoint at any shard count (fsdp.h), or
// optimizer.safetensors of a whole one (into a sharded model: this rank's
// shard of it). 0 ok, -1 with a message.
static int load_trainable(const char *dir, Model *m, Optimizer *o) {
    if (checkpoint_is_sharded(dir)) {
        if (m->host.use_lora) { fprintf(stderr, "error: --resume %s: a full fine-tuning checkpoint, and this run trains LoRA\n", dir); return -1; }
        if (!host_sharded(&m->host)) return load_sharded_whole(dir, m, o);
        FsdpBuffer bufs[1 + OPTIMIZER_MAX_STATES];
        StateRef refs[OPTIMIZER_MAX_STATES];
        char fp[17];
        // the weights into the host's shards or through the backend's shards_put, the state through
        // optimizer_state_set, a block of the file at a time
        int nb = sharded_buffers(m, o, bufs, refs, fp);
        return fsdp_load(dir, &m->host.units, bufs, nb, m->fsdp->shard.rank, fp);
    }
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    StFile sf;
    if (st_open(&sf, path) != 0) return -1;
    FsdpBuffer states[OPTIMIZER_MAX_STATES];
    StateRef refs[OPTIMIZER_MAX_STATES];
    HostModel *h = &m->host;
    int n_states = optimizer_state(o, m, states, refs), shard = host_sharded(h) && !h->use_lora, rc = 0;
    // whole: a staging buffer at a time; sharded: this rank's shard of every unit
    size_t staging = st_staging_bytes();
    void *buf = mallocCheck(shard ? h->units.shard_numel * sizeof(float) : optimizer_staging_bytes(&m->optimizer, &m->opt_tensors, o->n) + 1);
    OptimTensors whole; // (AdamW8bit's) the checkpoint's: every trainable tensor whole
    memset(&whole, 0, sizeof whole);
    model_optim_tensors(h, &m->optimizer, -1, &whole);
    for (int i = 0; i < n_states && rc == 0; i++) {
        const StTensor *t = st_find(&sf, states[i].name);
        StDtype d;
        // an unsharded checkpoint holds the state of every weight that trains
        size_t n = optimizer_state_count(&m->optimizer, &whole, shard ? model_numel_from(&h->config, h->frozen_units) : o->n, i, &d);
        size_t piece = staging / (size_t)st_dtype_size(d);
        if (!t || t->numel != n || t->dtype != d) {
            fprintf(stderr, "error: %s: expected a %s tensor %s of %zu elements\n", path, st_dtype_name(d), states[i].name, n);
            rc = -1;
        } else if (!shard) {
            for (size_t first = 0; first < n && rc == 0; first += piece) {
                size_t k = n - first < piece ? n - first : piece;
                rc = st_read_stored(&sf, t, d, first, k, buf);
                if (rc == 0) optimizer_state_set(o, i, first, k, buf);
            }
        } else if (states[i].part) { // AdamW8bit's: this rank's pieces of it
            if ((rc = read_state_part(&sf, t, m, &whole, &states[i], (char *)buf)) == 0)
                optimizer_state_set(o, i, 0, optimizer_state_count(&m->optimizer, &m->opt_tensors, o->n, i, &d), buf);
        } else { // this rank's shard of it, tensor by tensor out of the trainable units' layout (the frozen
                 // units' shards, which have no state, read as zeros and dropped)
            StateFile ctx = {&sf, t, &h->config, h->frozen_units};
            rc = fsdp_read_shard(&h->units, m->fsdp->shard.rank, (float *)buf, read_state, &ctx);
            float *mine = (float *)buf + h->units.units[h->frozen_units].shard_offset;
            if (d == ST_BF16) // (read as floats, exactly: back to bf16 in place, each element over one already read)
                for (size_t j = 0; j < o->n; j++) ((uint16_t *)mine)[j] = bf16_from_f32(mine[j]);
            if (rc == 0) optimizer_state_set(o, i, 0, o->n, mine);
        }
    }
    free(buf);
    optim_tensors_free(&whole);
    if (rc == 0 && sf.n_tensors != n_states) { // what it holds and what this run expects differ: not this optimizer's
        fprintf(stderr, "error: %s: %d tensors, and --optimizer %s keeps %d\n", path, sf.n_tensors, optimizer_names[m->optimizer.kind], n_states);
        rc = -1;
    }
    st_close(&sf);
    return rc;
}

// The loss scale a checkpoint's state st (from path) saved into *ls, when ls->on
// (a checkpoint without one, written with no scaler: the initial scale). 0 ok, -1 with a message.
static int load_loss_scale(const JsonValue *st, const char *path, LossScale *ls) {
    double scale;
    long long tracker;
    if (!ls->on || !json_get(st, "loss_scale")) return 0;
    if (json_get_number(st, "loss_scale", &scale) != 0 || !(scale > 0) || !isfinite((float)scale) ||
        json_get_int(st, "loss_scale_growth_tracker", &tracker) != 0 || tracker < 0 || tracker >= LOSS_SCALE_GROWTH_INTERVAL) {
        fprintf(stderr, "error: %s: 'loss_scale' is not a positive finite number or 'loss_scale_growth_tracker' not an "
                "integer in [0, %d)\n", path, LOSS_SCALE_GROWTH_INTERVAL);
        return -1;
    }
    ls->scale = (float)scale;
    ls->growth_tracker = (int)tracker;
    return 0;
}

// Reads a checkpoint's state, moments (and sharded weights), after checking
// that it belongs to this run (same trajectory-shaping options, same global
// batch, same data file).
static int load_checkpoint(TrainConfig *tc, const char *dir, int world, Model *m, Optimizer *o, TrainState *ts) {
    char path[PATH_MAX + 64], val[4096], def[64], fp[128];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    JsonValue st;
    if (json_load_file(path, &st) != 0) return -1;
    int rc = -1;
    long long v[5], saved_world = 1, saved_batch, saved_ga;
    const char *keys[5] = {"step", "optimizer_step", "data_epoch", "data_position", "bad_steps_in_row"}, *saved;
    const JsonValue *opts_saved = json_get(&st, "options");
    Option opts[] = OPTIONS(tc);
    for (int i = 0; i < 5; i++)
        if (json_get_int(&st, keys[i], &v[i]) != 0 || v[i] < 0 || v[i] > INT32_MAX) {
            fprintf(stderr, "error: %s: '%s' missing or not a non-negative integer\n", path, keys[i]); goto done;
        }
    if (!opts_saved || opts_saved->type != JSON_OBJECT) { fprintf(stderr, "error: %s: no \"options\" object\n", path); goto done; }
    for (size_t k = 0; k < sizeof resume_must_match / sizeof resume_must_match[0]; k++)
        for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
            if (strcmp(opts[i].name, resume_must_match[k])) continue;
            option_value(&opts[i], val, sizeof val, 1);
            // an option newer than the checkpoint is absent from it: the run had its default
            if (json_get_string(opts_saved, opts[i].name, &saved, NULL) != 0) {
                if (opts[i].type == OPT_FLOAT) snprintf(def, sizeof def, "%.9g", (float)strtod(opts[i].def, NULL));
                else snprintf(def, sizeof def, "%s", opts[i].def);
                saved = def;
            }
            if (strcmp(saved, val) != 0) {
                fprintf(stderr, "error: --resume %s: --%s was '%s' in the checkpoint but is '%s' now; resume with the same value\n",
                        dir, opts[i].name, saved, val);
                goto done;
            }
        }
    if (json_get(&st, "world_size") && (json_get_int(&st, "world_size", &saved_world) != 0 || saved_world < 1)) {
        fprintf(stderr, "error: %s: 'world_size' is not a positive integer\n", path); goto done;
    }
    if (json_get_string(opts_saved, "batch_size", &saved, NULL) != 0 || (saved_batch = atoll(saved)) < 1 ||
        json_get_string(opts_saved, "gradient_accumulation_steps", &saved, NULL) != 0 || (saved_ga = atoll(saved)) < 1) {
        fprintf(stderr, "error: %s: no --batch_size or --gradient_accumulation_steps in \"options\"\n", path); goto done;
    }
    if (saved_world * saved_ga * saved_batch != (long long)world * tc->grad_accum * tc->batch_size) {
        fprintf(stderr, "error: --resume %s: the global batch was %lld rows in the checkpoint (%lld rank(s) x %lld micro-batches "
                "x %lld rows) and is %lld now (%d x %d x %d); resume with the same rows per optimizer step (--global_batch_size "
                "%lld)\n", dir, saved_world * saved_ga * saved_batch, saved_world, saved_ga, saved_batch,
                (long long)world * tc->grad_accum * tc->batch_size, world, tc->grad_accum, tc->batch_size,
                saved_world * saved_ga * saved_batch);
        goto done;
    }
    file_fingerprint(tc->data, fp, sizeof fp);
    if (json_get_string(&st, "data_fingerprint", &saved, NULL) != 0 || strcmp(saved, fp) != 0) {
        fprintf(stderr, "error: --resume %s: the data file '%s' has changed since the checkpoint (size, time or contents)\n", dir, tc->data);
        goto done;
    }
    // (a dry run's plan needs none of the trained values, and has no room for them)
    if (load_loss_scale(&st, path, &ts->ls) != 0 || (!tc->dry_run && load_trainable(dir, m, o) != 0)) goto done;
    ts->step = (int)v[0]; ts->opt_t = (int)v[1]; ts->data_epoch = (int)v[2]; ts->data_pos = (int)v[3]; ts->bad_in_row = (int)v[4];
    o->t = ts->opt_t;
    rc = 0;
done:
    json_free(&st);
    return rc;
}

// ----------------------------------------------------------------------------
// FLOPs and the memory plan

// Model FLOPs of one sequence of T tokens, forward and backward (docs/performance.md):
// a matmul with W (O, I) costs 2 O I per token forward; the backward costs the
// same again for dX, and again for dW when W trains. So full fine-tuning is
// 6 N T and LoRA 4 N T (plus its small adapters), N = the matmul parameters
// (the head included, the embedding lookup not). Causal attention adds
// 2 L NH hd T^2 forward (QK^T and PV over half the T x T scores) and twice
// that backward; with a sliding window of W < T keys only the scores inside
// it count, T^2 / 2 - (T - W)^2 / 2 of them; with --s2_attn (s2) those of the
// groups, G^2 / 2 a group of G = T / 4: 4 of them in the first half of the heads,
// 3 and two of G / 2 in the second, 15/64 of T^2 / 2 over all. Recomputed forwards
// (--chunk_memory recompute, --activation_checkpointing) are not counted.
static double flops_per_sequence(const HostModel *m, int T, int s2) {
    const Config *c = &m->config;
    double D = c->dim, H = c->hidden_dim, Q = (double)c->n_heads * c->head_dim, KV = (double)c->n_kv_heads * c->head_dim;
    double per_layer = D * Q * 2 + D * KV * 2 + 3 * D * H, N = c->n_layers * per_layer + (double)c->vocab_size * D;
    double lora = 0;
    if (m->use_lora) {
        int in[LORA_N_TARGETS], out[LORA_N_TARGETS];
        lora_shapes(c, in, out);
        for (int t = 0; t < LORA_N_TARGETS; t++)
            if (m->lora.targets & (1u << t)) lora += c->n_layers * (double)m->lora.r * (in[t] + out[t]);
    }
    double outside = c->sliding_window && c->sliding_window < T ? (double)(T - c->sliding_window) : 0;
    double attn = 2.0 * c->n_layers * Q * ((double)T * T - outside * outside) * (s2 ? 15.0 / 64 : 1.0);
    return (m->full_finetune ? 6 * N : 4 * N + 6 * lora) * T + 3 * attn;
}

// What training holds, known before it starts: printed as the memory plan
// (and alone with --dry_run). Per process; this trainer runs one rank, which holds
// step_rows rows of a step's batch at once (its micro-batches x rows: train_begin).
// Returns the backend memory's total (the GPU's, or the CPU's resident memory);
// *host (when not NULL) the host memory's: the same on the CPU, and beside a GPU the
// host model as loaded, LoRA's weights, the checkpoint staging buffer and the data.
static double memory_plan(const Model *m, const Dataset *train, const Dataset *val, long step_rows, int print, double *host) {
    const double MiB = 1048576.0;
    double weights = m->weight_bytes, trainable = m->param_bytes, data = step_rows * (double)m->T * 2 * sizeof(int);
    for (int i = 0; i < 2; i++) {
        const Dataset *d = i ? val : train;
        if (d && d->store) data += d->n_tokens * 5.0 + d->n_rows * 8.0; // tokens and label flags (mapped cache)
    }
#ifdef BACKEND_HOST_PLAN
    double part[HOST_PLAN_PARTS], total = weights + trainable + m->act_bytes + m->carry_bytes, host_total = data;
    for (int i = 0; i < HOST_PLAN_PARTS; i++) host_total += part[i] = model_host_bytes(m, i);
#else // the plan is host memory
    double total = weights + trainable + m->act_bytes + m->carry_bytes + data, host_total = total;
#endif
    if (host) *host = host_total;
    if (print) {
        printf("memory plan (%s of this process):\n", backend_memory);
        const char *stored = m->pure_bf16 ? (m->fp32 ? "weights (bf16 values in fp32)" : "weights (bf16, no fp32 copy)")
                             : m->fp32 ? "base weights (fp32)" : m->fp16 ? "base weights (fp16)" : "base weights (bf16)";
        printf("  %-34s %10.1f MiB\n", stored, weights / MiB);
        if (m->host.quant_type != QUANT_NONE) {
            printf("    %-32s %10.1f MiB   (%s%s, blocks of %d%s)\n", "of which 4-bit layers", model_run_bytes_held(&m->host) / MiB,
                   quant_type_names[m->host.quant_type], m->host.double_quant ? ", double quantization" : "", QUANT_BLOCK,
                   m->host.units.n_shards > 1 ? "; this rank's shards" : "");
            printf("    %-32s %10.1f MiB   (one layer, %s)\n", "of which dequantize scratch", model_dequant_scratch_bytes(m) / MiB,
                   m->fp32 ? "fp32" : m->fp16 ? "fp16" : "bf16");
        }
        char what[64];
        snprintf(what, sizeof what, "trainable weights, grads%s%s", optimizer_n_states(&m->optimizer) ? ", " : "",
                 optimizer_n_states(&m->optimizer) ? optimizer_state_what[m->optimizer.kind] : "");
        printf("  %-34s %10.1f MiB\n", what, trainable / MiB);
        printf("  %-34s %10.1f MiB   (%s of %d, %s%s)\n", "activations and scratch", m->act_bytes / MiB,
               m->fsdp && m->fsdp->context.size > 1 ? "context-parallel pieces" : "chunks", m->chunk_size, m->recompute ? "recompute" : "keep", m->activation_checkpointing ? ", activation checkpointing" : "");
        printf("  %-34s %10.1f MiB\n", "KV and dKV carry", m->carry_bytes / MiB);
#ifdef BACKEND_HOST_PLAN
        printf("  %-34s %10.1f MiB\n", "total", total / MiB);
        printf("host memory plan (of this process; ranks on one machine share it):\n");
        for (int i = 0; i < HOST_PLAN_PARTS; i++) printf("  %-34s %10.1f MiB\n", host_plan_names[i], part[i] / MiB);
#endif
        printf("  %-34s %10.1f MiB\n", "tokenized data and the batch", data / MiB);
        printf("  %-34s %10.1f MiB\n", "total", host_total / MiB);
    }
    return total;
}

// ----------------------------------------------------------------------------
// the batch: rows per micro-batch (--batch_size, or auto) and micro-batches per
// optimizer step (--gradient_accumulation_steps, or from --global_batch_size)

// --gradient_accumulation_steps from --global_batch_size G: G / (B x W), refused
// when that does not divide or disagrees with one given; with neither given, 1.
// Then G is the rows of a step either way (what a resume must keep). The same on
// every rank: 0 ok, -1 (rank 0 says why).
static int batch_derive(TrainConfig *tc, int W, int rank0) {
    long rows = (long)tc->batch_size * W, G = tc->global_batch_size; // rows: one global micro-batch
    if (!G) {
        if (!tc->grad_accum) tc->grad_accum = 1;
        G = rows * tc->grad_accum;
        if (G > INT_MAX) {
            if (rank0) fprintf(stderr, "error: %d rank(s) x %d micro-batches x %d rows is more rows per step than this trainer counts\n",
                               W, tc->grad_accum, tc->batch_size);
            return -1;
        }
        tc->global_batch_size = (int)G;
        return 0;
    }
    if (G % rows) {
        if (rank0) fprintf(stderr, "error: --global_batch_size %ld is not a multiple of --batch_size %d x %d rank(s) = %ld rows\n",
                           G, tc->batch_size, W, rows);
        return -1;
    }
    if (tc->grad_accum && tc->grad_accum != G / rows) {
        if (rank0) fprintf(stderr, "error: --global_batch_size %ld with --batch_size %d on %d rank(s) means --gradient_accumulation_steps "
                           "%ld, not %d (give one of the two)\n", G, tc->batch_size, W, G / rows, tc->grad_accum);
        return -1;
    }
    tc->grad_accum = (int)(G / rows);
    return 0;
}

// --batch_size auto: the most rows per micro-batch (up to BATCH_SIZE_MAX) whose memory
// plan (memory_plan with the backend's model_plan) fits model_memory_budget on every rank;
// with --global_batch_size, the most of those whose global micro-batch (B x W rows)
// divides it, gradient accumulation making up the rest. Sets tc->batch_size. The plan
// grows with B, so a bisection finds it. Collective: 0 ok, -1 on every rank (a failing
// rank says why).
static int batch_auto(TrainConfig *tc, Model *m, Fsdp *f, const Dataset *train, const Dataset *val, int T) {
    const double MiB = 1048576.0;
    int W = fsdp_data_size(f), recompute = !strcmp(tc->chunk_memory, "recompute"), lo = 0, hi = BATCH_SIZE_MAX; // lo fits (0: none)
    double budget = model_memory_budget(m, tc->memory_limit * 1073741824.0), need[2];
    long G = tc->global_batch_size, GA = tc->grad_accum ? tc->grad_accum : 1;
    #define STEP_ROWS(B) (G ? G / W : GA * (B)) // a rank's rows of a step
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        model_plan(m, mid, T, tc->chunk_size, recompute, tc->num_output_chunks);
        if (memory_plan(m, train, val, STEP_ROWS(mid), 0, NULL) <= budget) lo = mid;
        else hi = mid - 1;
    }
    if (G % W) lo = 0; // no B x W rows divide it (batch_derive would say so, later)
    while (lo > 0 && G && G % ((long)lo * W)) lo--;
    for (int i = 0; i < 2; i++) { // what the chosen batch and one more row need (for the message)
        model_plan(m, lo + i > 0 ? lo + i : 1, T, tc->chunk_size, recompute, tc->num_output_chunks);
        need[i] = memory_plan(m, train, val, STEP_ROWS(lo + i > 0 ? lo + i : 1), 0, NULL);
    }
    #undef STEP_ROWS
    if (!lo && G % W) fprintf(stderr, "error: --global_batch_size %ld is not a multiple of the %d ranks\n", G, W);
    else if (!lo)
        fprintf(stderr, "error: --batch_size auto: even one row per micro-batch needs a memory plan of %.1f MiB, more than the "
                "%.1f MiB %s for it%s (less memory: --chunk_size with --chunk_memory recompute, --activation_checkpointing, "
                "--max_seq_len, sharding over more ranks)\n", need[0] / MiB, fmax(budget, 0) / MiB,
                tc->memory_limit > 0 ? "--memory_limit leaves" : "free", f->world.size > 1 ? " on this rank" : "");
    float mine = (float)lo, *all = (float *)mallocCheck((size_t)f->world.size * sizeof(float)); // exact: lo <= 2^16
    fsdp_all_gather(&f->world, all, &mine, 1);
    int B = BATCH_SIZE_MAX;
    for (int i = 0; i < f->world.size; i++) B = all[i] < B ? (int)all[i] : B;
    free(all);
    if (B == 0) return -1;
    tc->batch_size = B;
    if (f->world.rank == 0)
        printf("--batch_size auto: %d rows per micro-batch%s: a memory plan of %.1f MiB of the %.1f MiB %s (%d rows: %.1f MiB)\n",
               B, f->world.size > 1 ? " (the least of every rank's)" : "", need[0] / MiB, budget / MiB,
               tc->memory_limit > 0 ? "--memory_limit leaves for it" : "free", lo + 1, need[1] / MiB);
    return 0;
}

// ----------------------------------------------------------------------------
// the training loop

// on resume the metrics file keeps only its records up to the checkpoint's step
// (a killed run may have logged steps after its last checkpoint)
static int metrics_truncate(const char *path, int step) {
    size_t len, kept = 0;
    char *text = read_file(path, &len);
    if (!text) return errno == ENOENT ? 0 : -1;
    for (size_t pos = 0; pos < len;) {
        char *nl = (char *)memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) + 1 : len;
        JsonValue rec;
        long long s;
        char err[8];
        if (json_parse(text + pos, end - pos, &rec, err, sizeof err) == 0) {
            if (json_get_int(&rec, "step", &s) == 0 && s <= step) {
                memmove(text + kept, text + pos, end - pos);
                kept += end - pos;
            }
            json_free(&rec);
        }
        pos = end;
    }
    int rc = write_bytes_atomic(path, text, kept);
    free(text);
    return rc;
}

// writes s with its control bytes escaped (\n, \t, \xHH), so that a sample stays one
// line and a model's output can never move the cursor or recolour the user's terminal
static void fputs_escaped(const char *s, FILE *f) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '\n') fputs("\\n", f);
        else if (*c == '\t') fputs("\\t", f);
        else if (*c == '\\') fputs("\\\\", f);
        else if (*c < 0x20 || *c == 0x7f) fprintf(f, "\\x%02x", *c);
        else fputc(*c, f);
    }
}

static void print_samples(Model *m, const TrainConfig *tc, const Tokenizer *tok, int step) {
    for (int i = 0; i < tc->sample_prompt.n; i++) {
        const char *p = tc->sample_prompt.v[i];
        int n, k;
        int *ids = tokenizer_encode(tok, p, strlen(p), 1, 0, &n);
        if (!ids) die("--sample_prompt: cannot tokenize '%s'", p);
        int *gen = generate(m, ids, n, tc->max_new_tokens, tc->temperature, tc->top_p, (uint64_t)tc->seed + i, tok->eos_id, &k);
        if (k > 0 && gen[k - 1] == tok->eos_id) k--;
        char *text = tokenizer_decode(tok, gen, k, NULL);
        printf("sample at step %d | ", step);
        fputs_escaped(p, stdout);
        fputc('|', stdout);
        fputs_escaped(text ? text : "", stdout);
        fputc('\n', stdout);
        free(text); free(gen); free(ids);
    }
    fflush(stdout);
}

// a value for the metrics file: JSON has no NaN or infinity, so those are null
static const char *metrics_num(char *buf, size_t n, double v) {
    if (isfinite(v)) snprintf(buf, n, "%.9g", v);
    else snprintf(buf, n, "null");
    return buf;
}
static int metrics_error(const char *path) {
    fprintf(stderr, "error: --metrics_file '%s': writing failed: %s (the checkpoints are intact)\n", path, strerror(errno));
    return 1;
}

// everything a run loads and allocates: train() frees it on one path, however
// far train_run got
typedef struct {
    Fsdp fsdp;              // the ranks (a world of one without a launcher) and the strategy
    char tokpath[4096];     // the tokenizer file (--tokenizer, else the model's)
    int pad_id;             // what pads a row: EOS, or 0 for a tokenizer without one (never a label, never attended)
    char resume_dir[PATH_MAX]; // the checkpoint --resume names, resolved
    Tokenizer tok;
    Dataset all_ds, train_ds, val_ds; // all_ds: the file when --val_split cuts it in two
    Model m;
    Optimizer opt;
    DataLoader dl;
    FILE *metrics;
    TbWriter tb;            // --tensorboard_dir's event file (rank 0)
    int *tokens, *targets;  // (GA, B, T) a step's micro-batches (this rank's rows)
    int *Ts;                // (GA) their lengths
} Trainer;

// Collective: 1 if a phase failed on any rank (a failing rank has said why), so
// that every rank leaves together and none waits in a collective for one gone.
static int failed_anywhere(Trainer *r, int failed) {
    int any = fsdp_any(&r->fsdp.world, failed);
    if (any && !failed && r->fsdp.world.rank == 0) fprintf(stderr, "error: stopping every rank: another rank failed (its message is above)\n");
    return any;
}

// One optimizer step: GA micro-batches of every rank's rows, the loss normalised
// by the label count of the whole global step (and multiplied by the loss scale
// ls), clipping, the optimizer. Returns the mean loss over every rank; *n_tokens
// counts every rank's tokens. A NaN or infinite loss or gradient norm (the same on
// every rank) skips the update (*skipped = 1): the weights, the optimizer state and
// t stay as they were; the data moves on. Then the loss scale is updated.
static double train_step(Trainer *r, const TrainConfig *tc, int step, int total, LossScale *ls, long *n_tokens, double *norm,
                         float *lr, int *skipped) {
    Model *m = &r->m;
    int B = tc->batch_size, GA = tc->grad_accum, T = m->T;
    long labels = 0;
    double sums[2] = {0, 0}; // loss, tokens: this rank's, then every rank's
    PROF_BEGIN(NULL, "data", -1, -1, -1);
    for (int g = 0; g < GA; g++) { // the whole step's batches first: the loss is normalised by their label count
        dataloader_next_batch(&r->dl, B, r->pad_id, r->tokens + (size_t)g * B * T, r->targets + (size_t)g * B * T, &r->Ts[g]);
        labels += dataloader_global_labels(&r->dl);
        if (r->fsdp.context.rank == 0) sums[1] += r->dl.batch_tokens; // (a context-parallel group shares its rows)
    }
    PROF_END(NULL);
    optimizer_zero_grad(&r->opt);
    *lr = lr_at(tc->lr_scheduler, tc->lr, step, tc->warmup_steps, total);
#ifdef BACKEND_STEP_IN_BACKWARD
    optimizer_begin_step(&r->opt, step + 1, *lr, GA, ls->on);
#endif
    float scale = labels ? ls->scale / (float)labels : 0.0f; // (exact: ls->scale is a power of two)
    // the tests' injected faults (1-based steps, as printed): NaN gradients, or finite ones whose squares overflow
    if (fault_at("nan", step + 1)) scale = NAN;
    if (fault_at("huge", step + 1)) scale *= 1e30f;
    for (int g = 0; g < GA; g++) {
        m->dropout_key = splitmix64(((uint64_t)tc->seed << 32) ^ ((uint64_t)step * GA + g));
        PROF_BEGIN(NULL, "forward-backward", -1, -1, -1); // a micro-batch
        sums[0] += model_forward_backward(m, r->tokens + (size_t)g * B * T, r->targets + (size_t)g * B * T, B, r->Ts[g], scale);
        PROF_END(NULL);
    }
    PROF_BEGIN(NULL, "all-reduce loss", -1, -1, sizeof sums);
    fsdp_all_reduce(&r->fsdp.world, sums, 2, FSDP_F64);
    PROF_END(NULL);
    *n_tokens = (long)sums[1];
    double loss = labels ? sums[0] / labels : 0.0;
    PROF_BEGIN(NULL, "optimizer", -1, -1, -1);
    *norm = optimizer_step(&r->opt, *lr, 1.0f / ls->scale, isfinite(loss));
    PROF_END(NULL);
    *skipped = !isfinite(loss) || !isfinite(*norm);
    loss_scale_update(ls, !isfinite(*norm)); // the norm (a sum in double) is finite exactly when every gradient is
    return loss;
}

// a validation set: --val_data, or --val_split cutting one off the training data
static int has_validation(const TrainConfig *tc) { return tc->val_data[0] || tc->val_split > 0; }

// The tokenizer and the data into r, and *T, the longest row (or sample) there
// is room for. Local to this rank. 0 ok, -1 with a message.
static int load_data(const TrainConfig *tc, Trainer *r, const char *tokpath, int *T) {
    Tokenizer *tok = &r->tok;
    char tokdir[4096];
    snprintf(tokdir, sizeof tokdir, "%s", tokpath);
    char *slash = strrchr(tokdir, '/');
    if (slash) *slash = 0;
    else snprintf(tokdir, sizeof tokdir, ".");
    if (tokenizer_load(tok, tokpath) != 0 || tokenizer_configure(tok, tc->tokenizer[0] ? NULL : tc->model, tokdir) != 0) return -1;
    r->pad_id = tok->eos_id >= 0 ? tok->eos_id : 0;
    Dataset *train_ds = &r->train_ds, *val_ds = &r->val_ds;
    DataOptions dopt = {tc->data_format, tc->train_on_prompt, !strcmp(tc->batching, "packing"), tc->max_seq_len,
                        tc->max_samples, tc->data_slice, tc->data_cache_dir, 0};
    if (dataset_load(&r->all_ds, tc->data, tok, tokpath, &dopt) != 0) return -1;
    if (tc->val_split > 0) {
        if (dataset_split(&r->all_ds, tc->val_split, (uint64_t)tc->seed, train_ds, val_ds) != 0) return -1;
    } else {
        *train_ds = r->all_ds; // no split: the training set is the whole file
        memset(&r->all_ds, 0, sizeof r->all_ds);
        DataOptions vopt = dopt; // a separate validation file takes all its samples
        vopt.max_samples = 0; vopt.slice = "";
        if (tc->val_data[0] && dataset_load(val_ds, tc->val_data, tok, tokpath, &vopt) != 0) return -1;
    }
    *T = dataset_max_len(train_ds);
    if (tc->s2_attn && *T % 4) { // packing's rows are --max_seq_len long, but for a lone shorter one
        fprintf(stderr, "error: --s2_attn cuts rows in 4 groups: %s packs into one row of %d tokens, not a multiple of 4\n",
                tc->data, *T);
        return -1;
    }
    if (has_validation(tc) && dataset_max_len(val_ds) > *T) *T = dataset_max_len(val_ds);
    int sample_len = 0; // room for the samples' prompts and continuations
    for (int i = 0; i < tc->sample_prompt.n; i++) {
        int n = (int)strlen(tc->sample_prompt.v[i]) + 1 + tc->max_new_tokens; // a token has at least one byte
        sample_len = n > sample_len ? n : sample_len;
    }
    if (sample_len > *T) *T = sample_len < tc->max_seq_len ? sample_len : tc->max_seq_len;
    return 0;
}

// The final save of shards the backend keeps (sharded full fine-tuning's, streamed): rank 0 writes
// the files a piece at a time through weights_get (shard_gather_get), and every rank of its shard
// group sends its part of each piece: rank 0 broadcasts what it asks for (unit, tensor, first,
// count; unit -1: done), then each rank whose shard holds some of the piece reads that part from
// its backend (shards_get) and broadcasts it, in rank order. Collective over the first shard group
// (the other replicas hold the same shards), in the order rank 0's writers ask: no rank holds the
// model, rank 0 a piece of it and the others their part of one.
typedef struct { Fsdp *f; const HostModel *h; void *shards_ctx; } ShardGather;
static void shard_gather_piece(const ShardGather *g, int u, int j, size_t first, size_t count, float *dst) {
    const FsdpUnits *us = &g->h->units;
    const FsdpUnit *un = &us->units[u];
    size_t x = un->tensors[j].offset + first; // dst[0]'s element of the unit
    for (int r = 0; r < g->f->shard.size; r++) {
        size_t begin, held = fsdp_shard_range(un->numel, us->n_shards, us->align, r, &begin), lo;
        size_t n = range_overlap(x, count, begin, held, &lo);
        if (!n) continue;
        if (r == g->f->shard.rank && g->h->shards_get(g->shards_ctx, un->shard_offset + (lo - begin), n, dst + (lo - x)) != 0)
            fsdp_abort(&g->f->world, "reading rank %d's shard of %s back for the final save failed", r, un->name);
        fsdp_broadcast(&g->f->shard, dst + (lo - x), n * sizeof(float), r);
    }
}
static int shard_gather_get(void *ctx, int u, int j, size_t first, size_t count, float *dst) {
    const ShardGather *g = (const ShardGather *)ctx;
    long long ask[4] = {u, j, (long long)first, (long long)count};
    fsdp_broadcast(&g->f->shard, ask, sizeof ask, 0);
    shard_gather_piece(g, u, j, first, count, dst);
    return 0;
}
// the other ranks of the first shard group: each piece rank 0 asks for, until it is done
static void shard_gather_serve(const ShardGather *g) {
    float *piece = NULL;
    size_t room = 0;
    for (;;) {
        long long ask[4];
        fsdp_broadcast(&g->f->shard, ask, sizeof ask, 0);
        if (ask[0] < 0) break;
        if ((size_t)ask[3] > room) free(piece), piece = (float *)mallocCheck((room = (size_t)ask[3]) * sizeof(float));
        shard_gather_piece(g, (int)ask[0], (int)ask[1], (size_t)ask[2], (size_t)ask[3], piece);
    }
    free(piece);
}

// rank 0's part of save_outputs: the files
static int write_outputs(const TrainConfig *tc, HostModel *h, int merge, const char *dir, const char *tokpath) {
    if (dir && !h->use_lora) {
        if (model_save_hf(h, dir, tc->model, tokpath) != 0) return 1;
        printf("saved the model to %s/\n", dir);
    }
    if (dir && h->use_lora) {
        if (lora_save_peft(&h->lora, dir, tc->model) != 0) return 1;
        printf("saved the PEFT adapter to %s/\n", dir);
    }
    if (tc->export_gguf_adapter[0]) {
        if (export_gguf_adapter(h, tc->export_gguf_adapter, tc->gguf_ftype) != 0) return 1;
        printf("saved the adapter as a llama.cpp GGUF adapter (%s) to %s\n", tc->gguf_type, tc->export_gguf_adapter);
    }
    // a base the GPU holds alone is read again for the merge (a copy in host memory until the end)
    if (merge && h->base_deferred && model_load_base(h, "loading the base weights to merge the adapter into") != 0) return 1;
    float *saved = merge ? model_merge_adapter(h, !h->base_deferred) : NULL;
    int rc = 0;
    if (dir && h->use_lora && tc->merge_adapter) {
        char merged[PATH_MAX + 16];
        snprintf(merged, sizeof merged, "%s/merged", dir);
        rc = model_save_hf(h, merged, tc->model, tokpath) != 0;
        if (!rc) printf("saved the model with the adapter merged in to %s/\n", merged);
    }
    if (!rc && tc->export_gguf[0]) {
        rc = export_gguf_model(h, tc->export_gguf, tc->model, tokpath, tc->gguf_ftype) != 0;
        if (!rc) printf("saved the model%s as GGUF (%s) to %s\n", h->use_lora ? " with the adapter merged in" : "", tc->gguf_type, tc->export_gguf);
    }
    if (merge) model_unmerge_adapter(h, saved);
    if (merge && h->base_deferred) free(h->params), h->params = NULL;
    return rc;
}

// The trained model into dir (NULL: none): the PEFT adapter (and with --merge_adapter the
// merged model in dir/merged), or the Hugging Face model of full fine-tuning; then the GGUF
// files of --export_gguf (the model, with a LoRA adapter merged in) and --export_gguf_adapter.
// Collective when the base weights are sharded: shards the backend keeps stream to rank 0 a
// piece at a time as it writes them (shard_gather_get); shards in host memory (LoRA's base to
// merge into, units frozen in fp32) are gathered whole into rank 0 (as PyTorch's full state
// dict on rank 0). The files are rank 0's. Returns the exit code.
static int save_outputs(const TrainConfig *tc, Trainer *r, const char *dir, const char *tokpath) {
    Model *m = &r->m;
    model_sync_host(m);
    HostModel *h = &m->host;
    int rank0 = r->fsdp.world.rank == 0;
    int merge = h->use_lora && ((dir && tc->merge_adapter) || tc->export_gguf[0]); // the base with the adapter folded in
    if (host_sharded(h) && !h->use_lora && !h->shards) {
        ShardGather g = {&r->fsdp, h, h->weights_ctx};
        if (r->fsdp.replica.rank != 0) return 0;
        if (!rank0) { shard_gather_serve(&g); return 0; }
        h->weights_get = shard_gather_get, h->weights_ctx = &g;
        int rc = write_outputs(tc, h, merge, dir, tokpath);
        long long done[4] = {-1, 0, 0, 0};
        fsdp_broadcast(&r->fsdp.shard, done, sizeof done, 0);
        h->weights_get = NULL, h->weights_ctx = g.shards_ctx;
        return rc;
    }
    if (host_sharded(h) && (!h->use_lora || merge)) { // every unit gathered in turn, rank 0 keeps it
        if (rank0) {
            h->params = (float *)mallocCheck(h->num_params * sizeof(float));
            param_layout(&h->config, &h->w, h->params);
        }
        size_t biggest = 0;
        for (int i = 0; i < h->units.n_units; i++) biggest = h->units.units[i].shard > biggest ? h->units.units[i].shard : biggest;
        float *unit = (float *)mallocCheck(biggest * r->fsdp.shard.size * sizeof(float));
        for (int i = 0; i < h->units.n_units; i++) {
            fsdp_gather(&r->fsdp, &h->units.units[i], h->shards, unit);
            if (rank0) model_put_unit(h, 0, i, unit, h->params);
        }
        free(unit);
    }
    return rank0 ? write_outputs(tc, h, merge, dir, tokpath) : 0;
}

// the host memory available now (/proc/meminfo's MemAvailable: free, and what the kernel can
// reclaim without swapping), in bytes; 0 when it cannot tell
static double host_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib * 1024.0;
}

// what the host memory plan may take: --host_memory_limit, or what the machine had
// available when the run started (0: unknown, no limit)
static double host_limit(const TrainConfig *tc, double available) {
    return tc->host_memory_limit > 0 ? tc->host_memory_limit * 1073741824.0 : available;
}
static int host_plan_fits(const TrainConfig *tc, double plan, double available) {
    double limit = host_limit(tc, available);
    return limit <= 0 || plan <= limit;
}
// A run whose host memory plan does not fit is refused (a dry run: said). 0 ok, -1.
static int check_host_plan(const TrainConfig *tc, double plan, double available) {
    const double GiB = 1073741824.0, limit = host_limit(tc, available);
    if (host_plan_fits(tc, plan, available)) return 0;
    fflush(stdout); // (after the plan)
    fprintf(stderr, "%s: the host memory plan (%.1f GiB) exceeds the %.1f GiB %s (less: %s--quantize nf4, sharding over "
                "more machines%s)\n", tc->dry_run ? "note" : "error", plan / GiB, limit / GiB,
                tc->host_memory_limit > 0 ? "of --host_memory_limit" : "this machine had available at start (--host_memory_limit sets it)",
                tc->full_finetune ? "LoRA rather than --full_finetune, " : "", model_host_advice);
    return tc->dry_run ? 0 : -1;
}

// Before the weights load: the model set up as a dry run's (shapes, no weights), planned at
// the run's batch (auto: one row) and checked, so that a model too big for the host is
// refused in seconds, with its plan, not after minutes of loading or by the kernel's
// out-of-memory killer. 0 ok, -1.
static int check_host_plan_first(TrainConfig *tc, Trainer *r, int T, double available) {
    TrainConfig dry = *tc;
    dry.dry_run = 1;
    int B = tc->batch_size ? tc->batch_size : 1, GA = tc->grad_accum ? tc->grad_accum : 1;
    Model *m = &r->m;
    const Dataset *val = has_validation(tc) ? &r->val_ds : NULL;
    if (model_load_host(m, &r->fsdp, &dry, tc->resume[0] ? r->resume_dir : NULL) != 0) return -1;
    model_plan(m, B, T, tc->chunk_size, strcmp(tc->chunk_memory, "recompute") == 0, tc->num_output_chunks);
    double host;
    memory_plan(m, &r->train_ds, val, (long)GA * B, 0, &host);
    if (!host_plan_fits(tc, host, available)) memory_plan(m, &r->train_ds, val, (long)GA * B, 1, NULL);
    model_free(m);
    return check_host_plan(tc, host, available);
}

// Everything the run needs, on every rank: the output folder, the checkpoint to resume
// from (each rank verifies its share of its files), the tokenizer and the data (*T: the
// longest row), the host memory plan checked against what is available (bytes), the
// model and its optimizer. Collective: 0 ok, 1 when a rank failed.
static int train_load(TrainConfig *tc, Trainer *r, int *T, double available) {
    Fsdp *f = &r->fsdp;
    int W = f->world.size;
    int failed = mkdir_p(tc->output_dir) != 0;
    if (failed) fprintf(stderr, "error: cannot create --output_dir '%s': %s\n", tc->output_dir, strerror(errno));
    failed = failed || (tc->resume[0] && checkpoint_resolve(tc->resume, r->resume_dir, sizeof r->resume_dir) != 0);
    failed = failed || (tc->resume[0] && checkpoint_verify(r->resume_dir, f->world.rank, W) != 0); // each rank its share of the files
    if (tc->tokenizer[0]) snprintf(r->tokpath, sizeof r->tokpath, "%s", tc->tokenizer);
    else { // the folder's tokenizer.model (Llama-2 and the like), else its tokenizer.json (Llama-3)
        snprintf(r->tokpath, sizeof r->tokpath, "%s/tokenizer.model", tc->model);
        if (access(r->tokpath, F_OK) != 0) snprintf(r->tokpath, sizeof r->tokpath, "%s/tokenizer.json", tc->model);
        if (access(r->tokpath, F_OK) != 0) snprintf(r->tokpath, sizeof r->tokpath, "%s/tokenizer.model", tc->model); // named in the error
    }
    if (!failed && tc->export_gguf[0]) failed = gguf_check_tokenizer(r->tokpath) != 0; // before training, not after
    if (!failed && tc->export_gguf[0] && tc->quant_type != QUANT_NONE && W > 1) {
        fprintf(stderr, "error: --export_gguf with --quantize over %d ranks is not supported yet (the 4-bit layers are not "
                "gathered): export the saved checkpoint from one process with --resume CHECKPOINT --export_gguf FILE\n", W);
        failed = 1;
    }
    if (failed_anywhere(r, failed || load_data(tc, r, r->tokpath, T) != 0)) return 1;
    if (!tc->dry_run && failed_anywhere(r, check_host_plan_first(tc, r, *T, available) != 0)) return 1;
    Model *m = &r->m;
    failed = model_load_host(m, f, tc, tc->resume[0] ? r->resume_dir : NULL) != 0;
    const Config *c = &m->host.config;
    if (!failed && r->tok.vocab_size > c->vocab_size) {
        fprintf(stderr, "error: %s has %d pieces but the model's vocab_size is %d\n", r->tokpath, r->tok.vocab_size, c->vocab_size);
        failed = 1;
    }
    if (failed_anywhere(r, failed)) return 1;
    if (!tc->batch_size && (batch_auto(tc, m, f, &r->train_ds, has_validation(tc) ? &r->val_ds : NULL, *T) != 0 ||
                            batch_derive(tc, fsdp_data_size(f), f->world.rank == 0) != 0)) return 1;
    model_alloc(m, tc->batch_size, *T, tc->chunk_size, strcmp(tc->chunk_memory, "recompute") == 0, tc->num_output_chunks);
    print_config(tc);
    if (W > 1)
        printf("%d ranks, %s: shard groups of %d, %d replica(s)%s", W, f->info->name, f->shard.size, f->replica.size,
               f->context.size > 1 ? "" : "\n");
    if (f->context.size > 1)
        printf("; context parallel: %d data-parallel groups of %d ranks, each holding pieces of the same rows\n", fsdp_data_size(f),
               f->context.size);
    m->row0 = fsdp_data_rank(f) * tc->batch_size; // (the ranks of a context-parallel group share their rows)
    optimizer_init(&r->opt, m);
    return 0;
}

// --resume: the weights, the optimizer and where training stood (*ts) from the
// checkpoint. Collective: 0 ok, 1 when a rank failed.
static int train_resume(TrainConfig *tc, Trainer *r, TrainState *ts) {
    int failed = load_checkpoint(tc, r->resume_dir, fsdp_data_size(&r->fsdp), &r->m, &r->opt, ts) != 0;
    if (!failed && ts->data_pos > r->train_ds.n_rows) {
        fprintf(stderr, "error: --resume %s: data position %d is past the %ld rows\n", r->resume_dir, ts->data_pos, r->train_ds.n_rows);
        failed = 1;
    }
    if (failed_anywhere(r, failed)) return 1;
    if (!tc->dry_run) optimizer_sync_device(&r->opt); // (a dry run's model has no device side)
    return 0;
}

// what the run will do: the model, the steps and their rows, and the memory plan;
// returns the host memory it plans
static double print_plan(const TrainConfig *tc, Trainer *r, int T, int total) {
    const Model *m = &r->m;
    const Config *c = &m->host.config;
    printf("model %s: %d layers, dim %d, %d heads (%d kv) of %d, vocab %d, RoPE %s theta %g, %.2fM parameters", tc->model,
           c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, rope_type_names[c->rope_type],
           c->rope_theta, m->host.num_params / 1e6);
    if (c->sliding_window) printf(", a sliding window of %d keys", c->sliding_window);
    printf("\n");
    if (m->s2_attn) printf("attention in training: shifted sparse (--s2_attn), rows of %d cut in 4 groups of %d; full in evaluation\n", T, T / 4);
    char frozen[96];
    snprintf(frozen, sizeof frozen, "all weights but the embedding%s and the first %d layer(s)", c->tied ? " (the head too: tied)" : "",
             m->host.frozen_units - 1);
    static const char *saved[4] = {"", " with the embedding", " with the norms", " with the embedding and the norms"};
    printf("training %s%s: %zu trainable parameters%s, %ld rows, %d steps of %d x %d x %d rows (micro-batches x ranks x rows), T <= %d\n",
           !m->host.use_lora ? (m->host.frozen_units ? frozen : "all weights") : m->host.lora.adapter_len ? "llama_adapter" : m->host.lora.prefix ? "a prefix" : m->host.lora.ia3 ? "IA3" : m->host.lora.use_dora ? "DoRA" : "LoRA",
           saved[m->host.lora.saved & 3], r->opt.n,
           host_sharded(&m->host) && !m->host.use_lora ? " (this rank's shard)" : "",
           r->train_ds.n_rows, total, tc->grad_accum, fsdp_data_size(&r->fsdp), tc->batch_size, T);
    double host;
    memory_plan(m, &r->train_ds, has_validation(tc) ? &r->val_ds : NULL, (long)tc->grad_accum * tc->batch_size, 1, &host);
    return host;
}

// --tensorboard_dir: a new event file (a resumed run's too: TensorBoard reads every file of the
// folder, and a step written again replaces the earlier one's points) with the configuration
static int tensorboard_begin(TrainConfig *tc, TbWriter *tb, int step) {
    static char text[16384];
    config_markdown(tc, text, sizeof text);
    if (mkdir_p(tc->tensorboard_dir) == 0 && tb_open(tb, tc->tensorboard_dir) == 0 && tb_text(tb, step, "config", text) == 0) return 0;
    fprintf(stderr, "error: --tensorboard_dir '%s': cannot write %s: %s\n", tc->tensorboard_dir, tb->f ? tb->path : "an event file",
            strerror(errno));
    return -1;
}

// What the steps need: the metrics file (rank 0; on resume cut back to the
// checkpoint's step), the data loader at the resumed position, the buffers of a
// step's micro-batches, and the signals that stop the run after a step.
// Collective: 0 ok, 1 when a rank failed.
static int train_begin(TrainConfig *tc, Trainer *r, const TrainState *ts) {
    int rank0 = r->fsdp.world.rank == 0, B = tc->batch_size, GA = tc->grad_accum;
    int failed = rank0 && tc->metrics_file[0] && tc->resume[0] && metrics_truncate(tc->metrics_file, ts->step) != 0;
    if (failed) fprintf(stderr, "error: cannot rewrite --metrics_file '%s': %s\n", tc->metrics_file, strerror(errno));
    if (failed_anywhere(r, failed)) return 1;
    if (rank0 && tc->metrics_file[0]) r->metrics = fopenCheck(tc->metrics_file, tc->resume[0] ? "a" : "w");
    if (failed_anywhere(r, rank0 && tc->tensorboard_dir[0] && tensorboard_begin(tc, &r->tb, ts->step) != 0)) return 1;
    failed = profile_init(tc->profile_dir[0] ? tc->profile_dir : NULL, tc->profile_first, tc->profile_last, r->fsdp.world.rank,
                          r->fsdp.world.size) != 0;
    if (failed) fprintf(stderr, "error: --profile_dir '%s': cannot write there: %s\n", tc->profile_dir, strerror(errno));
    if (failed_anywhere(r, failed)) return 1;
    dataloader_init(&r->dl, &r->train_ds, tc->shuffle, (uint64_t)tc->seed, fsdp_data_rank(&r->fsdp), fsdp_data_size(&r->fsdp));
    dataloader_seek(&r->dl, ts->data_epoch, ts->data_pos);
    size_t room = (size_t)GA * B * r->m.T; // (train_step's rows are m.T apart: context parallelism pads them)
    r->tokens = (int *)mallocCheck(room * sizeof(int));
    r->targets = (int *)mallocCheck(room * sizeof(int));
    r->Ts = (int *)mallocCheck(GA * sizeof(int));
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    return 0;
}

// one optimizer step as train_step returns it, and its time
typedef struct {
    double loss, norm, ms;
    double cpu_ms; // the process's CPU time over the step, every thread's (ms x threads when all are busy)
    long n_tokens; // every rank's
    float lr;
    int skipped;   // NaN or infinite loss or norm: no update
    float loss_scale; // the loss scale the step ran with (1: none)
} StepStats;

// The step's line on stdout and, with --metrics_file (rank 0), its JSON record, with
// the speed: tokens/s, model TFLOP/s and MFU (against --peak_tflops). 1 when the
// metrics file could not be written.
static int report_step(const TrainConfig *tc, Trainer *r, const TrainState *ts, int total, const StepStats *s, double eta_s) {
    Model *m = &r->m;
    int W = r->fsdp.world.size;
    double flops = 0;
    for (int g = 0; g < tc->grad_accum; g++) flops += (double)tc->batch_size * fsdp_data_size(&r->fsdp) * flops_per_sequence(&m->host, r->Ts[g], m->s2_attn);
    double tflops = flops / (s->ms * 1e9), mfu = tc->peak_tflops > 0 ? tflops / (tc->peak_tflops * W) : -1;
    printf("step %d/%d | loss %.6f | lr %.3e | grad norm %.4f | %.1f ms | %.0f tok/s | %.3f TFLOP/s", ts->step, total,
           s->loss, s->lr, s->norm, s->ms, s->n_tokens / (s->ms / 1e3), tflops);
    if (mfu >= 0) printf(" | MFU %.1f%%", 100 * mfu);
    if (ts->ls.on) printf(" | loss scale %g", s->loss_scale);
    if (s->skipped) printf(" | skipped: NaN or inf loss or grad norm (%d skipped so far)", ts->step - ts->opt_t);
    printf(" | %.0f MiB | ETA %dm%02ds\n", model_peak_mb(m), (int)(eta_s / 60), (int)eta_s % 60);
    if (r->tb.f) { // Hugging Face Trainer's names where it has them
        const char *tags[] = {"train/loss", "train/learning_rate", "train/grad_norm", "train/tokens_per_second",
                              "train/peak_memory_mib", "train/mfu"};
        float v[] = {(float)s->loss, s->lr, (float)s->norm, (float)(s->n_tokens / (s->ms / 1e3)), (float)model_peak_mb(m), (float)mfu};
        if (tb_scalars(&r->tb, ts->step, tags, v, mfu >= 0 ? 6 : 5) != 0) {
            fprintf(stderr, "error: --tensorboard_dir: cannot write %s: %s (the checkpoints are intact)\n", r->tb.path, strerror(errno));
            return 1;
        }
    }
    FILE *metrics = r->metrics;
    if (!metrics) return 0;
    char lb[32], nb[32];
    fprintf(metrics, "{\"step\": %d, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"tokens\": %ld, \"skipped\": %d, "
            "\"skipped_total\": %d, \"ms\": %.3f, \"cpu_ms\": %.3f, \"tok_per_s\": %.3f, \"tflops\": %.6g, ", ts->step,
            metrics_num(lb, sizeof lb, s->loss), s->lr, metrics_num(nb, sizeof nb, s->norm), s->n_tokens, s->skipped,
            ts->step - ts->opt_t, s->ms, s->cpu_ms, s->n_tokens / (s->ms / 1e3), tflops);
    if (mfu >= 0) fprintf(metrics, "\"mfu\": %.6g, ", mfu);
    if (ts->ls.on) fprintf(metrics, "\"loss_scale\": %.9g, ", s->loss_scale);
    fprintf(metrics, "\"mem_mb\": %.1f, \"act_mb\": %.3f, \"carry_mb\": %.3f}\n", model_peak_mb(m), m->act_bytes / 1048576.0,
            m->carry_bytes / 1048576.0);
    return (fflush(metrics) != 0 || ferror(metrics)) && metrics_error(tc->metrics_file);
}

// --max_bad_steps NaN or infinite steps in a row: says why the run stops and
// returns the exit code (nothing is saved: the checkpoints so far stay the last good ones)
static int stop_bad_steps(const TrainConfig *tc, const TrainState *ts) {
    fprintf(stderr, "error: %d steps in a row (up to step %d) had a NaN or infinite loss or gradient norm (--max_bad_steps %d); "
            "stopping without saving. Likely causes: a learning rate too high (lower --lr, more --warmup_steps, keep "
            "--grad_clip on), overflow in low precision (fp16/bf16), or bad data (a sample with a huge loss). The "
            "checkpoints in %s are intact: fix the cause and --resume from there.\n", ts->bad_in_row, ts->step,
            tc->max_bad_steps, tc->output_dir);
    return 1;
}

// the peak memory of the run, and with several ranks every rank's (collective)
static void print_peak_memory(Trainer *r) {
    Model *m = &r->m;
    int W = r->fsdp.world.size;
    printf("peak %s %.1f MiB (activations %.1f MiB, carry %.1f MiB)", backend_memory, model_peak_mb(m), m->act_bytes / 1048576.0,
           m->carry_bytes / 1048576.0);
    float peak = (float)model_peak_mb(m), *peaks = (float *)mallocCheck((size_t)W * sizeof(float));
    fsdp_all_gather(&r->fsdp.world, peaks, &peak, 1);
    for (int i = 0; W > 1 && i < W; i++) printf("%s%.0f", i ? " " : "; per rank, MiB: ", peaks[i]);
    printf("\n");
    free(peaks);
}

// loads, trains and saves into r; returns the process exit code (train frees r).
// Every rank runs it in step: the phases that can fail on one rank end with
// failed_anywhere, and every collective sees the same shapes on every rank.
static int train_run(TrainConfig *tc, Trainer *r) {
#ifdef _OPENMP
    if (tc->threads > 0) omp_set_num_threads(tc->threads);
#endif
    Fsdp *f = &r->fsdp;
    int W = f->world.size;
    if (W > 1 && !backend_sharding) {
        if (f->world.rank == 0) fprintf(stderr, "error: this trainer runs one process; %d were started (the CPU trainer train_llama2 runs several)\n", W);
        return 1;
    }
    int T = 0;
    TrainState ts;
    memset(&ts, 0, sizeof ts);
    loss_scale_init(&ts.ls, !strcmp(tc->loss_scale, "dynamic") || (!strcmp(tc->loss_scale, "auto") && !strcmp(tc->precision, "fp16")));
    if (tc->batch_size && batch_derive(tc, fsdp_data_size(f), f->world.rank == 0) != 0) return 1; // auto: once train_load chose the batch
    double available = host_available(); // (before the model is loaded)
    if (train_load(tc, r, &T, available) != 0 || (tc->resume[0] && train_resume(tc, r, &ts) != 0)) return 1;
    int B = tc->batch_size, GA = tc->grad_accum;
    int gguf = tc->export_gguf[0] || tc->export_gguf_adapter[0];
    if ((tc->export_hf[0] || (tc->resume[0] && gguf)) && !tc->dry_run) { // a saved run written out, no training
        printf("exporting %s (step %d) to %s%s%s%s%s\n", r->resume_dir, ts.step, tc->export_hf[0] ? tc->export_hf : "",
               tc->export_hf[0] ? "/" : "", tc->export_gguf[0] ? " " : "", tc->export_gguf, tc->export_gguf_adapter[0] ? " (+ adapter)" : "");
        return save_outputs(tc, r, tc->export_hf[0] ? tc->export_hf : NULL, r->tokpath);
    }
    long rows_per_step = (long)B * GA * fsdp_data_size(f); // every data-parallel group's rows
    int total = tc->max_steps >= 0 ? tc->max_steps : (int)((tc->num_epochs * (long)r->train_ds.n_rows + rows_per_step - 1) / rows_per_step);
    double host = print_plan(tc, r, T, total);
    if (tc->dry_run) { // (a note, not a refusal: a plan may be for another machine)
        check_host_plan(tc, host, available);
        return 0;
    }
    if (tc->resume[0]) printf("resumed from %s at step %d\n", r->resume_dir, ts.step);
    if (train_begin(tc, r, &ts) != 0) return 1;

    Model *m = &r->m;
    if (ts.step == 0) print_samples(m, tc, &r->tok, 0);
    int first_step = ts.step, stop = fsdp_any(&f->world, stop_requested);
    double run_ms = 0;
    if (tc->profile_dir[0] && (tc->profile_last <= ts.step || tc->profile_first > total))
        printf("note: --profile_steps %s: no step of this run (%d to %d) is one of them, so no trace\n", tc->profile_steps,
               ts.step + 1, total);
    while (ts.step < total && !stop) {
        profile_step_begin(ts.step + 1); // (steps are counted from 1 where they are printed)
        double t0 = now_ms(), c0 = cpu_now_ms();
        StepStats s;
        s.loss_scale = ts.ls.scale;
        s.loss = train_step(r, tc, ts.step, total, &ts.ls, &s.n_tokens, &s.norm, &s.lr, &s.skipped);
        PROF_END(NULL); // the step's span
        s.ms = now_ms() - t0;
        s.cpu_ms = cpu_now_ms() - c0;
        run_ms += s.ms;
        ts.step++;
        ts.opt_t = r->opt.t; ts.data_epoch = (int)r->dl.epoch; ts.data_pos = (int)r->dl.pos;
        // With a loss scale, gradients that overflow under a finite loss are expected (a few early in
        // every fp16 run, until the scale settles): the scaler's to handle, not bad steps, while the
        // scale is at least 1. Below 1 they overflow unscaled: a divergence, and they count.
        int scaler_skip = s.skipped && ts.ls.on && isfinite(s.loss) && s.loss_scale >= 1.0f;
        if (!scaler_skip) ts.bad_in_row = s.skipped ? ts.bad_in_row + 1 : 0;
        double eta_s = run_ms / (ts.step - first_step) * (total - ts.step) / 1e3;
        if (failed_anywhere(r, report_step(tc, r, &ts, total, &s, eta_s))) return 1;
        fault_point("step", ts.step);
        if (ts.bad_in_row >= tc->max_bad_steps) return stop_bad_steps(tc, &ts); // every rank: the loss and the norm are the same on all
        if (has_validation(tc) && tc->eval_every > 0 && ts.step % tc->eval_every == 0 && ts.step < total) {
            PROF_BEGIN(NULL, "evaluation", -1, -1, -1);
            report_eval(m, &r->val_ds, B, r->pad_id, ts.step, r->metrics, &r->tb);
            PROF_END(NULL);
        }
        if (tc->sample_every > 0 && ts.step % tc->sample_every == 0 && ts.step < total) print_samples(m, tc, &r->tok, ts.step);
        stop = fsdp_any(&f->world, stop_requested); // a signal to any rank stops every rank after this step
        if ((tc->save_every > 0 && ts.step % tc->save_every == 0) || ts.step == total || stop) {
            PROF_BEGIN(NULL, "checkpoint", -1, -1, -1);
            if (save_checkpoint(tc, f, m, &r->opt, &ts, r->tokpath) != 0) return 1;
            PROF_END(NULL);
            printf("saved checkpoint %s/checkpoint-%d\n", tc->output_dir, ts.step);
        }
        if (prof.recording) { // (the same on every rank: a run that profiles nothing adds no collective)
            int ends = ts.step == total || stop;
            if (failed_anywhere(r, profile_step_done(ts.step, ends) != 0)) return 1;
            if (ends || ts.step == tc->profile_last)
                printf("wrote the trace of steps %d-%d to %s/\n", tc->profile_first > first_step ? tc->profile_first : first_step + 1,
                       ts.step, tc->profile_dir);
        }
    }
    if (stop) {
        printf("stopped by a signal after step %d; continue with --resume %s\n", ts.step, tc->output_dir);
        return 0;
    }
    if (has_validation(tc)) report_eval(m, &r->val_ds, B, r->pad_id, total, r->metrics, &r->tb); // also with --max_steps 0: evaluates the start
    print_samples(m, tc, &r->tok, ts.step);
    print_peak_memory(r); // every rank's, before the saves (which gather the model on rank 0)
    return save_outputs(tc, r, tc->output_dir, r->tokpath);
}

// trains and saves; returns the process exit code. Every exit of train_run,
// early errors included, comes back here to free what it had loaded. Under a
// launcher (mpirun, srun, torchrun) every rank runs it; rank 0 prints and writes the metrics.
static int train(TrainConfig *tc) {
    Trainer r;
    memset(&r, 0, sizeof r);
    FsdpStrategy strategy = FSDP_FULL_SHARD;
    fsdp_strategy_parse(tc->sharding_strategy, &strategy); // parse_args checked it
    int rc = fsdp_init(&r.fsdp, strategy, tc->shard_group) != 0 || fsdp_context_init(&r.fsdp, tc->context_parallel) != 0;
    int quiet = !rc && r.fsdp.world.rank != 0; // the other ranks' output would repeat rank 0's
    if (quiet) fflush(stdout), rc = freopen("/dev/null", "w", stdout) == NULL;
    if (!rc) rc = train_run(tc, &r);
    if (r.metrics) {
        int bad = ferror(r.metrics);
        if ((fclose(r.metrics) != 0 || bad) && rc == 0) rc = metrics_error(tc->metrics_file);
    }
    if (tb_close(&r.tb) != 0 && rc == 0) rc = 1, fprintf(stderr, "error: cannot close %s: %s\n", r.tb.path, strerror(errno));
    free(r.tokens); free(r.targets); free(r.Ts);
    optimizer_free(&r.opt);
    dataloader_free(&r.dl);
    model_free(&r.m);
    dataset_free(&r.train_ds);
    dataset_free(&r.val_ds);
    dataset_free(&r.all_ds); // last: the split sets share its token store
    tokenizer_free(&r.tok);
    fsdp_free(&r.fsdp);
    fsdp_world_finalize();
    return rc;
}

// main of both trainers. No --model and no --data: the built-in default run
// (default_model.h), the user's own options after its defaults so that they win.
static int train_main(int argc, char **argv) {
    int given = 0;
    for (int i = 1; i < argc; i++)
        given |= !strncmp(argv[i], "--model", 7) || !strncmp(argv[i], "--data", 6) || !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    char model_dir[4096], data_path[4096];
    int n_def = (int)(sizeof default_run_args / sizeof default_run_args[0]);
    char **args = NULL;
    if (!given) {
        if (default_setup(DEFAULT_RUN_DIR, model_dir, sizeof model_dir, data_path, sizeof data_path) != 0) return 1;
        printf("no --model or --data: the built-in default run (a small model and data generated in %s/; delete it to regenerate)\n", DEFAULT_RUN_DIR);
        args = (char **)mallocCheck((size_t)(argc + n_def + 5) * sizeof(char *));
        int n = 0;
        args[n++] = argv[0];
        for (int i = 0; i < n_def; i++) args[n++] = (char *)default_run_args[i];
        args[n++] = (char *)"--model"; args[n++] = model_dir; args[n++] = (char *)"--data"; args[n++] = data_path;
        for (int i = 1; i < argc; i++) args[n++] = argv[i];
        argc = n;
    }
    TrainConfig tc;
    int rc = parse_args(&tc, argc, args ? args : argv);
    rc = rc != 0 ? (rc > 0 ? 0 : 2) : train(&tc);
    free(args);
    return rc;
}
#endif
