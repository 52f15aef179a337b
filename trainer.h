// The host side of both trainers: the command line, setting up the model,
// the training loop, evaluation, sampling, checkpoints and exact resume, the
// metrics, FLOPs and the memory plan, and main's built-in default run. It
// computes nothing itself: a backend does, through the functions below.
// Its parts are in trainer/, one idea a header, included below in the order the
// data flows; this file keeps the loop (train_step, train_run, train, train_main).
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
//       int cpu_offload;       set by the trainer before model_alloc: --cpu_offload with
//                              --full_finetune: the masters, gradients and optimizer state in
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
//   static const char *const backend_dequant_scratch;  what that holds at a time, for the
//                              plan ("one layer", "one projection")
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
//   BACKEND_BASE_OFFLOAD (a macro) where --cpu_offload with an adapter keeps the frozen
//       base in host memory (the GPU's: docs/memory.md), with these Model members and function:
//       int base_offload;      set by the trainer before model_alloc: --cpu_offload 1 without
//                              --full_finetune (cpu_offload is then 0)
//       float peak_tflops;     set by the trainer before model_alloc: --peak_tflops, what
//                              the plan's streamed bytes are timed against (0: its default)
//       void base_offload_plan(const Model *m);  the memory plan's lines for it
//   BACKEND_ACTIVATION_OFFLOAD (a macro) where --activation_offloading runs a micro-batch layer
//       by layer with the layers' inputs in host memory (docs/long_context.md), with these
//       Model member and function:
//       int activation_offloading;  set by the trainer before model_alloc
//       void activation_offload_plan(const Model *m);  the memory plan's lines for it
//   static const int backend_activation_offloading;  1: --activation_offloading changes the
//                              schedule (options.h refuses what it does not run); 0: it changes nothing
//   BACKEND_PREFERENCE (a macro) where the backend runs --objective dpo and orpo
//       (trainer/preference.h), with these Model members and function:
//       const float *loss_weights;  set by the trainer around a model_forward_backward:
//                              (B, T) host memory, each target's weight in the loss whose
//                              gradient is added: grad_scale * sum of w * cross-entropy
//                              (NULL: every weight 1, SFT)
//       double *target_losses; set by the trainer around a model_forward: (B, T) host
//                              memory that receives each target's cross-entropy (the
//                              positions without one are left as they are; NULL: none)
//       int reference;         set by the trainer before model_alloc (DPO): room for a copy
//                              of the trainable weights, the reference model (counted in
//                              param_bytes)
//       void model_reference_swap(Model *m);
//           trades the reference's weights with the trained ones where the forward
//           reads them (before the reference's model_forward, and again after it); the
//           first call, before the first optimizer step, copies the weights as they are
//       int model_reference_get(Model *m, size_t first, size_t count, float *dst);
//       void model_reference_set(Model *m, size_t first, size_t count, const float *src);
//           elements [first, first + count) of the reference, fp32 in host memory, out and in,
//           exactly (outside a pair of swaps; one process's, or LoRA's on every rank): LoRA's
//           parameters (lora.params' order) or the model's (param_layout's); before the first
//           swap get copies the weights as the swap does, and set takes the place of that copy.
//           A DPO checkpoint saves and loads the reference through these, a staging buffer at a
//           time (trainer/checkpoint.h's save_reference); get returns 0
//   BACKEND_SHARED_PROMPT (a macro) where the backend runs a pair's prompt once (--shared_prompt),
//       with this Model member:
//       int shared_prompt;     set by the trainer around a model_forward or model_forward_backward
//                              of 2B rows: rows B .. 2B - 1 repeat the first shared_prompt tokens
//                              of rows 0 .. B - 1, where they have no target (chunk.h's
//                              rows_share); those positions run once, for rows 0 .. B - 1 (0: none)
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

#include "trainer/options.h"    // the command line: TrainConfig, parse_args
#include "trainer/load.h"       // the model, the tokenizer and the data
#include "trainer/plan.h"       // FLOPs, the memory plan, the batch, the host plan check
#include "trainer/schedule.h"   // the learning rate and the loss scale
#include "trainer/checkpoint.h" // checkpoints and exact resume
#include "trainer/sample.h"     // sampling
#include "trainer/preference.h" // --objective dpo and orpo: the per-pair loss, its per-token weights, the scores
#include "trainer/report.h"     // evaluation, the step's line, metrics, TensorBoard

// ----------------------------------------------------------------------------
// the training loop

// Collective: 1 if a phase failed on any rank (a failing rank has said why), so
// that every rank leaves together and none waits in a collective for one gone.
static int failed_anywhere(Trainer *r, int failed) {
    int any = fsdp_any(&r->fsdp.world, failed);
    if (any && !failed && r->fsdp.world.rank == 0) fprintf(stderr, "error: stopping every rank: another rank failed (its message is above)\n");
    return any;
}

