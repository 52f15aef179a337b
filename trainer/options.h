// trainer/options.h: the command line. TrainConfig holds every option; OPTIONS is their
// table (name, type, default, help, range), which --help, the start-up table, TensorBoard's
// text and a checkpoint's options all read; parse_args sets them, checks each alone, then
// refuses the ones that do not go together from a second table, refusals.
#ifndef TRAINER_OPTIONS_H
#define TRAINER_OPTIONS_H

#define MAX_LIST 16
#define BATCH_SIZE_MAX (1 << 16) // --batch_size's largest, and --batch_size auto's
typedef struct { const char *v[MAX_LIST]; int n; } StrList; // a repeatable option's values

typedef struct {
    const char *model, *data, *val_data, *output_dir, *tokenizer, *metrics_file, *tensorboard_dir, *from_peft_checkpoint;
    const char *profile_dir, *profile_steps;
    int profile_first, profile_last; // --profile_steps (parse_args)
    int max_seq_len, batch_size, grad_accum, global_batch_size, max_steps, num_epochs, warmup_steps, seed, shuffle;
    float memory_limit, host_memory_limit;
    int eval_every, full_finetune, pure_bf16, freeze_layers, cpu_offload, lora_r, use_rslora, use_dora, threads, chunk_size, num_output_chunks, activation_checkpointing, activation_offloading, offload_every, s2_attn, context_parallel;
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
    const char *lora_option;  // the last LoRA-only option given (parse_args; the other adapters refuse them)
    int double_quant;
    const char *objective, *dpo_loss_type; // --objective sft | dpo | orpo (trainer/preference.h)
    float beta;
    const char *shared_prompt; // auto | on | off: a pair's prompt run once (trainer/preference.h)
    int precompute_ref_log_probs;
} TrainConfig;

enum { OPT_STR, OPT_INT, OPT_INT_AUTO, OPT_FLOAT, OPT_FLAG, OPT_LIST }; // OPT_INT_AUTO: an integer, or auto (stored as 0)
typedef struct { const char *name; int type; void *ptr; const char *def, *help; double lo, hi; } Option;
// the quiet options: listed in the start-up table, TensorBoard's text and a checkpoint's options only
// when set away from their default, so that the runs that do not use them print and save what they did
// before these options existed
static const char *const quiet_options[] = {"objective", "beta", "dpo_loss_type", "shared_prompt", "precompute_ref_log_probs",
                                            "activation_offloading", "offload_every"};

#define OPTIONS(tc) { \
    {"model", OPT_STR, &(tc)->model, "", "Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.model or tokenizer.json)", 0, 0}, \
    {"data", OPT_STR, &(tc)->data, "", "training data: JSONL or a JSON array of records (see --data_format)", 0, 0}, \
    {"data_format", OPT_STR, &(tc)->data_format, "auto", "auto | text | prompt_response | alpaca | samsum | chat | preference (auto: from the first record's keys; preference: {prompt, chosen, rejected}, for --objective dpo or orpo)", 0, 0}, \
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
    {"activation_offloading", OPT_FLAG, &(tc)->activation_offloading, "0", "train_llama2cu: run each micro-batch layer by layer over the whole sequence (chunk by chunk, --chunk_size), every layer's input in pinned host memory, so that the GPU holds one layer's KV and dKV carries instead of every layer's: contexts past the GPU's memory, the same results (torchtune's enable_activation_offloading). Implies --activation_checkpointing and one chunk's activations at a time (any --chunk_memory); the plan says the bytes moved and their PCIe time against the compute. Not with --context_parallel, --peft_method prefix, --shared_prompt on, --sample_prompt, or a tied embedding that trains. The CPU trainer's activations are host memory already: it changes nothing", 0, 1}, \
    {"offload_every", OPT_INT, &(tc)->offload_every, "1", "with --activation_offloading (train_llama2cu): keep only every K-th layer's input in pinned host memory (layers 0, K, 2K, ..., and the head's), about K times less host memory; the backward re-runs the forward of each group of K layers from its kept input, the K - 1 inputs inside the group held on the GPU over the whole sequence: one more forward of those layers (the plan says how much), the same results. At most the model's decoder layers", 1, 1 << 20}, \
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
    {"cpu_offload", OPT_INT, &(tc)->cpu_offload, "0", "1: full fine-tuning keeps the fp32 masters, gradients and optimizer state in host memory (--pure_bf16: the bf16 weights, the step's bf16 gradients and AnyPrecisionAdamW's bf16 state), steps on the CPU and copies the updated weights back to the GPU (llama-recipes' fsdp_cpu_offload, DeepSpeed's ZeRO-Offload); each rank offloads its shards; the results are those without it, bit for bit. With --grad_clip 0, no loss scale and no sum over replicas (one process, FULL_SHARD, SHARD_GRAD_OP; not --pure_bf16 with --chunk_size) each unit steps as soon as its gradient is final, overlapped with the rest of the backward, and a NaN or inf gradient then stops the run instead of skipping the step (--grad_clip 1e9: the same results, the step after the backward). With LoRA, QLoRA and the other adapters (train_llama2cu): the frozen base's decoder layers (bf16/fp16, or QLoRA's 4-bit runs) stay in pinned host memory and each is copied up a layer ahead of its use into a ring of two on the GPU, the same results; with the units sharded, each rank's shards of them, gathered on the GPU as without it; the plan says the bytes streamed and their PCIe time against the compute. The CPU trainer holds them there already", 0, 1}, \
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
    {"gguf_type", OPT_STR, &(tc)->gguf_type, "f16", "f32 | f16 | bf16 | q8_0 | q4_k_m | q5_k_m | q6_k: the type of the GGUF files' weight matrices (the norms stay f32; the k-quants as llama-quantize mixes them)", 0, 0}, \
    {"precision", OPT_STR, &(tc)->precision, backend_precisions[0], "bf16 | fp16 | fp32: how weights and activations are stored (fp16: with --loss_scale; for GPUs without bf16, V100 and T4; fp32: all of it, e.g. to compare with the CPU trainer, which runs fp32 only)", 0, 0}, \
    {"loss_scale", OPT_STR, &(tc)->loss_scale, "auto", "auto | dynamic | none: dynamic loss scaling as torch.amp.GradScaler (initial scale 65536, x2 after 2000 steps without an overflow, x0.5 and the step skipped on one); auto: dynamic with --precision fp16, else none (as torch). The CPU trainer runs it too (fp32: exact, the same steps except the skipped ones)", 0, 0}, \
    {"collectives", OPT_STR, &(tc)->collectives, backend_collectives[0], "auto | nccl | host: how the ranks' device buffers are gathered and summed (train_llama2cu): nccl, or host: through host memory over MPI or TCP, summed in rank order as the CPU trainer sums (ranks may share a GPU); auto: nccl when every rank of a node has its own GPU, else host. The CPU trainer: host only", 0, 0}, \
    {"random_init", OPT_FLAG, &(tc)->random_init, "0", "for benchmarks only: random weights N(0, initializer_range) drawn from --seed, with --model holding just config.json and tokenizer.model", 0, 1}, \
    {"quantize", OPT_STR, &(tc)->quantize, "none", "none | nf4 | fp4: QLoRA, the decoder's linear weights quantized to 4 bits as they load, exactly as bitsandbytes (blocks of 64); LoRA or IA3", 0, 0}, \
    {"double_quant", OPT_INT, &(tc)->double_quant, "1", "with --quantize: 1 stores the absmax values in 8 bits too (bitsandbytes' bnb_4bit_use_double_quant)", 0, 1}, \
    {"objective", OPT_STR, &(tc)->objective, "sft", "sft | dpo | orpo: supervised fine-tuning; preference tuning on {prompt, chosen, rejected} records as TRL's DPOTrainer (against the starting model as the reference) or ORPOTrainer (no reference); --batch_size counts pairs (docs/preference.md)", 0, 0}, \
    {"beta", OPT_FLOAT, &(tc)->beta, "0.1", "--objective dpo: DPO's beta (how far the policy may move from the reference); orpo: ORPO's lambda, the weight of the odds-ratio term (TRL's beta for both)", 1e-6, 1e6}, \
    {"dpo_loss_type", OPT_STR, &(tc)->dpo_loss_type, "sigmoid", "--objective dpo: sigmoid | ipo | hinge, TRL's loss_type: -logsigmoid(beta m); (m_avg - 1 / (2 beta))^2 on per-token averages; relu(1 - beta m), m the chosen minus the rejected log-ratio to the reference", 0, 0}, \
    {"shared_prompt", OPT_STR, &(tc)->shared_prompt, "auto", "--objective dpo or orpo: auto | on | off: a pair's prompt runs once, its keys and values carried into both responses (the same gradients as two rows, to rounding); auto: on but where LoRA dropout is on (one mask for the prompt then: on); off: two rows, as TRL", 0, 0}, \
    {"precompute_ref_log_probs", OPT_INT, &(tc)->precompute_ref_log_probs, "0", "--objective dpo: 1 computes every pair's log-probabilities under the reference in one pass before step 1 (training and validation pairs), so that a step runs no reference forward and full fine-tuning holds no copy of the model (TRL's precompute_ref_log_probs)", 0, 1}, \
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