// The start of an optimizer step (train_step's, preference_step's): the step's GA batches of B
// (rows, or pairs), each `cells` tokens apart in r->tokens and r->targets, loaded first (the loss
// is normalised over the whole step), this rank's tokens added to *tokens (a context-parallel
// group shares its rows: counted once) and, with labels, the batches' global label count; the
// gradients zeroed; the step's learning rate into *lr.
static void step_begin(Trainer *r, const TrainConfig *tc, int step, int total, LossScale *ls, size_t cells, double *tokens,
                       long *labels, float *lr) {
    PROF_BEGIN(NULL, "data", -1, -1, -1);
    for (int g = 0; g < tc->grad_accum; g++) {
        dataloader_next_batch(&r->dl, tc->batch_size, r->pad_id, r->tokens + (size_t)g * cells, r->targets + (size_t)g * cells, &r->Ts[g]);
        memcpy(r->rows + (size_t)g * tc->batch_size, r->dl.rows + (size_t)r->dl.rank * tc->batch_size, tc->batch_size * sizeof *r->rows);
        if (labels) *labels += dataloader_global_labels(&r->dl);
        if (r->fsdp.context.rank == 0) *tokens += r->dl.batch_tokens;
    }
    PROF_END(NULL);
    optimizer_zero_grad(&r->opt);
    *lr = lr_at(tc->lr_scheduler, tc->lr, step, tc->warmup_steps, total);
#ifdef BACKEND_STEP_IN_BACKWARD
    optimizer_begin_step(&r->opt, step + 1, *lr, tc->grad_accum, ls->on);
#else
    (void)ls;
#endif
}

// the tests' injected faults (1-based steps, as printed) on a step's gradient scale: NaN
// gradients, or finite ones whose squares overflow
static float step_fault(int step, float scale) {
    if (fault_at("nan", step + 1)) scale = NAN;
    if (fault_at("huge", step + 1)) scale *= 1e30f;
    return scale;
}

// The end of an optimizer step: the update with the step's loss (every rank's), clipping inside;
// a NaN or infinite loss or gradient norm skips it (*skipped = 1); then the loss scale is updated.
static void step_end(Trainer *r, LossScale *ls, float lr, double loss, double *norm, int *skipped) {
    PROF_BEGIN(NULL, "optimizer", -1, -1, -1);
    *norm = optimizer_step(&r->opt, lr, 1.0f / ls->scale, isfinite(loss));
    PROF_END(NULL);
    *skipped = !isfinite(loss) || !isfinite(*norm);
    loss_scale_update(ls, !isfinite(*norm)); // the norm (a sum in double) is finite exactly when every gradient is
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
    step_begin(r, tc, step, total, ls, (size_t)B * T, &sums[1], &labels, lr);
    float scale = step_fault(step, labels ? ls->scale / (float)labels : 0.0f); // (exact: ls->scale is a power of two)
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
    step_end(r, ls, *lr, loss, norm, skipped);
    return loss;
}

#ifdef BACKEND_PREFERENCE
// One optimizer step of preference tuning, as train_step's (whose arguments it takes) but
// for pairs: GA micro-batches of B pairs on every rank; the metrics of the step's pairs into
// pm (PM_N). Returns the step's loss.
static double preference_step(Trainer *r, const TrainConfig *tc, int step, int total, LossScale *ls, long *n_tokens, double *norm,
                              float *lr, int *skipped, double *pm) {
    Model *m = &r->m;
    int B = tc->batch_size, GA = tc->grad_accum, T = m->T, W = fsdp_data_size(&r->fsdp), orpo = !strcmp(tc->objective, "orpo");
    double pairs = (double)B * GA * W, sums[2 + PM_N] = {0}; // the loss, the tokens, the metrics: this rank's, then every rank's
    size_t cells = (size_t)2 * B * T;
    int *nll_tg = orpo ? (int *)mallocCheck(cells * sizeof(int)) : NULL;
    double *ce = (double *)mallocCheck(cells * sizeof(double)), (*dl)[2] = (double (*)[2])mallocCheck((size_t)B * sizeof *dl);
    double *ref = r->train_ds.ref_logps ? (double *)mallocCheck((size_t)B * 2 * sizeof(double)) : NULL; // (B, 2) precomputed
    float *w = (float *)mallocCheck(cells * sizeof(float));
    PairScores *ps = (PairScores *)mallocCheck((size_t)B * sizeof *ps);
    step_begin(r, tc, step, total, ls, cells, &sums[1], NULL, lr);
    float scale = step_fault(step, ls->scale); // (the weights carry the rest of the gradient's scale)
    for (int g = 0; g < GA; g++) {
        const int *tokens = r->tokens + (size_t)g * cells, *tg = r->targets + (size_t)g * cells;
        int Tg = r->Ts[g];
        long nll_n;
        m->dropout_key = splitmix64(((uint64_t)tc->seed << 32) ^ ((uint64_t)step * GA + g));
        if (orpo) orpo_targets(tokens, tg, B, Tg, nll_tg);
        PROF_BEGIN(NULL, "preference scores", -1, -1, -1);
        for (int b = 0; ref && b < B; b++) memcpy(ref + 2 * b, r->train_ds.ref_logps + 2 * (size_t)r->rows[(size_t)g * B + b], 2 * sizeof(double));
        double nll = preference_score(m, tc, tokens, tg, nll_tg, B, Tg, ref, ce, ps, &nll_n);
        PROF_END(NULL);
        for (int b = 0; b < B; b++) sums[0] += preference_pair(tc, &ps[b], dl[b], sums + 2) / pairs;
        if (orpo) sums[0] += nll / nll_n / (GA * W), sums[2 + PM_NLL_LOSS] += nll / nll_n * B; // (per pair, as the other metrics)
        preference_weights(tg, nll_tg, (const double (*)[2])dl, B, Tg, pairs, orpo ? 1.0 / ((double)nll_n * GA * W) : 0, w);
        m->loss_weights = w;
        int S = preference_shared(m, tc, tokens, tg, B, Tg);
        preference_set_shared(m, S);
        r->pair_positions[0] += (double)B * (2 * Tg - S), r->pair_positions[1] += 2.0 * B * Tg;
        PROF_BEGIN(NULL, "forward-backward", -1, -1, -1);
        model_forward_backward(m, tokens, orpo ? nll_tg : tg, 2 * B, Tg, scale);
        PROF_END(NULL);
        preference_set_shared(m, 0);
        m->loss_weights = NULL;
    }
    free(nll_tg); free(ce); free(dl); free(w); free(ps); free(ref);
    if (r->fsdp.context.rank != 0) memset(sums + 2, 0, PM_N * sizeof *sums), sums[0] = 0; // (a context group's pairs count once)
    PROF_BEGIN(NULL, "all-reduce loss", -1, -1, sizeof sums);
    fsdp_all_reduce(&r->fsdp.world, sums, 2 + PM_N, FSDP_F64);
    PROF_END(NULL);
    *n_tokens = (long)sums[1];
    for (int k = 0; k < PM_N; k++) pm[k] = sums[2 + k] / pairs;
    step_end(r, ls, *lr, sums[0], norm, skipped);
    return sums[0];
}
#endif

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