// a quiet option at its default: left out of the listings (quiet_options)
static int option_quiet(const Option *o) {
    int quiet = 0;
    for (size_t i = 0; i < sizeof quiet_options / sizeof *quiet_options; i++) quiet |= !strcmp(o->name, quiet_options[i]);
    if (!quiet) return 0;
    if (o->type == OPT_FLOAT) return *(float *)o->ptr == (float)strtod(o->def, NULL);
    char val[PATH_MAX + 64];
    option_value(o, val, sizeof val, 0);
    return !strcmp(val, o->def);
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

// ----------------------------------------------------------------------------
// the options that do not go together
//
// Each row of refusals refuses --option with another option (or a condition on one, or on
// the trainer), saying why. parse_args checks the rows in this order, and the first that
// applies is the one a user sees; it checks them in groups, between its steps that parse the
// values some rows read. docs/training.md lists the rows (--refusals prints them;
// test/test_cli.sh checks that the two agree).

// the step of parse_args a row comes after
enum { AFTER_CHOICES, AFTER_PEFT_METHOD, AFTER_IA3_MODULES, AFTER_TRAINABLE_PARAMS, AFTER_SHARDING, AFTER_REQUIRED };
typedef struct {
    const char *option, *with;   // what is refused with what, as docs/training.md lists them
    int after;                   // AFTER_*
    int (*applies)(const TrainConfig *tc);
    const char *why;             // the message after "error: "; {name}: --name's value ({lora_option}: tc->lora_option)
} Refusal;

static int sgd_options_without_sgd(const TrainConfig *tc) {
    return tc->optim.kind != OPTIMIZER_SGD && (tc->optim.momentum != 0 || tc->optim.nesterov);
}
static int nesterov_without_momentum(const TrainConfig *tc) { return tc->optim.nesterov && tc->optim.momentum == 0; }
static int val_data_with_val_split(const TrainConfig *tc) { return tc->val_data[0] && tc->val_split > 0; }
static int chunk_over_max_seq_len(const TrainConfig *tc) { return tc->chunk_size > tc->max_seq_len; }
static int s2_attn_without_packing(const TrainConfig *tc) { return tc->s2_attn && strcmp(tc->batching, "packing"); }
static int s2_attn_rows_not_by_4(const TrainConfig *tc) { return tc->s2_attn && tc->max_seq_len % 4; }
static int context_parallel_unsupported(const TrainConfig *tc) { return tc->context_parallel > 1 && !backend_context_parallel; }
static int context_parallel_with_pure_bf16(const TrainConfig *tc) { return tc->context_parallel > 1 && tc->pure_bf16; }
static int context_parallel_with_prefix(const TrainConfig *tc) { return tc->context_parallel > 1 && !strcmp(tc->peft_method, "prefix"); }
static int context_parallel_untested(const TrainConfig *tc) { return tc->context_parallel > 1 && backend_context_parallel == 2; }
static int context_parallel_with_s2_attn(const TrainConfig *tc) { return context_parallel_untested(tc) && tc->s2_attn; }
static int context_parallel_with_cpu_offload(const TrainConfig *tc) { return context_parallel_untested(tc) && tc->cpu_offload; }
// --activation_offloading (train_llama2cu's layer-major schedule): what it does not run
static int activation_offloading_untested(const TrainConfig *tc) { return tc->activation_offloading && backend_activation_offloading; }
static int activation_offloading_with_context_parallel(const TrainConfig *tc) {
    return activation_offloading_untested(tc) && tc->context_parallel > 1;
}
static int activation_offloading_with_prefix(const TrainConfig *tc) {
    return activation_offloading_untested(tc) && !strcmp(tc->peft_method, "prefix");
}
static int activation_offloading_with_shared_prompt(const TrainConfig *tc) {
    return activation_offloading_untested(tc) && !strcmp(tc->shared_prompt, "on");
}
static int activation_offloading_with_sample(const TrainConfig *tc) { return activation_offloading_untested(tc) && tc->sample_prompt.n; }
static int offload_every_without_offloading(const TrainConfig *tc) { return tc->offload_every > 1 && !tc->activation_offloading; }
static int output_chunks_over_chunk(const TrainConfig *tc) { return tc->chunk_size && tc->num_output_chunks > tc->chunk_size; }
static int output_chunks_over_row(const TrainConfig *tc) { return !tc->chunk_size && tc->num_output_chunks > tc->max_seq_len; }
static int adapter_other_than_lora(const TrainConfig *tc) { return strcmp(tc->peft_method, "lora") != 0; }
static int adapter_with_full_finetune(const TrainConfig *tc) { return adapter_other_than_lora(tc) && tc->full_finetune; }
static int lora_option_with_ia3(const TrainConfig *tc) { return tc->lora_option && !strcmp(tc->peft_method, "ia3"); }
static int lora_option_with_prefix(const TrainConfig *tc) { return tc->lora_option && !strcmp(tc->peft_method, "prefix"); }
static int lora_option_with_llama_adapter(const TrainConfig *tc) { return tc->lora_option && !strcmp(tc->peft_method, "llama_adapter"); }
static int s2_attn_with_prefix(const TrainConfig *tc) { return tc->s2_attn && !strcmp(tc->peft_method, "prefix"); }
static int gguf_adapter_with_ia3(const TrainConfig *tc) { return tc->export_gguf_adapter[0] && !strcmp(tc->peft_method, "ia3"); }
static int ia3_feedforward_outside_targets(const TrainConfig *tc) {
    unsigned targets, feedforward; // (parse_args has parsed them: no message)
    return !strcmp(tc->peft_method, "ia3") && ia3_modules(tc, &targets, &feedforward) == 0 && (feedforward & ~targets);
}
static int trainable_params_with_full_finetune(const TrainConfig *tc) { return tc->trainable_params[0] && tc->full_finetune; }
static int trainable_params_with_adapter(const TrainConfig *tc) { return tc->trainable_params[0] && adapter_other_than_lora(tc); }
static int trainable_params_with_gguf_adapter(const TrainConfig *tc) { return tc->trainable_params[0] && tc->export_gguf_adapter[0]; }
static int trainable_params_with_quantize(const TrainConfig *tc) { return tc->trainable_params[0] && tc->quant_type != QUANT_NONE; }
static int random_init_with_resume(const TrainConfig *tc) { return tc->random_init && tc->resume[0]; }
static int export_hf_without_resume(const TrainConfig *tc) { return tc->export_hf[0] && !tc->resume[0]; }
static int memory_limit_with_batch_size(const TrainConfig *tc) { return tc->memory_limit > 0 && tc->batch_size; }
static int batch_size_auto_without_limit(const TrainConfig *tc) {
    return !tc->batch_size && !tc->memory_limit && !backend_measures_free_memory;
}
static int use_dora_with_full_finetune(const TrainConfig *tc) { return tc->full_finetune && tc->use_dora; }
static int merge_adapter_with_full_finetune(const TrainConfig *tc) { return tc->full_finetune && tc->merge_adapter; }
static int anyprecision(const TrainConfig *tc) { return tc->optim.kind == OPTIMIZER_ANYPRECISION; }
static int kahan_without_anyprecision(const TrainConfig *tc) { return tc->optim.kahan && !anyprecision(tc); }
static int anyprecision_without_pure_bf16(const TrainConfig *tc) { return anyprecision(tc) && !tc->pure_bf16; }
static int pure_bf16_without_full_finetune(const TrainConfig *tc) { return tc->pure_bf16 && !tc->full_finetune; }
static int pure_bf16_without_anyprecision(const TrainConfig *tc) { return tc->pure_bf16 && !anyprecision(tc); }
static int pure_bf16_without_bf16(const TrainConfig *tc) { // (the CPU twin: fp32 only)
    return tc->pure_bf16 && !strcmp(backend_precisions[0], "bf16") && strcmp(tc->precision, "bf16");
}
static int freeze_layers_without_full_finetune(const TrainConfig *tc) { return tc->freeze_layers && !tc->full_finetune; }
static int peft_checkpoint_with_full_finetune(const TrainConfig *tc) { return tc->full_finetune && tc->from_peft_checkpoint[0]; }
static int quantize_with_full_finetune(const TrainConfig *tc) { return tc->quant_type != QUANT_NONE && tc->full_finetune; }
static int gguf_adapter_with_full_finetune(const TrainConfig *tc) { return tc->export_gguf_adapter[0] && tc->full_finetune; }
static int gguf_adapter_with_dora(const TrainConfig *tc) { return tc->export_gguf_adapter[0] && tc->use_dora; }
static int gguf_adapter_kquant(const TrainConfig *tc) { return tc->export_gguf_adapter[0] && gguf_is_kquant(tc->gguf_ftype); }

// --objective and --dpo_loss_type (trainer/preference.h)
static const char *const objective_names[] = {"sft", "dpo", "orpo"};
static const char *const dpo_loss_names[] = {"sigmoid", "ipo", "hinge"};
static const char *const shared_prompt_names[] = {"auto", "on", "off"};
static int preference(const TrainConfig *tc) { return strcmp(tc->objective, "sft") != 0; }
// the rows of a micro-batch: --batch_size's, or for preference tuning two a pair
static int batch_rows(const TrainConfig *tc) { return tc->batch_size * (preference(tc) ? 2 : 1); }
static int dpo_loss_without_dpo(const TrainConfig *tc) { return strcmp(tc->dpo_loss_type, "sigmoid") && strcmp(tc->objective, "dpo"); }
static int beta_without_preference(const TrainConfig *tc) { return tc->beta != 0.1f && !preference(tc); }
static int preference_with_packing(const TrainConfig *tc) { return preference(tc) && !strcmp(tc->batching, "packing"); }
static int preference_with_train_on_prompt(const TrainConfig *tc) { return preference(tc) && tc->train_on_prompt; }
static int preference_with_batch_size_auto(const TrainConfig *tc) { return preference(tc) && !tc->batch_size; }
static int shared_prompt_without_preference(const TrainConfig *tc) { return strcmp(tc->shared_prompt, "auto") && !preference(tc); }
// (a prefix's virtual positions sit in the carry ahead of every row; context parallelism's ranks
// hold pieces of the rows: the prompt's keys and values are not one row's run)
static int shared_prompt_with_prefix(const TrainConfig *tc) { return !strcmp(tc->shared_prompt, "on") && !strcmp(tc->peft_method, "prefix"); }
static int shared_prompt_with_context_parallel(const TrainConfig *tc) { return !strcmp(tc->shared_prompt, "on") && tc->context_parallel > 1; }
static int precompute_without_dpo(const TrainConfig *tc) { return tc->precompute_ref_log_probs && strcmp(tc->objective, "dpo"); }

static const Refusal refusals[] = {
    {"--momentum, --nesterov", "--optimizer other than sgd", AFTER_CHOICES, sgd_options_without_sgd,
     "--momentum and --nesterov are SGD's: give them with --optimizer sgd"},
    {"--nesterov 1", "--momentum 0", AFTER_CHOICES, nesterov_without_momentum, // torch.optim.SGD refuses it too
     "--nesterov 1 needs a --momentum above 0 (Nesterov momentum without momentum is plain SGD)"},
    {"--val_data", "--val_split", AFTER_CHOICES, val_data_with_val_split,
     "--val_data and --val_split do not go together (one validation set)"},
    {"--chunk_size", "a shorter --max_seq_len", AFTER_CHOICES, chunk_over_max_seq_len,
     "--chunk_size {chunk_size} is larger than --max_seq_len {max_seq_len} (use 0 for whole sequences)"},
    {"--s2_attn 1", "--batching padding", AFTER_CHOICES, s2_attn_without_packing, // padding's micro-batches take their longest row's length
     "--s2_attn needs --batching packing: its 4 groups cut rows of one length, a multiple of 4 (--max_seq_len)"},
    {"--s2_attn 1", "a --max_seq_len not a multiple of 4", AFTER_CHOICES, s2_attn_rows_not_by_4,
     "--s2_attn cuts rows in 4 groups: --max_seq_len {max_seq_len} is not a multiple of 4"},
    {"--context_parallel above 1", "a trainer without it", AFTER_CHOICES, context_parallel_unsupported,
     "--context_parallel is not supported yet by this trainer (train_llama2, the CPU trainer, has it)"},
    // (a prefix moves the carry's rows, which the context group gathers from; pure bf16's rounding of
    // each rank's part assumes ranks hold whole rows: neither is tested with context parallelism)
    {"--context_parallel above 1", "--pure_bf16 1", AFTER_CHOICES, context_parallel_with_pure_bf16,
     "--context_parallel with --pure_bf16 is not supported yet"},
    {"--context_parallel above 1", "--peft_method prefix", AFTER_CHOICES, context_parallel_with_prefix,
     "--context_parallel with --peft_method prefix is not supported yet"},
    // the CUDA trainer's (2): what its tests cover so far
    {"--context_parallel above 1", "--s2_attn 1 (train_llama2cu)", AFTER_CHOICES, context_parallel_with_s2_attn,
     "--context_parallel with --s2_attn is not supported yet by this trainer (train_llama2, the CPU trainer, has it)"},
    {"--context_parallel above 1", "--cpu_offload 1 (train_llama2cu)", AFTER_CHOICES, context_parallel_with_cpu_offload,
     "--context_parallel with --cpu_offload is not supported yet by this trainer (train_llama2, the CPU trainer, has it)"},
    // (the layer-major schedule holds one layer's carries: the context group's gathers, a prefix's rows, a shared
    // prompt's copies and sampling's cache are every layer's)
    {"--activation_offloading", "--context_parallel above 1 (train_llama2cu)", AFTER_CHOICES, activation_offloading_with_context_parallel,
     "--activation_offloading with --context_parallel is not supported yet by this trainer"},
    {"--activation_offloading", "--peft_method prefix (train_llama2cu)", AFTER_PEFT_METHOD, activation_offloading_with_prefix,
     "--activation_offloading with --peft_method prefix is not supported yet by this trainer (the prefix's positions are in every layer's carry)"},
    {"--activation_offloading", "--shared_prompt on (train_llama2cu)", AFTER_CHOICES, activation_offloading_with_shared_prompt,
     "--activation_offloading with --shared_prompt on is not supported yet by this trainer: give auto or off (auto runs the prompts twice with it)"},
    {"--activation_offloading", "--sample_prompt (train_llama2cu)", AFTER_CHOICES, activation_offloading_with_sample,
     "--activation_offloading with --sample_prompt is not supported yet by this trainer (sampling's KV cache is every layer's; the schedule holds one)"},
    {"--offload_every above 1", "no --activation_offloading", AFTER_CHOICES, offload_every_without_offloading,
     "--offload_every {offload_every} says which layers' inputs --activation_offloading keeps in host memory: give it with --activation_offloading"},
    {"--num_output_chunks", "a smaller --chunk_size", AFTER_CHOICES, output_chunks_over_chunk,
     "--num_output_chunks {num_output_chunks} is more than the {chunk_size} tokens of a chunk"},
    {"--num_output_chunks", "a smaller --max_seq_len (no --chunk_size)", AFTER_CHOICES, output_chunks_over_row,
     "--num_output_chunks {num_output_chunks} is more than the {max_seq_len} tokens of a chunk"},
    // --objective dpo and orpo (docs/preference.md)
    {"--dpo_loss_type", "--objective other than dpo", AFTER_CHOICES, dpo_loss_without_dpo,
     "--dpo_loss_type is DPO's: give it with --objective dpo"},
    {"--precompute_ref_log_probs 1", "--objective other than dpo", AFTER_CHOICES, precompute_without_dpo,
     "--precompute_ref_log_probs is DPO's (the reference's log-probabilities): give it with --objective dpo"},
    {"--beta", "--objective sft", AFTER_CHOICES, beta_without_preference,
     "--beta is DPO's beta and ORPO's lambda: give it with --objective dpo or orpo"},
    {"--objective dpo or orpo", "--batching packing", AFTER_CHOICES, preference_with_packing,
     "--objective {objective} trains each pair as two rows, the chosen and the rejected sequence: give --batching padding"},
    {"--objective dpo or orpo", "--train_on_prompt 1", AFTER_CHOICES, preference_with_train_on_prompt,
     "--train_on_prompt is SFT's: --objective {objective} scores the completions (ORPO's nll takes the chosen sequence's prompt already)"},
    {"--objective dpo or orpo", "--batch_size auto", AFTER_CHOICES, preference_with_batch_size_auto,
     "--objective {objective} with --batch_size auto is not supported yet: give --batch_size (pairs per micro-batch)"},
    {"--shared_prompt on or off", "--objective sft", AFTER_CHOICES, shared_prompt_without_preference,
     "--shared_prompt is preference tuning's (a pair's prompt): give it with --objective dpo or orpo"},
    {"--shared_prompt on", "--context_parallel above 1", AFTER_CHOICES, shared_prompt_with_context_parallel,
     "--shared_prompt on with --context_parallel is not supported (the ranks hold pieces of the rows): give auto or off"},
    // --peft_method and the options that go with it
    {"--peft_method other than lora", "--full_finetune", AFTER_PEFT_METHOD, adapter_with_full_finetune,
     "--peft_method {peft_method} trains an adapter; with --full_finetune there is none"},
    {"--lora_*, --use_rslora, --use_dora", "--peft_method ia3", AFTER_PEFT_METHOD, lora_option_with_ia3,
     "--{lora_option} is LoRA's; with --peft_method ia3 give --ia3_target_modules and --ia3_feedforward_modules"},
    {"--lora_*, --use_rslora, --use_dora", "--peft_method prefix", AFTER_PEFT_METHOD, lora_option_with_prefix,
     "--{lora_option} is LoRA's; with --peft_method prefix give --num_virtual_tokens"},
    {"--lora_*, --use_rslora, --use_dora", "--peft_method llama_adapter", AFTER_PEFT_METHOD, lora_option_with_llama_adapter,
     "--{lora_option} is LoRA's; with --peft_method llama_adapter give --adapter_len and --adapter_layers"},
    {"--shared_prompt on", "--peft_method prefix", AFTER_PEFT_METHOD, shared_prompt_with_prefix,
     "--shared_prompt on with --peft_method prefix is not supported (the prefix's virtual positions come before the prompt's): give auto or off"},
    {"--s2_attn 1", "--peft_method prefix", AFTER_PEFT_METHOD, s2_attn_with_prefix, // S2-Attn's groups are of the sequence's positions
     "--s2_attn with --peft_method prefix is not supported (shifted sparse attention's groups would cut the virtual "
     "positions off most queries)"},
    {"--export_gguf_adapter", "--peft_method ia3", AFTER_PEFT_METHOD, gguf_adapter_with_ia3, gguf_adapter_no_ia3},
    {"--ia3_feedforward_modules", "one not in --ia3_target_modules", AFTER_IA3_MODULES, ia3_feedforward_outside_targets,
     "--ia3_feedforward_modules {ia3_feedforward_modules}: must be among --ia3_target_modules {ia3_target_modules}"},
    {"--trainable_params", "--full_finetune", AFTER_TRAINABLE_PARAMS, trainable_params_with_full_finetune,
     "--trainable_params names base tensors that train beside a LoRA adapter; with --full_finetune every weight trains already"},
    // (peft allows it; the saved tensors' files and resume are LoRA's here)
    {"--trainable_params", "--peft_method other than lora", AFTER_TRAINABLE_PARAMS, trainable_params_with_adapter,
     "--trainable_params with --peft_method {peft_method} is not supported yet (only with lora)"},
    {"--trainable_params", "--export_gguf_adapter", AFTER_TRAINABLE_PARAMS, trainable_params_with_gguf_adapter,
     gguf_adapter_saved_error},
    {"--trainable_params", "--quantize", AFTER_TRAINABLE_PARAMS, trainable_params_with_quantize,
     "--trainable_params with --quantize is not supported yet (QLoRA keeps the norms in its 4-bit runs)"},
    {"--random_init", "--resume", AFTER_SHARDING, random_init_with_resume,
     "--random_init is for benchmarks, which start fresh: it does not go with --resume"},
    {"--export_hf", "no --resume", AFTER_SHARDING, export_hf_without_resume,
     "--export_hf writes a checkpoint out: give it with --resume CHECKPOINT"},
    {"--memory_limit", "--batch_size other than auto", AFTER_SHARDING, memory_limit_with_batch_size,
     "--memory_limit is what --batch_size auto fits the batch in; give --batch_size auto with it"},
    {"--batch_size auto", "no --memory_limit (train_llama2)", AFTER_SHARDING, batch_size_auto_without_limit,
     "--batch_size auto needs --memory_limit GiB with this trainer (it cannot tell what memory is free)"},
    {"--use_dora", "--full_finetune", AFTER_REQUIRED, use_dora_with_full_finetune,
     "--use_dora trains a DoRA adapter; with --full_finetune there is none"},
    {"--merge_adapter", "--full_finetune", AFTER_REQUIRED, merge_adapter_with_full_finetune,
     "--merge_adapter folds a LoRA adapter in; with --full_finetune there is none"},
    // --pure_bf16, --optimizer anyprecision and --kahan_summation, which go together as
    // llama-recipes has them (its pure_bf16 also runs AdamW on bf16 weights; here the bf16
    // weights take AnyPrecisionAdamW, whose state is bf16 too)
    {"--kahan_summation 1", "--optimizer other than anyprecision", AFTER_REQUIRED, kahan_without_anyprecision,
     "--kahan_summation is AnyPrecisionAdamW's: give it with --optimizer anyprecision"},
    {"--optimizer anyprecision", "--pure_bf16 0", AFTER_REQUIRED, anyprecision_without_pure_bf16,
     "--optimizer anyprecision steps bf16 weights with bf16 state: give it with --pure_bf16 1 (and --full_finetune)"},
    {"--pure_bf16 1", "no --full_finetune", AFTER_REQUIRED, pure_bf16_without_full_finetune,
     "--pure_bf16 keeps full fine-tuning's weights in bf16 with no fp32 copy: give it with --full_finetune"},
    {"--pure_bf16 1", "--optimizer other than anyprecision", AFTER_REQUIRED, pure_bf16_without_anyprecision,
     "--pure_bf16 has no fp32 weights for AdamW, SGD or AdamW8bit to update: give it with --optimizer anyprecision"},
    {"--pure_bf16 1", "--precision other than bf16 (train_llama2cu)", AFTER_REQUIRED, pure_bf16_without_bf16,
     "--pure_bf16 keeps the weights in bf16 on the GPU: give it with --precision bf16 (the default)"},
    {"--freeze_layers", "no --full_finetune", AFTER_REQUIRED, freeze_layers_without_full_finetune,
     "--freeze_layers freezes layers of full fine-tuning: give it with --full_finetune (LoRA trains no base weight)"},
    {"--from_peft_checkpoint", "--full_finetune", AFTER_REQUIRED, peft_checkpoint_with_full_finetune,
     "--from_peft_checkpoint and --full_finetune do not go together"},
    {"--quantize", "--full_finetune", AFTER_REQUIRED, quantize_with_full_finetune,
     "--quantize keeps the base weights frozen in 4 bits (QLoRA): it does not go with --full_finetune"},
    {"--export_gguf_adapter", "--full_finetune", AFTER_REQUIRED, gguf_adapter_with_full_finetune,
     "--export_gguf_adapter writes a LoRA adapter; with --full_finetune there is none (use --export_gguf)"},
    {"--export_gguf_adapter", "--use_dora", AFTER_REQUIRED, gguf_adapter_with_dora,
     "--export_gguf_adapter: DoRA cannot be expressed as a llama.cpp adapter (it has no place for DoRA's magnitudes); "
     "use --export_gguf for the model with the adapter merged in"},
    {"--export_gguf_adapter", "--gguf_type q4_k_m, q5_k_m or q6_k", AFTER_CHOICES, gguf_adapter_kquant,
     "--export_gguf_adapter with --gguf_type {gguf_type}: llama.cpp's k-quant mixes are for models (llama-quantize does not "
     "quantize adapters); give f32, f16, bf16 or q8_0, or use --export_gguf for the model with the adapter merged in"},
};

// The first row after step that applies, printed: -1; none: 0. opts: the option table, for
// the values a message names.
static int refuse(const TrainConfig *tc, const Option *opts, int n, int step) {
    for (size_t i = 0; i < sizeof refusals / sizeof *refusals; i++) {
        const Refusal *r = &refusals[i];
        if (r->after != step || !r->applies(tc)) continue;
        char *msg, val[PATH_MAX + 64];
        size_t len;
        FILE *f = open_memstream(&msg, &len); // (whole, then one write: ranks printing it at once do not interleave)
        if (!f) die("out of memory");
        for (const char *p = r->why; *p; p++) {
            if (*p != '{') { fputc(*p, f); continue; }
            size_t name = strcspn(++p, "}"); // {name}'s length
            const char *v = tc->lora_option;  // (the one name that is not an option's)
            for (int k = 0; k < n; k++) {
                if (strlen(opts[k].name) != name || strncmp(opts[k].name, p, name)) continue;
                option_value(&opts[k], val, sizeof val, 0);
                v = opts[k].type == OPT_STR ? *(const char *const *)opts[k].ptr : val; // (a string whole, however long)
            }
            fputs(v, f);
            p += name;
        }
        if (fclose(f) != 0) die("out of memory");
        fprintf(stderr, "error: %s\n", msg);
        free(msg);
        return -1;
    }
    return 0;
}

// the rows as docs/training.md lists them (--refusals)
static void print_refusals(void) {
    printf("| option | with | the message |\n| --- | --- | --- |\n");
    for (size_t i = 0; i < sizeof refusals / sizeof *refusals; i++)
        printf("| %s | %s | %s |\n", refusals[i].option, refusals[i].with, refusals[i].why);
}

// 0: parsed, 1: --help (or --refusals) printed, -1: error (message printed)
static int parse_args(TrainConfig *tc, int argc, char **argv) {
    Option opts[] = OPTIONS(tc);
    int n = (int)(sizeof opts / sizeof opts[0]);
    tc->lora_option = NULL;
    for (int i = 0; i < n; i++) set_option(&opts[i], opts[i].def);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) { print_help(opts, n); return 1; }
        if (strcmp(arg, "--refusals") == 0) { print_refusals(); return 1; } // (not in --help: docs/training.md lists them)
        if (strncmp(arg, "--", 2) != 0) { fprintf(stderr, "error: unexpected argument '%s' (options start with --; see --help)\n", arg); return -1; }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const Option *o = NULL;
        for (int k = 0; k < n; k++)
            if (strlen(opts[k].name) == len && strncmp(opts[k].name, name, len) == 0) o = &opts[k];
        if (!o) { fprintf(stderr, "error: unknown option '--%.*s' (see --help)\n", (int)len, name); return -1; }
        if (!strncmp(o->name, "lora_", 5) || !strcmp(o->name, "use_rslora") || !strcmp(o->name, "use_dora")) tc->lora_option = o->name;
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
        OPTION_CHOICE("objective", tc->objective, objective_names, 0) < 0 || OPTION_CHOICE("dpo_loss_type", tc->dpo_loss_type, dpo_loss_names, 0) < 0 ||
        OPTION_CHOICE("shared_prompt", tc->shared_prompt, shared_prompt_names, 0) < 0 ||
        (tc->quant_type = OPTION_CHOICE("quantize", tc->quantize, quant_type_names, 0)) < 0 ||
        OPTION_CHOICE("loss_scale", tc->loss_scale, loss_scales, 0) < 0 ||
        OPTION_CHOICE("chunk_memory", tc->chunk_memory, chunk_memories, 0) < 0 ||
        (tc->gguf_ftype = OPTION_CHOICE("gguf_type", tc->gguf_type, gguf_type_names, 0)) < 0 ||
        OPTION_CHOICE("precision", tc->precision, backend_precisions, 1) < 0 ||
        OPTION_CHOICE("collectives", tc->collectives, backend_collectives, 1) < 0 ||
        profile_parse_steps(tc->profile_steps, &tc->profile_first, &tc->profile_last) < 0)
        return -1;
    if (refuse(tc, opts, n, AFTER_CHOICES) != 0) return -1;
    static const char *const methods[] = {"lora", "ia3", "llama_adapter", "prefix"};
    unsigned mask, targets, feedforward;
    if (lora_parse_targets(tc->lora_target_modules, "--lora_target_modules", &mask) != 0 ||
        OPTION_CHOICE("peft_method", tc->peft_method, methods, 0) < 0 || refuse(tc, opts, n, AFTER_PEFT_METHOD) != 0)
        return -1;
    if (!strcmp(tc->peft_method, "ia3") && ia3_modules(tc, &targets, &feedforward) != 0) return -1;
    if (refuse(tc, opts, n, AFTER_IA3_MODULES) != 0) return -1;
    if (lora_parse_saved(tc->trainable_params, &mask, "--trainable_params") != 0 || refuse(tc, opts, n, AFTER_TRAINABLE_PARAMS) != 0)
        return -1;
    FsdpStrategy strategy;
    if (fsdp_strategy_parse(tc->sharding_strategy, &strategy) != 0 || refuse(tc, opts, n, AFTER_SHARDING) != 0) return -1;
    if (!tc->model[0]) { fprintf(stderr, "error: --model is required (see --help)\n"); return -1; }
    if (!tc->data[0]) { fprintf(stderr, "error: --data is required (see --help)\n"); return -1; }
    return refuse(tc, opts, n, AFTER_REQUIRED);
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
            if (option_quiet(&opts[i])) continue;
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
        if (option_quiet(&opts[i])) continue;
        option_value(&opts[i], val, sizeof val, 0);
        at += (size_t)snprintf(buf + at, n - at, "| %s | %s |\n", opts[i].name, val[0] ? val : "-");
    }
}

#endif