// rank 0's part of save_outputs: the files (chat: the GGUF's chat template when the model folder has none)
static int write_outputs(const TrainConfig *tc, HostModel *h, int merge, const char *dir, const char *tokpath, const char *chat) {
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
        rc = export_gguf_model(h, tc->export_gguf, tc->model, tokpath, tc->gguf_ftype, chat) != 0;
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
    const char *chat = r->train_ds.format == FORMAT_CHAT ? chat_jinja_template(&r->tok) : NULL; // the format it trained on
    if (host_sharded(h) && !h->use_lora && !h->shards) {
        ShardGather g = {&r->fsdp, h, h->weights_ctx};
        if (r->fsdp.replica.rank != 0) return 0;
        if (!rank0) { shard_gather_serve(&g); return 0; }
        h->weights_get = shard_gather_get, h->weights_ctx = &g;
        int rc = write_outputs(tc, h, merge, dir, tokpath, chat);
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
    return rank0 ? write_outputs(tc, h, merge, dir, tokpath, chat) : 0;
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
    if (!failed && (tc->export_gguf[0] || tc->merge_adapter) && tc->quant_type != QUANT_NONE && W > 1) {
        fprintf(stderr, "error: %s with --quantize over %d ranks is not supported yet (the 4-bit layers are not gathered): "
                "merge or export the saved checkpoint from one process with --resume CHECKPOINT\n",
                tc->merge_adapter ? "--merge_adapter" : "--export_gguf", W);
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
    model_alloc(m, batch_rows(tc), *T, tc->chunk_size, strcmp(tc->chunk_memory, "recompute") == 0, tc->num_output_chunks);
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
#ifdef BACKEND_PREFERENCE
    if (!failed && !tc->dry_run && !strcmp(tc->objective, "dpo"))
        failed = load_reference(tc, r->resume_dir, &r->m, &r->train_ds, &r->val_ds) != 0;
#endif
    if (!failed && ts->data_pos > r->train_ds.n_rows) {
        fprintf(stderr, "error: --resume %s: data position %d is past the %ld rows\n", r->resume_dir, ts->data_pos, r->train_ds.n_rows);
        failed = 1;
    }
    if (failed_anywhere(r, failed)) return 1;
    if (!tc->dry_run) optimizer_sync_device(&r->opt); // (a dry run's model has no device side)
    return 0;
}

// What the steps need: the metrics file (rank 0; on resume cut back to the
// checkpoint's step), the data loader at the resumed position, the buffers of a
// step's micro-batches, and the signals that stop the run after a step.
// Collective: 0 ok, 1 when a rank failed.
static int train_begin(TrainConfig *tc, Trainer *r, const TrainState *ts) {
    int rank0 = r->fsdp.world.rank == 0, GA = tc->grad_accum;
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
    size_t room = (size_t)GA * batch_rows(tc) * r->m.T; // (train_step's rows are m.T apart: context parallelism pads them)
    r->tokens = (int *)mallocCheck(room * sizeof(int));
    r->targets = (int *)mallocCheck(room * sizeof(int));
    r->Ts = (int *)mallocCheck(GA * sizeof(int));
    r->rows = (int32_t *)mallocCheck((size_t)GA * tc->batch_size * sizeof(int32_t));
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    return 0;
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
#ifdef BACKEND_PREFERENCE
    if (preference(tc)) preference_plan(&r->m, tc, &r->train_ds, r->pad_id);
#endif
    if (tc->dry_run) { // (a note, not a refusal: a plan may be for another machine)
        check_host_plan(tc, host, available);
        return 0;
    }
    if (tc->resume[0]) printf("resumed from %s at step %d\n", r->resume_dir, ts.step);
    if (train_begin(tc, r, &ts) != 0) return 1;

    Model *m = &r->m;
#ifdef BACKEND_PREFERENCE
    if (tc->precompute_ref_log_probs && !tc->resume[0]) { // (a resume reads the start's from its checkpoint)
        preference_precompute(m, tc, &r->train_ds, B, r->pad_id);
        if (has_validation(tc)) preference_precompute(m, tc, &r->val_ds, B, r->pad_id);
        printf("precomputed the reference's log-probabilities of %ld training and %ld validation pairs\n", r->train_ds.n_rows,
               has_validation(tc) ? r->val_ds.n_rows : 0L);
    }
#endif
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
#ifdef BACKEND_PREFERENCE
        if (preference(tc)) s.loss = preference_step(r, tc, ts.step, total, &ts.ls, &s.n_tokens, &s.norm, &s.lr, &s.skipped, s.pm);
        else
#endif
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
            report_eval(tc, m, &r->val_ds, B, r->pad_id, ts.step, r->metrics, &r->tb);
            PROF_END(NULL);
        }
        if (tc->sample_every > 0 && ts.step % tc->sample_every == 0 && ts.step < total) print_samples(m, tc, &r->tok, ts.step);
        stop = fsdp_any(&f->world, stop_requested); // a signal to any rank stops every rank after this step
        if ((tc->save_every > 0 && ts.step % tc->save_every == 0) || ts.step == total || stop) {
            PROF_BEGIN(NULL, "checkpoint", -1, -1, -1);
            if (save_checkpoint(tc, f, m, &r->opt, &ts, r->tokpath, &r->train_ds, &r->val_ds) != 0) return 1;
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
    if (has_validation(tc)) report_eval(tc, m, &r->val_ds, B, r->pad_id, total, r->metrics, &r->tb); // also with --max_steps 0: evaluates the start
    print_samples(m, tc, &r->tok, ts.step);
    print_peak_memory(r); // every rank's, before the saves (which gather the model on rank 0)
    if (r->pair_positions[1] > 0)
        printf("the pairs' rows ran %.0f positions, %.0f as two rows a pair (--shared_prompt %s: %.1f%% fewer)\n", r->pair_positions[0],
               r->pair_positions[1], tc->shared_prompt, 100 * (1 - r->pair_positions[0] / r->pair_positions[1]));
    return save_outputs(tc, r, tc->output_dir, r->tokpath);
}

// what train_run loaded and allocated into r (but the metrics file and TensorBoard's, which
// train closes, checking them)
static void trainer_free(Trainer *r) {
    free(r->tokens); free(r->targets); free(r->Ts); free(r->rows);
    optimizer_free(&r->opt);
    dataloader_free(&r->dl);
    model_free(&r->m);
    dataset_free(&r->train_ds);
    dataset_free(&r->val_ds);
    dataset_free(&r->all_ds); // last: the split sets share its token store
    tokenizer_free(&r->tok);
    fsdp_free(&r->fsdp);
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
    trainer_free(&r);
    fsdp_world_finalize();
    return rc;
}

// main of both trainers. No --model and no --data: the built-in default run
// (default_model.h), the user's own options after its defaults so that they win.
static int train_main(int argc, char **argv) {
    int given = 0;
    for (int i = 1; i < argc; i++)
        given |= !strncmp(argv[i], "--model", 7) || !strncmp(argv[i], "--data", 6) || !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") ||
                 !strcmp(argv[i], "--refusals");
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
