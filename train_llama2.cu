/*
CUDA trainer for Llama-2-family models: the GPU backend of trainer.h, with the
structure and the names of train_llama2.c's CPU backend, which judges it
(test/test_llama2cu.cu runs both on the same model and batch).

Precision (docs/precision.md). --precision bf16, the default, stores the base
weights and the activations in bf16; cuBLASLt accumulates in fp32; RMSNorm
statistics, softmax, the log-sum-exp, the logits and the loss are fp32; the
trainable parameters keep fp32 masters, fp32 gradients and the optimizer's fp32
state (AdamW's moments, SGD's momentum buffer), and the optimizer's update
writes the bf16 copy the matmuls read (--cpu_offload: the masters, gradients and
state in host memory, the step on the CPU, optimizer_step_host). --precision fp16 is the same
with fp16 storage (11 significant bits, but 5 exponent bits: activations above
65504 overflow, gradients below 2^-24 vanish), for GPUs without bf16 (V100, T4),
with dynamic loss scaling (trainer.h's LossScale). --precision fp32 runs every
tensor in fp32 (true fp32, no TF32), to compare with the CPU twin tightly.
--pure_bf16 (bf16 only) has no fp32 masters: the bf16 weights are the parameters,
the step's gradient is bf16 (grad_acc) and AnyPrecisionAdamW's state bf16, rounded
as the CPU twin rounds them (grads_done, grads_bf16_end, anyprecision_step); offloaded,
the bf16 parameters (params_bf16), grad_acc and the state are the host's, the same
roundings there (grads_add_host, anyprecision_step_host).
The compute type is a template parameter, floatX (float, bf16 or __half), of
every function below; the Model holds the buffers of one of them, and the
backend's entry points pick floatX once (with_precision).

QLoRA (--quantize): each decoder layer stays on the GPU as the host packed it
into a run of bytes (model.h: its linear weights in 4 bits, quant.h, its norms in
fp32), whole or sharded as bytes over the ranks (gathered into a slot, when sharded),
and each linear weight is dequantized into d.deq in the compute type just before a
product reads it, forward and backward, one at a time (unit_dequant, weight_ready,
quant.cuh); d.weights holds the rest.

The frozen base streamed (--cpu_offload 1 with an adapter; docs/memory.md): the
decoder layers stay in pinned host memory (QLoRA's runs as the host packed them,
else each layer's unit in the compute type; sharded, this rank's shards of them)
and each is copied up on a stream of its own a layer ahead of its use, into a ring
of two (the slots; sharded, the shard ring, gathered from there into the slots), as
sharded units are gathered (unit_prefetch); d.weights holds the embedding and the
head (sharded, their shards).

Chunked training (docs/chunked.md) runs exactly as on the CPU: chunk_forward,
chunk_head and chunk_backward per chunk, the KV carry and the dKV carry, the
keep and recompute memory modes, the output head in --num_output_chunks pieces,
and --activation_checkpointing (layer_forward re-run before each layer's backward).
Whole-sequence training is the chunk C = T.

Sharding (docs/sharding.md, fsdp.h) as on the CPU: ranks launched by mpirun,
srun or torchrun, each on GPU (local rank % the node's GPUs), the trainer's
host communicators (MPI, or TCP without it) for what the host adds up, and
device copies of them for the device buffers (--collectives): NCCL where every
rank has its own GPU, else staged through host memory and the host
communicators, which sum in rank order as on the CPU (ranks sharing a GPU, a
build without NCCL, the emulated build). With a shard group of more than one rank the base weights are
this rank's shard of every unit (bf16 or fp32, as the compute type), gathered
whole into a slot when a forward or backward needs the unit; full fine-tuning
keeps fp32 masters, gradients and optimizer state for the shard only, and
reduce-scatters each unit's gradient after its backward. LoRA's gradients are
all-reduced over every rank, a shard's over its replica group, and the
gradient norm's sum of squares over the shard group. The collectives run on
their own stream, ordered against the compute stream by events: the next
layer's gather overlaps this layer's compute (unit_prefetch), the reduce-scatter
of full fine-tuning's gradients does not. Compiled, not yet run on GPUs.

The file reads as train_llama2.c does: the device Model, then the model top down
(model_forward_backward, chunk_forward, layer_forward, chunk_backward, chunk_head,
model_forward, model_next_logits), then the machinery it calls, declared ahead of it: a
linear layer and its adapter, a layer's activations and the KV carry, the micro-batch on
the device (its rows: chunk.h's, as on the CPU), each rank's GPU and device communicators
(fsdp.h's FsdpDeviceComms), the buffers' layout and allocation (model_plan, model_alloc;
--cpu_offload's host side in offload.cuh), where the weights are, context parallelism's
collectives, the gradients, the optimizer, and the backend's constants for trainer.h.

Shapes: B rows of T tokens in chunks of C, D = hidden_size, H = intermediate_size,
NH / NKV = attention / key-value heads, hd = head_dim, V = vocab_size.
*/
#define FSDP_DEVICE 1 // fsdp.h's backends for device buffers: staged, and NCCL with -DFSDP_NCCL
#include "model.h"
#include "support/optimizer.h"
#include "support/optimizer_cpu.h" // --cpu_offload's step on the host
#include "support/cuda_common.cuh"
#include "support/matmul.cuh"
#include "layers.cuh"
#include "attention.cuh"
#include "lora.cuh"
#include "peft/ia3.cuh"
#include "peft/adaption_prompt.cuh" // llama_adapter's branch
#include "peft/prefix.cuh" // prefix tuning in the KV carry: prefix_to_carry, prefix_backward
#include "peft/quant.cuh"
#include "support/profile.h" // PROF_BEGIN, PROF_END: the spans of --profile_dir, on each stream, and NVTX ranges

constexpr size_t UPLOAD_PIECE = (size_t)1 << 24; // fp32 elements upload converts at a time: a 64 MiB staging buffer

// ----------------------------------------------------------------------------
// the device model: its buffers

// A layer's slice of n elements in a per-layer activation array (Lk, n) starts
// 256-byte aligned too: cuBLASLt's plans depend on the operands' alignment, so
// a layer's products then get the same kernels whichever layer it is, with
// activation checkpointing (every layer at slice 0) or without (the same bits).
template <typename E> size_t layer_stride(size_t n) { return (n * sizeof(E) + 255) / 256 * 256 / sizeof(E); }
template <typename E> E *layer_slice(E *buf, int l, size_t n) { return buf + (size_t)l * layer_stride<E>(n); }

// one chunk's activations, kept from its forward for its backward, as on the CPU (chunk.h lists
// the members and their shapes)
template <typename floatX> struct ChunkActs { CHUNK_ACTS(floatX) };

// everything on the device that is stored in the compute type
template <typename floatX> struct Buffers {
    floatX *weights;    // base weights: whole (num_params, param_layout's order) or this rank's
                        // shard of them (units.shard_numel, fsdp.h's layout), less layers_apart; frozen
                        // (LoRA), or the trainable ones (the fp32 masters themselves, or the optimizer's bf16 copy)
    floatX **slot;      // (n_unit_slots) sharded: units gathered whole, each as big as the biggest it holds;
                        // the base streamed: the layers' ring (a layer unit, or QLoRA's run, each)
    floatX *deq;        // QLoRA: the dequantize scratch (deq_layout): a layer's linear weights one at a
                        // time (wv beside wk), and its two norms
    floatX *lora_w;     // (LoRA num_params) A and B for the matmuls (the masters, or the optimizer's bf16/fp16 copy)
    floatX *params_lo;  // (n_train) bf16/fp16: the copy of the masters the matmuls read, the optimizer writes it
                        // (in weights or lora_w; fp32, or some units frozen: NULL, weights_refresh copies)
    ChunkActs<floatX> *chunk; // (n_slots) one per chunk in keep mode, one in all in recompute mode
                        // (with activation checkpointing they share all but their resid)
    floatX *k, *v;      // (L, B, P + T, NKV*hd) the KV carry (keys after RoPE), a prefix's P positions first;
                        // context parallel: (L, B, T / P, NKV*hd), this rank's positions alone (context_rows)
    floatX *dk, *dv;    // (L, B, P + T, NKV*hd) the dKV carry: gradients for earlier positions (the same shape)
    floatX *ck, *cv;    // (B, T, NKV*hd) context parallel: one layer's keys and values gathered from the group's
                        // carries at their absolute positions (context_gather), what the attention reads
    floatX *cdk, *cdv;  // (B, T, NKV*hd) and their gradients, the attention backward's, before context_reduce
    // scratch for one chunk
    floatX *lnf;        // (B, C, D)
    floatX *dlogits;    // (ceil(B * C / num_output_chunks), V) bf16/fp16: the logits' gradient for the head's backward
    floatX *kv;         // (B, C, NKV*hd) a chunk's keys or values before they enter the carry
    floatX *dresid;     // (B, C, D); --activation_offloading: chunk j's block of dresid_seq
    floatX *dresid_seq; // (B, T, D) --activation_offloading: the whole sequence's, chunk j's (B, len, D) at B t0 D
    floatX *group_in;   // (K - 1, B, T, D) --offload_every K: the inputs of a group's layers above its first (input_block)
    floatX *dln;        // (B, C, D)
    floatX *dq, *datty; // (B, C, NH*hd)
    floatX *dgate, *dup, *dhmlp; // (B, C, H)
    floatX *lora_dh;    // (B, C, r)
    floatX *xdrop;      // (B, C, max(D, H, NH*hd)) LoRA dropout scratch
    floatX *dora_pre;   // (B, C, max(D, H, NH*hd)) DoRA and IA3 scratch
    floatX *adapter_y;  // (B, C, NH*hd) llama_adapter: o_proj's input, attention plus the prompt's branch
    floatX *adapter_dkv; // (2, NKV*hd, A) llama_adapter: the gradients of Kp and Vp, transposed
    floatX *ref;        // DPO's reference (m->reference): the trainable weights where the forward reads them, as training
                        // started: LoRA's d.lora_w (n_train), full fine-tuning's d.weights (this rank's, frozen units too)
};

// the CUDA backend's model
typedef struct {
    // trainer.h's contract: the members every backend's Model holds, described there
    HostModel host;           // fp32 weights, LoRA layout: loaded here, uploaded, saved from here
    int B, T, chunk_size;     // (context parallel: the padded rows' and the pieces': model_plan)
    int recompute;
    int activation_checkpointing;
    int s2_attn;
    int fp32, fp16;           // fp32: every tensor fp32; fp16: fp16 storage (neither: bf16)
    int pure_bf16;            // (--precision bf16): the bf16 weights are the parameters (d.weights), no fp32 masters
    int cpu_offload;          // params, grads and opt_state in host memory (below)
    const char *collectives;  // auto, nccl or host
    int dry_run;              // model_alloc counts the bytes (the memory plan), touches no GPU
    size_t weight_bytes, param_bytes, act_bytes, carry_bytes; // device memory by purpose
    uint64_t dropout_key;
    int row0;
    Fsdp *fsdp;               // (host side: MPI or TCP)
    OptimizerSettings optimizer;
    // the CUDA backend's own
    Buffers<float> f32;       // the buffers of the run's precision (the other stays empty)
    Buffers<bf16> b16;
    Buffers<__half> h16;
    // the trainable parameters, flat (LoRA's layout, or param_layout's of the units that train), fp32 in either precision
    float *params, *grads;    // (n_train) masters and gradients (--pure_bf16: no masters; grads, a micro-batch's
                              // sum over its chunks, only in chunks: pure_bf16_chunked)
    bf16 *grad_acc;           // (n_train) --pure_bf16: the step's gradients, bf16 (the optimizer's; offloaded, host memory)
    int n_runs;               // full fine-tuning: where the masters' runs lie in the base weights (host
    size_t run_first[NUM_PARAM_TENSORS], run_n[NUM_PARAM_TENSORS]; // and d.weights): model_trainable_runs
    void *opt_state[OPTIMIZER_MAX_STATES]; // optimizer_n_states of them (optimizer_state_count each): AdamW's moments,
                              // SGD's momentum buffer, AdamW8bit's codes, absmax and fp32 moments (the Optimizer's;
                              // here so the fit check counts them)
    OptimTensors opt_tensors; // AdamW8bit: the trainable tensors, whose state it lays out (model_plan)
    size_t n_train;
    uint8_t *quant_bytes;     // QLoRA: the layers' runs as the host laid them out (host.quant_bytes), or
                              // sharded this rank's shards of them (host.quant_shards)
    size_t deq_at[LAYER_TENSORS]; // where tensor j of a layer unit is dequantized in d.deq (deq_layout)
    int deq_held[LAYER_TENSORS];  // the layer unit whose tensor j is there (-1: none)
    // --cpu_offload with an adapter (trainer.h's BACKEND_BASE_OFFLOAD): the frozen decoder layers in host memory
    int base_offload;         // set by the trainer: the layers streamed up, a layer ahead, into the slots' ring
    float peak_tflops;        // set by the trainer (--peak_tflops; 0: PLAN_PEAK_TFLOPS): the compute the plan's stream is against
    uint8_t *base_host;       // (L, layer_bytes) pinned: QLoRA's runs (host.quant_bytes; sharded, host.quant_shards:
                              // registered), else each layer's unit whole in the compute type (the unit's order:
                              // tensors[j].offset; sharded, this rank's shard of it), filled at load
    cudaStream_t base_stream; // the layers' way up
    // --activation_offloading (docs/long_context.md "Activation offloading"): the micro-batch layer-major
    int activation_offloading; // set by the trainer: each layer over the whole sequence, chunk by chunk, the layers'
                              // inputs in host memory; one layer's carries, the chunk's resid four slots (layer_in)
    int offload_every;        // set by the trainer (--offload_every K): the inputs kept in host memory, layers 0, K, 2K, ...
    void *ckpt;               // (ceil(L / K) + 1, B, T, D) pinned, the compute type: those layers' inputs, and the last
                              // one's output; chunk j's block (B, len, D) at B t0 D of each (input_block)
    cudaStream_t act_stream;  // their way up and down
    cudaEvent_t act_moved[4]; // each resid slot's last copy (act_up, act_down)
    uint8_t *shard_ring[2];   // (layer_bytes each) sharded: layer u's shard copied up into shard_ring[u & 1], gathered from there
    cudaEvent_t ring_read[2]; // sharded: the last gather from each (on the collectives' stream), which its next copy up waits for
    // sharded (host.shards): the units in the slots, and full fine-tuning's gradients of a unit
    int sharded;              // the base weights are this rank's shards, over fsdp->shard
    int n_unit_slots;         // units gathered at once: 2 (reshard after the forward; tied: 3), or every unit; the base streamed: 2
    int *slot_unit;           // (n_unit_slots) host: the unit each slot holds (-1: none)
    cudaEvent_t *gathered;    // (n_unit_slots) each slot's last gather, on the collectives' stream (or its copy up, on base_stream)
    float *unit_grad[2];      // a unit's gradient whole (the embedding's, the others'): sharded, or offloaded
    int grad_open[2];         // the unit each is open for (-1: none)
    float *grad_part;         // a unit's gradient reduced to this rank's shard
    // --cpu_offload (full fine-tuning; docs/memory.md): params, grads and opt_state are host memory
    bf16 *params_bf16;        // (n_train, host) --pure_bf16 offloaded: the bf16 parameters (no params; grads only in chunks)
    float *step_pieces;       // (2, min(UPLOAD_PIECE, n_train), host) --pure_bf16 offloaded: the step's pieces of the
                              // parameters and gradients in fp32 (anyprecision_step_host, grads_bf16_all_reduce_host)
    int masters_aliased;      // params are the host model's trainable weights themselves (one run)
    uint8_t *grad_held;       // (n_units) whole: the unit's running total is on the host (its next open uploads it)
    float *grad_stage[2];     // (offload_stage_numel, pinned) sharded: reduced shards on their way to the host;
                              // --pure_bf16 whole, not in chunks: a unit's micro-batch gradient
    cudaEvent_t staged[2];    // each one's copy to the host
    int stage_next, stage_pending; // the stage the next shard takes; the one not yet added (-1: none)
    size_t pending_at, pending_n;  // sharded: where in grads that one adds, and its elements
    int pending_u;            // its unit
    bool pending_final;       // its gradient is then final (offload_step_final): the overlapped step takes it
    float *upload_stage;      // (UPLOAD_PIECE) device: fp32 on its way into the bf16/fp16 weights
    struct OffloadStep *offload_step; // the step's units stepped as their gradients are final (NULL: after the backward)
    int device_backend;       // what set_device chose for it: FSDP_BACKEND_NCCL or FSDP_BACKEND_STAGED
    FsdpDeviceComms dev;      // fsdp's communicators for device buffers (W > 1; device_comm)
    cudaStream_t comm_stream; // the collectives' stream
    cudaEvent_t computed, communicated; // orders the two streams (stream_after)
    // fp32 in either precision
    float *rope_cos, *rope_sin; // (P + T, hd/2)
    float *rstdf;             // (B, C) the final norm's statistics
    float *dora_norm;         // (L, 7, widest out) DoRA's row norms, set by each forward's first chunk
    float *adapter_kv;        // llama_adapter (adaption_prompt.cuh): Kp, Vp (2, A, NKV*hd); the backward's
    float *adapter_coef, *adapter_gz; // coefficients (2, B, C, NH, A) and gate shares (B, C, NH)
    float *logits;            // (ceil(B * C / num_output_chunks), V) one piece of a chunk's rows at a time
    double *loss_sum;         // the micro-batch's summed loss
    double *grad_norm;        // the step's gradient norm
    float *next_logits;       // (V) host: model_next_logits' result
    int *tokens;              // (B, T) the micro-batch
    int *chunk_tokens;        // (B, C)
    // what the output head runs on, chunk by chunk (chunk j's at B * t0, upload_batch): the
    int *kept;                // (B, T) chunk's rows whose position has a target (all with logits_out),
    int *targets;             // (B, T) their targets
    float *losses;            // (B, T) and their cross-entropies; 0 past each chunk's n_kept
    int *n_kept;              // (chunks, host) how many rows each chunk keeps
    int num_output_chunks;    // the output head runs in this many pieces of a chunk
    int n_slots;              // the chunks' activations: one per chunk in keep mode, one in recompute mode
    size_t slots_at, slots_bytes; // where the slots are in the activations' allocation (alloc[2]), their bytes
    void *share_room;         // keep mode: what a shared prompt's micro-batch does not fit in the slots' room (slots_place;
    size_t share_room_bytes;  // allocated at the first that needs it, beside the plan), and its bytes
    void *alloc[4];           // the four allocations behind weight_bytes .. carry_bytes
    double peak_mb;           // the most device memory seen in use (model_peak_mb)
    Rows rows;                // the micro-batch's rows while model_forward(_backward) runs them (rows_begin; chunk.h)
    // context parallelism (docs/long_context.md)
    int context_len;          // --chunk_size's C, the pieces' length (0: each row in 2P pieces: context_layout)
    int held_layer, held_group; // the layer and group whose keys and values ck, cv hold (-1: none)
    float *context_stage;     // (B, T, NKV*hd) every rank's rows in a collective: gathered (in the carry's type), or dK
                              // or dV in fp32 to reduce-scatter
    float *context_part;      // (B, T / P, NKV*hd) this rank's rows in one: the carry's to gather, or the summed fp32
    cudaStream_t stream;      // the compute stream: everything but the collectives, in order
    // preference tuning (trainer.h's contract; docs/preference.md)
    const float *loss_weights;
    double *target_losses;
    int reference;
    float *ref_params;        // (n_train) LoRA in bf16/fp16: its fp32 parameters as training started, which the forward
                              // reads beside d.lora_w (IA3's vectors, DoRA's magnitudes, the adapter's gates; in fp32
                              // d.lora_w is m->params, and d.ref holds them). model_reference_swap trades them with m->params
    int ref_taken;            // d.ref (and ref_params) hold the start (the first model_reference_swap copies it, a
                              // resume sets it: model_reference_set)
    float *kept_weights;      // (B, T) the loss weights of the rows the output head keeps (upload_batch), in kept's order;
                              // allocated at the first micro-batch that has them (B T floats, beside the plan)
    int *kept_at;             // (B, T, host) each kept row's position in the micro-batch (b T + t), for target_losses
    RowsScores rows_scores;   // context parallel: the caller's loss_weights and target_losses while the rows run padded
                              // (rows_begin to rows_end), beside the padded ones upload_batch and losses_to_host read and write
    int shared_prompt;        // (trainer.h's contract) the positions of the micro-batch's pairs that run once (rows_share)
} Model;

// the context-parallel group while a micro-batch runs this rank's pieces of the rows (m->rows.P > 1:
// rows_begin to rows_end), else NULL
static FsdpComm *context_comm(const Model *m) { return m->rows.P > 1 ? &m->fsdp->context : NULL; }

template <typename floatX> Buffers<floatX> &buffers(Model *m);
template <> Buffers<float> &buffers<float>(Model *m) { return m->f32; }
template <> Buffers<bf16> &buffers<bf16>(Model *m) { return m->b16; }
template <> Buffers<__half> &buffers<__half>(Model *m) { return m->h16; }

// calls f(type_identity<floatX>()) with the run's compute type
template <typename F> auto with_precision(const Model *m, F f) {
    return m->fp32 ? f(type_identity<float>()) : m->fp16 ? f(type_identity<__half>()) : f(type_identity<bf16>());
}

// --pure_bf16 in chunks: a micro-batch's fp32 gradient is summed over its chunks in m->grads
// (rounded into grad_acc at its end, grads_bf16_end); whole sequences need no fp32 copy: each
// unit's backward runs once a micro-batch, its gradient rounded into grad_acc as it ends (grads_done)
static bool pure_bf16_chunked(const Model *m) { return m->pure_bf16 && m->chunk_size < m->T; }

// one decoder layer's tensors (a layer unit's, P_ATTN_NORM .. P_WDOWN), wherever they are (QLoRA: a
// linear weight's place in d.deq, which weight_ready fills just before a product reads it)
template <typename E> struct LayerWeights { E *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *wgate, *wup, *wdown; };
template <typename E> LayerWeights<E> layer_weights(E *const t[LAYER_TENSORS]) {
    return LayerWeights<E>{t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]};
}

// ----------------------------------------------------------------------------
// the model, top down, as in train_llama2.c: model_forward_backward runs a micro-batch's chunks
// through chunk_forward (layer_forward for each layer), then back through chunk_head and
// chunk_backward (docs/chunked.md)

// Layer l's activations within a chunk's, as on the CPU (layer_acts; chunk.h lists the members)
template <typename floatX> struct LayerActs { LAYER_ACTS(floatX) };

// declared ahead: the model's functions below model_forward_backward,
template <typename floatX> void chunk_forward(Model *m, ChunkActs<floatX> *s, const Chunk *ch);
template <typename floatX> void layer_forward(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l);
template <typename floatX> void chunk_backward(Model *m, ChunkActs<floatX> *s, const Chunk *ch);
template <typename floatX> void chunk_embed(Model *m, floatX *x, const Chunk *ch);
template <typename floatX> void layer_kv(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l);
template <typename floatX> void layer_backward(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l);
template <typename floatX> void chunk_embedding_backward(Model *m, const Chunk *ch);
template <typename floatX> void layer_major_forward_backward(Model *m, float grad_scale, bool last);
template <typename floatX> void layers_forward(Model *m, ChunkActs<floatX> *s, int from, int to);
template <typename floatX, typename F> void chunks_over(Model *m, ChunkActs<floatX> *s, int l, int dir, F f);
template <typename floatX> floatX *dresid_block(Model *m, const Chunk *ch);
template <typename floatX> void chunk_head(Model *m, ChunkActs<floatX> *s, const Chunk *ch, float grad_scale, float *logits_out);
// and the machinery the model calls, defined after it: a base linear layer and its adapter,
template <typename floatX>
void linear_forward(Model *m, floatX *lora_h, const Chunk *ch, int layer, int t, floatX *out, const floatX *inp,
                    const floatX *w);
template <typename floatX>
void linear_backward(Model *m, const floatX *lora_h, const Chunk *ch, int layer, int t, floatX *dinp, float *dw,
                     const floatX *dout, const floatX *inp, const floatX *w);
// a layer's activations within its chunk's, the chunk's tokens, the KV carry,
template <typename floatX> LayerActs<floatX> layer_acts(const Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l);
template <typename floatX> floatX *layer_in(const Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l);
template <typename floatX> floatX *layer_out(const Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l);
template <typename E> E *carry_layer(const Model *m, E *carry, int l, size_t n);
static void chunk_tokens(int *dst, const int *tokens, const Chunk *ch, cudaStream_t stream);
template <typename E> void carry_copy(E *carry, E *x, const Chunk *ch, size_t w, int dir, cudaStream_t stream);
// the micro-batch on the device: its rows (their chunks: chunk.h's rows_chunk), targets, losses, logits,
static void rows_begin(Model *m, const int **tokens, const int **targets, int B, int T, std::vector<int> padded[2]);
static void rows_end(Model *m, const int *targets);
static int chunk_index(const Rows *r, const Chunk *ch);
static size_t chunk_rows_at(const Rows *r, const Chunk *ch);
template <typename floatX> void carry_share(Model *m, int dir);
template <typename floatX> void slots_place(Model *m, const Rows *r);
static void upload_batch(Model *m, const int *tokens, const int *targets, int B, int T, bool every_row);
static double losses_sum(Model *m, int B, int T);
static void losses_to_host(Model *m, const int *targets, int B, int T);
static void logits_to_host(float *logits_out, const float *logits, const Chunk *ch, int r0, int n, int V,
                           cudaStream_t stream);
static void grads_bf16_end(Model *m);
// where the weights are: whole, or sharded and gathered a unit at a time; QLoRA's dequantized
template <typename floatX> LayerWeights<floatX> layer_params(Model *m, int l);
template <typename floatX> void weight_ready(Model *m, int l, int t);
template <typename floatX> floatX *embed_weight(Model *m);
template <typename floatX> floatX *head_weight(Model *m);
template <typename floatX> floatX *final_norm(Model *m);
template <typename floatX> void prefetch_next(Model *m, int u, int dir);
static void units_reshard(Model *m);
// --context_parallel: the group's keys and values gathered, their gradients reduced
template <typename floatX> void context_gather(Model *m, const Chunk *ch, int l);
template <typename floatX> void context_reduce(Model *m, const Chunk *ch, int l);
// where the gradients go (with --cpu_offload to the host, and its step overlapped: offload.cuh)
static float *grad_at(Model *m, int u, int j);
static LayerWeights<float> layer_grads(Model *m, int l);
static float *saved_grad(Model *m, int k);
static void grads_done(Model *m, int u);
// --activation_offloading: the layers' inputs in host memory (support/act_offload.cuh)
template <typename floatX> void act_up(Model *m, ChunkActs<floatX> *s, int j, int l);
template <typename floatX> void act_down(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int i, int l);
static void act_wait(Model *m, int j);
static bool group_rerun(const Model *m, int l);
static void act_offload_alloc(Model *m);
static void act_offload_free(Model *m);
static void grads_add_staged(Model *m);
static void grads_host_zero(Model *m);
static bool offload_step_backward(Model *m);
static void offload_step_set_last_pass(Model *m, bool last);

// Forward and backward of one micro-batch: returns the summed cross-entropy and
// adds grad_scale * d(loss)/d(parameter) into the gradients of the trainable ones.
// Chunks run forward in order, filling the KV carry, then backward in reverse
// order with the dKV carry; in recompute mode a chunk's forward runs again just
// before its backward (the last chunk's activations are still there).
static double model_forward_backward(Model *m, const int *tokens, const int *targets, int B, int T, float grad_scale) {
    std::vector<int> padded[2];
    rows_begin(m, &tokens, &targets, B, T, padded);
    T = m->rows.T;
    upload_batch(m, tokens, targets, B, T, false);
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        Buffers<floatX> &d = buffers<floatX>(m);
        const Config *c = &m->host.config;
        const Rows *r = &m->rows;
        bool last = offload_step_backward(m); // (--cpu_offload's overlapped step: its units step in its last backward)
        if (m->activation_offloading) {
            layer_major_forward_backward<floatX>(m, grad_scale, last);
            return;
        }
        Chunk first = rows_chunk(r, 0, 1), kv = carry_rows(r, &first, host_prefix(&m->host)); // (the carries' rows)
        size_t carry = (size_t)c->n_layers * B * kv.T * c->n_kv_heads * c->head_dim;
        cudaCheck(cudaMemsetAsync(d.dk, 0, carry * sizeof(floatX), m->stream));
        cudaCheck(cudaMemsetAsync(d.dv, 0, carry * sizeof(floatX), m->stream));
        int n = r->n;
        if (r->share && !m->recompute) slots_place<floatX>(m, r);
        for (int j = 0; j < n; j++) {
            Chunk ch = rows_chunk(r, j, 1);
            chunk_forward(m, &d.chunk[m->recompute ? 0 : j], &ch);
            if (j == rows_shared_last(r)) carry_share<floatX>(m, 1);
        }
        for (int j = n - 1; j >= 0; j--) {
            Chunk ch = rows_chunk(r, j, 1);
            ChunkActs<floatX> *s = &d.chunk[m->recompute ? 0 : j];
            if (j == rows_shared_last(r)) carry_share<floatX>(m, -1);
            if (m->recompute && j < n - 1) chunk_forward(m, s, &ch);
            offload_step_set_last_pass(m, last && j == 0);
            PROF_BEGIN(m->stream, "head", -1, j, -1); // the final norm, the output projection and the loss, forward and backward
            chunk_head(m, s, &ch, grad_scale, NULL);
            PROF_END(m->stream);
            chunk_backward(m, s, &ch);
        }
        offload_step_set_last_pass(m, false);
        const LoRA *lo = &m->host.lora;
        if (host_prefix(&m->host)) // (its gradient: the dKV carry's first rows)
            prefix_backward(lora_A(lo, m->grads, 0, 0), d.dk, d.dv, c->n_layers, B, lo->prefix, T, (size_t)lo->out[LORA_K],
                            m->stream);
        if (r->share && !m->recompute) slots_place<floatX>(m, NULL);
    });
    units_reshard(m);
    grads_bf16_end(m);
    double loss = losses_sum(m, B, T);
    rows_end(m, targets);
    return loss;
}

// Forward of one chunk through every decoder layer into the activations s,
// appending the chunk's keys and values to the KV carry. The micro-batch's
// tokens are in m->tokens. Each layer's unit was prefetched while the one before
// it computed (sharded), and the next one's gather starts before it computes.
template <typename floatX> void chunk_forward(Model *m, ChunkActs<floatX> *s, const Chunk *ch) {
    Config *c = &m->host.config;
    cudaStream_t st = m->stream;
    int j = ch->t0 / m->chunk_size; // (the spans' chunk)
    const LoRA *lo = &m->host.lora;
    if (ch->t0 == 0 && host_prefix(&m->host)) { // (the prefix: one more chunk ahead of the first; the matmuls' copy)
        Buffers<floatX> &d = buffers<floatX>(m);
        prefix_to_carry(d.k, d.v, lora_A(lo, d.lora_w, 0, 0), c->n_layers, ch->B, lo->prefix, ch->T, (size_t)lo->out[LORA_K], st);
    }
    PROF_BEGIN(st, "embedding forward", -1, j, -1);
    chunk_embed(m, s->resid, ch);
    PROF_END(st);
    for (int l = 0; l < c->n_layers; l++) {
        if (l + 1 < c->n_layers) prefetch_next<floatX>(m, fsdp_layer_unit(l), 1); // (the head: when chunk_head needs it)
        PROF_BEGIN(st, "forward", l, j, -1);
        layer_forward(m, s, ch, l);
        PROF_END(st);
    }
}

// the chunk's tokens' embeddings into x (B, len, D), layer 0's unit on its way meanwhile
template <typename floatX> void chunk_embed(Model *m, floatX *x, const Chunk *ch) {
    chunk_tokens(m->chunk_tokens, m->tokens, ch, m->stream);
    floatX *embed = embed_weight<floatX>(m);
    prefetch_next<floatX>(m, 0, 1); // layer 0
    embedding_forward(x, m->chunk_tokens, embed, ch->B * ch->len, m->host.config.dim, m->stream);
}

// Decoder layer l's keys and values of one chunk into the KV carry, from its input: its
// first norm, the key and value projections and the keys' RoPE. layer_forward begins with it;
// the layer-major schedule's backward calls it alone to refill the carry (the same bits).
template <typename floatX> void layer_kv(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l) {
    Config *c = &m->host.config;
    Buffers<floatX> &d = buffers<floatX>(m);
    cudaStream_t st = m->stream;
    int N = ch->B * ch->len, NKV = c->n_kv_heads, hd = c->head_dim;
    Chunk cc = carry_chunk(ch, host_prefix(&m->host)), cr = carry_rows(&m->rows, ch, host_prefix(&m->host)); // (as layer_forward's)
    size_t KV = (size_t)NKV * hd, carry = carry_positions(&m->rows, &cr) * KV;
    LayerWeights<floatX> w = layer_params<floatX>(m, l);
    LayerActs<floatX> act = layer_acts(m, s, ch, l);
    rmsnorm_forward(act.ln1, act.rstd1, act.x, w.attn_norm, N, c->dim, c->norm_eps, st);
    linear_forward(m, act.lora_h, ch, l, LORA_K, d.kv, act.ln1, w.wk);
    rope_forward(d.kv, m->rope_cos, m->rope_sin, &cc, NKV, hd, 0, st);
    carry_copy(carry_layer(m, d.k, l, carry), d.kv, &cr, KV, 1, st);
    linear_forward(m, act.lora_h, ch, l, LORA_V, d.kv, act.ln1, w.wv);
    carry_copy(carry_layer(m, d.v, l, carry), d.kv, &cr, KV, 1, st);
}

// Forward of decoder layer l of one chunk, from its input resid[l] to resid[l + 1],
// its activations into layer_acts' place and its keys and values into the KV carry.
// chunk_backward calls it again with activation checkpointing: the same kernels on
// the same input (LoRA dropout masks hash the absolute position) give the same
// bits, the carry's rows included. The layer's unit is gathered (sharded) by the
// caller's prefetch, or here: the recompute finds it in its slot.
template <typename floatX> void layer_forward(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l) {
    Config *c = &m->host.config;
    Buffers<floatX> &d = buffers<floatX>(m);
    cudaStream_t st = m->stream;
    int N = ch->B * ch->len, D = c->dim, NH = c->n_heads, NKV = c->n_kv_heads, hd = c->head_dim;
    Chunk cc = carry_chunk(ch, host_prefix(&m->host)); // the chunk as RoPE and attention see it
    Chunk cr = carry_rows(&m->rows, ch, host_prefix(&m->host)); // and where its keys and values go in the carries
    size_t KV = (size_t)NKV * hd, ND = (size_t)N * D, carry = carry_positions(&m->rows, &cr) * KV;
    LayerWeights<floatX> w = layer_params<floatX>(m, l);
    LayerActs<floatX> act = layer_acts(m, s, ch, l);
    floatX *kc = carry_layer(m, d.k, l, carry), *vc = carry_layer(m, d.v, l, carry);
    layer_kv(m, s, ch, l);
    linear_forward(m, act.lora_h, ch, l, LORA_Q, act.q, act.ln1, w.wq);
    rope_forward(act.q, m->rope_cos, m->rope_sin, &cc, NH, hd, 0, st);
    if (context_comm(m)) context_gather<floatX>(m, ch, l), kc = d.ck, vc = d.cv; // (no prefix with it: cc is *ch)
    attention_forward(act.atty, act.lse, act.q, kc, vc, &cc, NH, NKV, hd, st);
    const floatX *o_in = act.atty; // o_proj's input: with a prompt, the attention plus its branch
    LoRA *lo = &m->host.lora;
    if (m->host.use_lora && adapter_has_prompt(lo, l)) {
        weight_ready<floatX>(m, l, LORA_K), weight_ready<floatX>(m, l, LORA_V); // (read together: places apart)
        adaption_prompt_forward(d.adapter_y, act.atty, act.q, lora_A(lo, d.lora_w, l, LORA_Q), adapter_gate(lo, m->params, l),
                                w.wk, w.wv, m->adapter_kv, N, D, NH, NKV, hd, lo->adapter_len, st);
        o_in = d.adapter_y;
    }
    linear_forward(m, act.lora_h, ch, l, LORA_O, act.mid, o_in, w.wo);
    accumulate(act.mid, act.x, ND, st);
    rmsnorm_forward(act.ln2, act.rstd2, act.mid, w.mlp_norm, N, D, c->norm_eps, st);
    linear_forward(m, act.lora_h, ch, l, LORA_GATE, act.gate, act.ln2, w.wgate);
    linear_forward(m, act.lora_h, ch, l, LORA_UP, act.up, act.ln2, w.wup);
    swiglu_forward(act.hm, act.gate, act.up, (size_t)N * c->hidden_dim, st);
    linear_forward(m, act.lora_h, ch, l, LORA_DOWN, act.out, act.hm, w.wdown);
    accumulate(act.out, act.mid, ND, st);
}

// Backward of one chunk through every decoder layer, from d.dresid (chunk_head's),
// then the embedding's. Each layer's unit is gathered for its backward and the next
// one's gather starts before it computes (sharded).
template <typename floatX> void chunk_backward(Model *m, ChunkActs<floatX> *s, const Chunk *ch) {
    int lowest = m->host.frozen_units ? m->host.frozen_units - 1 : 0; // as on the CPU: nothing below a frozen layer trains
    for (int l = m->host.config.n_layers - 1; l >= lowest; l--) {
        PROF_BEGIN(m->stream, "backward", l, ch->t0 / m->chunk_size, -1);
        layer_backward(m, s, ch, l);
        PROF_END(m->stream);
    }
    chunk_embedding_backward<floatX>(m, ch);
}

// Backward of decoder layer l of one chunk, d.dresid in place. At its attention the chunk
// adds dK, dV for every position before its end into the dKV carry; its own rows are
// complete then (later chunks ran first), so they flow on through its key and value
// projections at once. With activation checkpointing the layer first re-runs its forward
// from its input, with the unit gathered for its backward (the next one's gather overlaps both).
template <typename floatX> void layer_backward(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l) {
    Config *c = &m->host.config;
    Buffers<floatX> &d = buffers<floatX>(m);
    cudaStream_t st = m->stream;
    int N = ch->B * ch->len, D = c->dim, NH = c->n_heads, NKV = c->n_kv_heads, hd = c->head_dim;
    size_t Q = (size_t)NH * hd, KV = (size_t)NKV * hd, ND = (size_t)N * D, NHd = (size_t)N * c->hidden_dim;
    Chunk cc = carry_chunk(ch, host_prefix(&m->host)), cr = carry_rows(&m->rows, ch, host_prefix(&m->host)); // (as layer_forward's)
    size_t carry = carry_positions(&m->rows, &cr) * KV;
    int full = m->host.full_finetune, lowest = m->host.frozen_units ? m->host.frozen_units - 1 : 0;
    LayerWeights<floatX> w = layer_params<floatX>(m, l);
    if (l > lowest) prefetch_next<floatX>(m, fsdp_layer_unit(l), -1); // (the embedding's backward needs no weights)
    if (m->activation_checkpointing) layer_forward(m, s, ch, l);
    LayerWeights<float> g = {};
    if (full) g = layer_grads(m, l);
    else g.attn_norm = saved_grad(m, 1 + 2 * l), g.mlp_norm = saved_grad(m, 2 + 2 * l); // (--trainable_params norm)
    LayerActs<floatX> act = layer_acts(m, s, ch, l);
    floatX *kc = carry_layer(m, d.k, l, carry), *vc = carry_layer(m, d.v, l, carry);
    floatX *dkc = carry_layer(m, d.dk, l, carry), *dvc = carry_layer(m, d.dv, l, carry);
    floatX *ka = kc, *va = vc, *dka = dkc, *dva = dvc; // what the attention reads and adds into
    if (context_comm(m)) { // the group's keys and values again, gradients from zero (context_reduce sums them)
        context_gather<floatX>(m, ch, l);
        ka = d.ck, va = d.cv, dka = d.cdk, dva = d.cdv;
        cudaCheck(cudaMemsetAsync(d.cdk, 0, (size_t)cc.B * cc.T * KV * sizeof(floatX), st));
        cudaCheck(cudaMemsetAsync(d.cdv, 0, (size_t)cc.B * cc.T * KV * sizeof(floatX), st));
    }
    // MLP block; the residual passes dresid through unchanged
    cudaCheck(cudaMemsetAsync(d.dhmlp, 0, NHd * sizeof(floatX), st));
    linear_backward(m, act.lora_h, ch, l, LORA_DOWN, d.dhmlp, g.wdown, d.dresid, act.hm, w.wdown);
    swiglu_backward(d.dgate, d.dup, d.dhmlp, act.gate, act.up, NHd, st);
    cudaCheck(cudaMemsetAsync(d.dln, 0, ND * sizeof(floatX), st));
    linear_backward(m, act.lora_h, ch, l, LORA_GATE, d.dln, g.wgate, d.dgate, act.ln2, w.wgate);
    linear_backward(m, act.lora_h, ch, l, LORA_UP, d.dln, g.wup, d.dup, act.ln2, w.wup);
    rmsnorm_backward(d.dresid, g.mlp_norm, d.dln, act.mid, w.mlp_norm, act.rstd2, N, D, st);
    // attention block
    cudaCheck(cudaMemsetAsync(d.datty, 0, (size_t)N * Q * sizeof(floatX), st));
    linear_backward(m, act.lora_h, ch, l, LORA_O, d.datty, g.wo, d.dresid, act.atty, w.wo);
    attention_backward(d.dq, dka, dva, d.datty, act.atty, act.lse, act.q, ka, va, &cc, NH, NKV, hd, st);
    if (context_comm(m)) context_reduce<floatX>(m, ch, l);
    LoRA *lo = &m->host.lora;
    if (m->host.use_lora && adapter_has_prompt(lo, l)) { // datty is its out's gradient too
        weight_ready<floatX>(m, l, LORA_K), weight_ready<floatX>(m, l, LORA_V);
        adaption_prompt_backward(d.dq, adapter_prompt(lo, m->grads, l), adapter_gate(lo, m->grads, l), d.datty, act.q,
                                 lora_A(lo, d.lora_w, l, LORA_Q), adapter_gate(lo, m->params, l), w.wk, w.wv, m->adapter_kv,
                                 d.adapter_dkv, m->adapter_coef, m->adapter_gz, N, D, NH, NKV, hd, lo->adapter_len, st);
    }
    rope_backward(d.dq, m->rope_cos, m->rope_sin, &cc, NH, hd, st);
    cudaCheck(cudaMemsetAsync(d.dln, 0, ND * sizeof(floatX), st));
    linear_backward(m, act.lora_h, ch, l, LORA_Q, d.dln, g.wq, d.dq, act.ln1, w.wq);
    carry_copy(dkc, d.kv, &cr, KV, -1, st);
    rope_backward(d.kv, m->rope_cos, m->rope_sin, &cc, NKV, hd, st);
    linear_backward(m, act.lora_h, ch, l, LORA_K, d.dln, g.wk, d.kv, act.ln1, w.wk);
    carry_copy(dvc, d.kv, &cr, KV, -1, st);
    linear_backward(m, act.lora_h, ch, l, LORA_V, d.dln, g.wv, d.kv, act.ln1, w.wv);
    rmsnorm_backward(d.dresid, g.attn_norm, d.dln, act.x, w.attn_norm, act.rstd1, N, D, st);
    if (full) grads_done(m, fsdp_layer_unit(l));
}

// the embedding's backward of one chunk from d.dresid, when it trains
template <typename floatX> void chunk_embedding_backward(Model *m, const Chunk *ch) {
    Buffers<floatX> &d = buffers<floatX>(m);
    int full = m->host.full_finetune, frozen = m->host.frozen_units;
    float *dembed = full ? (frozen ? NULL : grad_at(m, 0, 0)) : saved_grad(m, 0); // (LoRA: --trainable_params embed)
    if (!dembed) return;
    PROF_BEGIN(m->stream, "embedding backward", -1, ch->t0 / m->chunk_size, -1);
    chunk_tokens(m->chunk_tokens, m->tokens, ch, m->stream); // a later chunk's forward replaced them (keep mode)
    embedding_backward(dembed, d.dresid, m->chunk_tokens, ch->B * ch->len, m->host.config.dim, m->stream);
    if (full) grads_done(m, 0);
    PROF_END(m->stream);
}

// train_llama2.c's chunk_head, on the device. What differs: each target's loss goes to
// m->losses (the micro-batch sums them once at its end), and the head runs on the rows
// upload_batch kept, in pieces of at most ceil(B * len / num_output_chunks) rows that
// may span sequences (the CPU's pieces are one sequence's). Left-out rows are handled by
// moving, not in place: the kept rows of lnf are gathered to the front of dresid (free
// until the norm's backward fills it), their gradients computed in lnf (not read after
// the gather) and scattered back to their rows of dln. The same rows and losses; the
// head's gradient is summed in another order. logits_out is on the host, every row kept.
template <typename floatX> void chunk_head(Model *m, ChunkActs<floatX> *s, const Chunk *ch, float grad_scale,
                                           float *logits_out) {
    Config *c = &m->host.config;
    Buffers<floatX> &d = buffers<floatX>(m);
    cudaStream_t st = m->stream;
    int N = ch->B * ch->len, D = c->dim, V = c->vocab_size, nk = m->n_kept[chunk_index(&m->rows, ch)];
    int piece = (N + m->num_output_chunks - 1) / m->num_output_chunks;
    size_t at = chunk_rows_at(&m->rows, ch); // the chunk's place in kept, targets and losses
    if (logits_out && nk != N) die("internal: chunk_head wants the logits of every row, but %d of %d are kept", nk, N);
    int hu = fsdp_head_unit(&m->host.units), full = m->host.full_finetune && grad_scale != 0.0f;
    const floatX *xL = layer_in(m, s, ch, c->n_layers);
    floatX *norm = final_norm<floatX>(m), *head = head_weight<floatX>(m);
    // tied: the head is the embedding, frozen with it (--freeze_layers). LoRA: their trained
    // copies' (--trainable_params), if any
    int full_head = full && !(c->tied && m->host.frozen_units), lora = grad_scale != 0.0f && !full;
    float *dnorm = full ? grad_at(m, hu, 0) : lora ? saved_grad(m, 1 + 2 * c->n_layers) : NULL;
    float *dhead = full_head ? grad_at(m, c->tied ? 0 : hu, c->tied ? 0 : 1) : lora && c->tied ? saved_grad(m, 0) : NULL;
    rmsnorm_forward(d.lnf, m->rstdf, xL, norm, N, D, c->norm_eps, st);
    floatX *xk = d.lnf, *dxk = d.dln; // (nk, D) the kept rows and their gradients
    if (nk < N) {
        copy_rows(d.dresid, NULL, d.lnf, m->kept + at, nk, D, st);
        xk = d.dresid;
        dxk = d.lnf;
    }
    if (grad_scale != 0.0f) cudaCheck(cudaMemsetAsync(dxk, 0, (size_t)nk * D * sizeof(floatX), st)); // matmul_backward adds
    for (int r0 = 0; r0 < nk; r0 += piece) { // kept rows r0 .. r0 + n - 1
        int n = std::min(nk - r0, piece);
        const floatX *xf = xk + (size_t)r0 * D;
        matmul_forward(m->logits, xf, head, n, D, V, 1.0f, 0, st); // (n, V) in fp32
        if (logits_out) logits_to_host(logits_out, m->logits, ch, r0, n, V, st);
        const float *weights = m->loss_weights ? m->kept_weights + at + r0 : NULL; // (preference tuning's; NULL: 1)
        crossentropy_forward_backward(m->logits, m->losses + at + r0, m->targets + at + r0, weights, n, V, grad_scale, st);
        if (grad_scale == 0.0f) continue;
        const floatX *dlogits;
        if constexpr (std::is_same<floatX, float>::value) dlogits = m->logits;
        else { convert(d.dlogits, m->logits, (size_t)n * V, st); dlogits = d.dlogits; }
        matmul_backward(dxk + (size_t)r0 * D, dhead, dlogits, xf, head, n, D, V, 1.0f, st);
    }
    if (grad_scale != 0.0f) {
        if (nk < N) { // the kept rows' gradients back to their rows; the others are zeros
            cudaCheck(cudaMemsetAsync(d.dln, 0, (size_t)N * D * sizeof(floatX), st));
            copy_rows(d.dln, m->kept + at, dxk, NULL, nk, D, st);
        }
        cudaCheck(cudaMemsetAsync(d.dresid, 0, (size_t)N * D * sizeof(floatX), st));
        rmsnorm_backward(d.dresid, dnorm, d.dln, xL, norm, m->rstdf, N, D, st);
    }
    if (full) grads_done(m, hu); // tied: the embedding's gradient stays open for the embedding's backward
}

// --activation_offloading (docs/long_context.md "Activation offloading"): the micro-batch
// layer-major. Each layer runs over the whole sequence chunk by chunk, each chunk's input up from
// where it is kept (input_block: host memory for layers 0, K, 2K, ... with --offload_every K, the
// GPU's group_in for those between) a chunk ahead (chunks_over) and its output down as the next
// one's (layers_forward), so that the GPU holds one layer's KV carry; then the head chunk by
// chunk, last first, each chunk's d(resid) kept in dresid_seq; then each layer from the top: at
// the top of a group of K below the last, the group's forward re-run from its kept input (the
// inputs inside it again in group_in; the last group's are there from the forward); its dKV
// carry zeroed, its keys and values refilled for the whole sequence (layer_kv), and each chunk's
// backward, last first (layer_backward: the forward recomputed); then the embedding's. A
// forward re-run on the same input gives the same bits, and every unit's gradient and the dKV
// carry sum the chunks in the chunk-major order (last first): the same bits as the chunks of
// model_forward_backward, which runs the same functions.
template <typename floatX> void layer_major_forward_backward(Model *m, float grad_scale, bool last) {
    const Config *c = &m->host.config;
    Buffers<floatX> &d = buffers<floatX>(m);
    ChunkActs<floatX> *s = &d.chunk[0];
    Chunk first = rows_chunk(&m->rows, 0, 1), kv = carry_rows(&m->rows, &first, 0);
    size_t carry = (size_t)kv.B * kv.T * c->n_kv_heads * c->head_dim; // (one layer's)
    int lowest = m->host.frozen_units ? m->host.frozen_units - 1 : 0, K = m->offload_every; // (as chunk_backward's)
    layers_forward(m, s, -1, c->n_layers);
    chunks_over(m, s, c->n_layers, -1, [&](const Chunk *ch, int j) {
        offload_step_set_last_pass(m, last && j == 0);
        d.dresid = dresid_block<floatX>(m, ch);
        PROF_BEGIN(m->stream, "head", -1, j, -1);
        chunk_head(m, s, ch, grad_scale, NULL);
        PROF_END(m->stream);
    });
    for (int l = c->n_layers - 1; l >= lowest; l--) {
        if (group_rerun(m, l)) layers_forward(m, s, l - (K - 1), l);
        cudaCheck(cudaMemsetAsync(d.dk, 0, carry * sizeof(floatX), m->stream));
        cudaCheck(cudaMemsetAsync(d.dv, 0, carry * sizeof(floatX), m->stream));
        chunks_over(m, s, l, 1, [&](const Chunk *ch, int j) {
            PROF_BEGIN(m->stream, "keys and values", l, j, -1);
            layer_kv(m, s, ch, l);
            PROF_END(m->stream);
        });
        chunks_over(m, s, l, -1, [&](const Chunk *ch, int j) {
            offload_step_set_last_pass(m, last && j == 0);
            d.dresid = dresid_block<floatX>(m, ch);
            PROF_BEGIN(m->stream, "backward", l, j, -1);
            layer_backward(m, s, ch, l);
            PROF_END(m->stream);
        });
    }
    for (int j = m->rows.n - 1; j >= 0; j--) {
        Chunk ch = rows_chunk(&m->rows, j, 1);
        offload_step_set_last_pass(m, last && j == 0);
        d.dresid = dresid_block<floatX>(m, &ch);
        chunk_embedding_backward<floatX>(m, &ch);
    }
    offload_step_set_last_pass(m, false);
}
// the layer-major forward of layers from .. to - 1, each over every chunk from its kept input,
// its output down as the next one's; from -1: from the embedding, chunk by chunk into layer 0's
// input (down to ckpt)
template <typename floatX> void layers_forward(Model *m, ChunkActs<floatX> *s, int from, int to) {
    int L = m->host.config.n_layers;
    for (int l = std::max(from, 0); l < to; l++) {
        bool embed = from < 0 && l == 0;
        chunks_over(m, s, embed ? -1 : l, 1, [&](const Chunk *ch, int j) {
            if (embed) {
                PROF_BEGIN(m->stream, "embedding forward", -1, j, -1);
                chunk_embed(m, layer_in(m, s, ch, 0), ch);
                PROF_END(m->stream);
                act_down(m, s, ch, 0, 0);
            }
            if (l + 1 < L) prefetch_next<floatX>(m, fsdp_layer_unit(l), 1); // (the head: when chunk_head needs it)
            PROF_BEGIN(m->stream, "forward", l, j, -1);
            layer_forward(m, s, ch, l);
            PROF_END(m->stream);
            act_down(m, s, ch, 2, l + 1);
        });
    }
}
// f(ch, j) for each chunk j of the rows, first to last (dir 1) or back (-1), its block of
// layer l's input up in its input slot (l >= 0; -1: none), the next one's copy started before it computes
template <typename floatX, typename F> void chunks_over(Model *m, ChunkActs<floatX> *s, int l, int dir, F f) {
    int n = m->rows.n, j = dir > 0 ? 0 : n - 1;
    if (l >= 0) act_up(m, s, j, l);
    for (; j >= 0 && j < n; j += dir) {
        if (l >= 0 && j + dir >= 0 && j + dir < n) act_up(m, s, j + dir, l);
        act_wait(m, j);
        Chunk ch = rows_chunk(&m->rows, j, 1);
        f(&ch, j);
    }
}
// chunk ch's block (B, len, D) of dresid_seq
template <typename floatX> floatX *dresid_block(Model *m, const Chunk *ch) {
    return buffers<floatX>(m).dresid_seq + (size_t)ch->B * ch->t0 * m->host.config.dim;
}

// The summed cross-entropy of B rows of T tokens over targets != -100 (no
// gradients: evaluation, tests). logits_out as in chunk_head. Context parallel,
// every rank of the group runs its pieces and returns the rows' sum.
static double model_forward(Model *m, const int *tokens, const int *targets, int B, int T, float *logits_out) {
    std::vector<int> padded[2];
    if (fsdp_context_size(m->fsdp) > 1 && logits_out) die("internal: model_forward's logits are not gathered over the context group");
    rows_begin(m, &tokens, &targets, B, T, padded);
    T = m->rows.T;
    upload_batch(m, tokens, targets, B, T, logits_out != NULL);
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        ChunkActs<floatX> *s = &buffers<floatX>(m).chunk[0];
        if (m->activation_offloading) { // (layer-major: the heads after every layer)
            layers_forward(m, s, -1, m->host.config.n_layers);
            chunks_over(m, s, m->host.config.n_layers, 1, [&](const Chunk *ch, int j) {
                buffers<floatX>(m).dresid = dresid_block<floatX>(m, ch); // (the head's scratch)
                PROF_BEGIN(m->stream, "head", -1, j, -1);
                chunk_head(m, s, ch, 0.0f, logits_out);
                PROF_END(m->stream);
            });
            return;
        }
        for (int j = 0; j < m->rows.n; j++) {
            Chunk ch = rows_chunk(&m->rows, j, 0);
            chunk_forward(m, s, &ch);
            PROF_BEGIN(m->stream, "head", -1, j, -1);
            chunk_head(m, s, &ch, 0.0f, logits_out);
            PROF_END(m->stream);
            if (j == rows_shared_last(&m->rows)) carry_share<floatX>(m, 1);
        }
    });
    units_reshard(m);
    double loss = losses_sum(m, B, T);
    if (m->target_losses) losses_to_host(m, targets, B, T);
    if (context_comm(m)) fsdp_all_reduce(context_comm(m), &loss, 1, FSDP_F64); // (the host's communicator)
    rows_end(m, targets);
    return loss;
}

// ----------------------------------------------------------------------------
// sampling (generate, in trainer.h): one sequence, with the KV carry as the cache

// Runs positions ch->t0 .. ch->t0 + ch->len - 1 of one sequence seq (B = 1,
// host) forward, adding their keys and values to the KV carry; returns the
// logits (V, host) of the last of them.
static float *model_next_logits(Model *m, const int *seq, const Chunk *ch) {
    const Config *c = &m->host.config;
    cudaStream_t st = m->stream;
    cudaCheck(cudaMemcpyAsync(m->tokens + ch->t0, seq + ch->t0, ch->len * sizeof(int), cudaMemcpyHostToDevice, st));
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        Buffers<floatX> &d = buffers<floatX>(m);
        chunk_forward(m, &d.chunk[0], ch);
        const floatX *x = LAYER(d.chunk[0].resid, c->n_layers, (size_t)ch->len * c->dim) + (size_t)(ch->len - 1) * c->dim;
        rmsnorm_forward(d.lnf, m->rstdf, x, final_norm<floatX>(m), 1, c->dim, c->norm_eps, st);
        matmul_forward(m->logits, d.lnf, head_weight<floatX>(m), 1, c->dim, c->vocab_size, 1.0f, 0, st);
    });
    units_reshard(m);
    cudaCheck(cudaMemcpyAsync(m->next_logits, m->logits, c->vocab_size * sizeof(float), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaStreamSynchronize(st));
    return m->next_logits;
}

// ----------------------------------------------------------------------------
// the machinery the model calls, from here to the optimizer; first a base linear layer
// and its adapter (lora.cuh)

// a base linear layer plus its LoRA adapter, if any: out (N, O) = inp (N, I) W^T + lora, N = B * len
// (IA3: the product with its input or output scaled); lora_h: the layer's LoRA A-projections (7, N, r);
// w: linear weight t of the layer (layer_params': QLoRA's dequantized here, weight_ready)
template <typename floatX>
void linear_forward(Model *m, floatX *lora_h, const Chunk *ch, int layer, int t, floatX *out, const floatX *inp,
                    const floatX *w) {
    LoRA *l = &m->host.lora;
    Buffers<floatX> &d = buffers<floatX>(m);
    int in[LORA_N_TARGETS], outd[LORA_N_TARGETS], N = ch->B * ch->len;
    bool adapted = m->host.use_lora && (l->targets & (1u << t));
    weight_ready<floatX>(m, layer, t);
    if (adapted && l->ia3) { ia3_forward(l, m->params, layer, t, out, inp, w, d.xdrop, N, m->stream); return; }
    lora_shapes(&m->host.config, in, outd);
    matmul_forward(out, inp, w, N, in[t], outd[t], 1.0f, 0, m->stream);
    if (!adapted) return;
    Chunk dc = dropout_chunk(&m->rows, ch, m->row0); // (where LoRA dropout draws its masks)
    floatX *h = lora_h + (size_t)t * N * l->r;
    if (l->use_dora) { // the norms depend on the weights alone: once per forward pass, at its first chunk
        float *norm = m->dora_norm + dora_norm_index(l, layer, t);
        if (ch->t0 < (context_comm(m) ? context_comm(m)->size * ch->len : 1)) // (context parallel: the rank's piece of group 0)
            dora_norm(l, (const floatX *)d.lora_w, m->params, layer, t, norm, w, m->stream);
        dora_forward(l, (const floatX *)d.lora_w, m->params, layer, t, out, inp, w, h, d.xdrop, d.dora_pre, norm, &dc,
                     m->dropout_key, m->stream);
    } else lora_forward(l, d.lora_w, layer, t, out, inp, h, d.xdrop, &dc, m->dropout_key, m->stream);
}
// dinp (N, I) += dout W (+ LoRA); dW += dout^T inp when training the base weights
template <typename floatX>
void linear_backward(Model *m, const floatX *lora_h, const Chunk *ch, int layer, int t, floatX *dinp, float *dw,
                     const floatX *dout, const floatX *inp, const floatX *w) {
    LoRA *l = &m->host.lora;
    Buffers<floatX> &d = buffers<floatX>(m);
    int in[LORA_N_TARGETS], outd[LORA_N_TARGETS], N = ch->B * ch->len;
    bool adapted = m->host.use_lora && (l->targets & (1u << t));
    weight_ready<floatX>(m, layer, t);
    if (adapted && l->ia3) {
        ia3_backward(l, m->params, m->grads, layer, t, dinp, dout, inp, w, d.xdrop, d.dora_pre, N, m->stream);
        return;
    }
    lora_shapes(&m->host.config, in, outd);
    matmul_backward(dinp, m->host.full_finetune ? dw : NULL, dout, inp, w, N, in[t], outd[t], 1.0f, m->stream);
    if (!adapted) return;
    Chunk dc = dropout_chunk(&m->rows, ch, m->row0); // (where LoRA dropout draws its masks)
    const floatX *h = lora_h + (size_t)t * N * l->r;
    if (l->use_dora)
        dora_backward(l, (const floatX *)d.lora_w, m->params, m->grads, layer, t, dinp, dout, inp, w, h, d.lora_dh,
                      d.xdrop, d.dora_pre, m->dora_norm + dora_norm_index(l, layer, t), &dc, m->dropout_key, m->stream);
    else lora_backward(l, d.lora_w, m->grads, layer, t, dinp, dout, inp, h, d.lora_dh, d.xdrop, &dc, m->dropout_key,
                       m->stream);
}

// ----------------------------------------------------------------------------
// a layer's activations within its chunk's, the chunk's tokens, the KV carry

template <typename floatX> LayerActs<floatX> layer_acts(const Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l) {
    const Config *c = &m->host.config;
    size_t N = (size_t)ch->B * ch->len, ND = N * c->dim, NQ = N * c->n_heads * c->head_dim, NH = N * c->hidden_dim;
    size_t r = m->host.use_lora ? m->host.lora.r : 0;
    int k = m->activation_checkpointing ? 0 : l;
    return LayerActs<floatX>{layer_in(m, s, ch, l), layer_out(m, s, ch, l), layer_slice(s->ln1, k, ND),
                             layer_slice(s->resid_mid, k, ND), layer_slice(s->ln2, k, ND), layer_slice(s->rstd1, k, N),
                             layer_slice(s->rstd2, k, N), layer_slice(s->q, k, NQ), layer_slice(s->atty, k, NQ),
                             layer_slice(s->lse, k, N * c->n_heads), layer_slice(s->gate, k, NH),
                             layer_slice(s->up, k, NH), layer_slice(s->hmlp, k, NH),
                             layer_slice(s->lora_h, k, LORA_N_TARGETS * N * r)};
}

// The chunk's input resid[l] of layer l (l = L: the last one's output), and its output
// resid[l + 1]. --activation_offloading: the chunk's resid holds four slots of (B, C, D), the
// chunks taking them in turn by the parity of j (two chunks' copies in flight: act_up,
// act_down), the inputs 0 and 1, the outputs 2 and 3, whatever the layer.
template <typename floatX> floatX *resid_slot(const Model *m, ChunkActs<floatX> *s, const Chunk *ch, int i) {
    return LAYER(s->resid, i + ch->t0 / m->rows.len % 2, (size_t)m->B * m->chunk_size * m->host.config.dim);
}
template <typename floatX> floatX *layer_in(const Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l) {
    if (m->activation_offloading) return resid_slot(m, s, ch, 0);
    return LAYER(s->resid, l, (size_t)ch->B * ch->len * m->host.config.dim);
}
template <typename floatX> floatX *layer_out(const Model *m, ChunkActs<floatX> *s, const Chunk *ch, int l) {
    if (m->activation_offloading) return resid_slot(m, s, ch, 2);
    return LAYER(s->resid, l + 1, (size_t)ch->B * ch->len * m->host.config.dim);
}
// layer l's part of a carry of n elements a layer; --activation_offloading, the one layer's it holds
template <typename E> E *carry_layer(const Model *m, E *carry, int l, size_t n) {
    return LAYER(carry, m->activation_offloading ? 0 : l, n);
}

// the chunk's tokens (B, len) out of the micro-batch's (B, T), both on the device
static void chunk_tokens(int *dst, const int *tokens, const Chunk *ch, cudaStream_t stream) {
    size_t row = ch->len * sizeof(int);
    cudaCheck(cudaMemcpy2DAsync(dst, row, tokens + ch->t0, ch->T * sizeof(int), row, ch->B, cudaMemcpyDeviceToDevice,
                                stream));
}
// positions from->t0 .. + len of src (B, from->T, w) to positions to->t0 .. + len of dst (B, to->T, w)
template <typename E> void rows_copy(E *dst, const Chunk *to, const E *src, const Chunk *from, size_t w, cudaStream_t stream) {
    size_t row = (size_t)to->len * w * sizeof(E);
    cudaCheck(cudaMemcpy2DAsync(dst + (size_t)to->t0 * w, (size_t)to->T * w * sizeof(E), src + (size_t)from->t0 * w,
                                (size_t)from->T * w * sizeof(E), row, to->B, cudaMemcpyDeviceToDevice, stream));
}
// a chunk's rows x (B, len, w) into the carry (B, T, w), or back out (dir = -1)
template <typename E> void carry_copy(E *carry, E *x, const Chunk *ch, size_t w, int dir, cudaStream_t stream) {
    Chunk packed = {ch->B, ch->len, 0, ch->len, 0, 0};
    if (dir > 0) rows_copy(carry, ch, x, &packed, w, stream);
    else rows_copy(x, &packed, carry, ch, w, stream);
}

// ----------------------------------------------------------------------------
// the micro-batch on the device: its rows, the targets its output head keeps, its losses

// The rows a forward (and backward) runs, in m->rows (chunk.h's rows_layout): B rows of tokens,
// targets (B, T). Context parallel, the rows padded to the group's layout into padded[0],
// padded[1] (rows_pad), and preference tuning's weights and target losses with them
// (rows_scores_pad): this rank runs its pieces, in step with its group (context_comm), until
// rows_end.
static void rows_begin(Model *m, const int **tokens, const int **targets, int B, int T, std::vector<int> padded[2]) {
    int P = fsdp_context_size(m->fsdp);
    m->rows = rows_layout(B, T, m->chunk_size, m->context_len, P, P > 1 ? m->fsdp->context.rank : 0,
                          m->host.config.sliding_window, m->s2_attn);
    rows_share(&m->rows, m->shared_prompt);
    if (P == 1) return;
    padded[0].resize((size_t)B * m->rows.T);
    padded[1].resize((size_t)B * m->rows.T);
    rows_pad(&m->rows, padded[0].data(), padded[1].data(), *tokens, *targets);
    *tokens = padded[0].data(), *targets = padded[1].data();
    rows_scores_pad(&m->rows, &m->loss_weights, &m->target_losses, &m->rows_scores);
    m->held_layer = m->held_group = -1;
}
// the micro-batch's end: no rows, no context group (sampling runs its own chunks of whole rows).
// Context parallel: each target's cross-entropy (losses_to_host's, targets the padded rows')
// summed over the group back into the caller's layout (rows_scores_unpad). Collective over the
// context group.
static void rows_end(Model *m, const int *targets) {
    const Rows *r = &m->rows;
    if (r->P > 1 && m->rows_scores.losses) fsdp_all_reduce(context_comm(m), m->target_losses, (size_t)r->B * r->T, FSDP_F64);
    if (r->P > 1) rows_scores_unpad(r, &m->loss_weights, &m->target_losses, &m->rows_scores, targets);
    memset(&m->rows, 0, sizeof m->rows);
}

// The chunks of the rows' positions in the order upload_batch lays out their targets (chunk_at's
// j; context parallel every piece of the rows, every rank's, whose index is its position / len),
// and where chunk ch's rows start in kept, targets and losses: a shared prompt's chunks (rows_share)
// hold the B/2 chosen rows, the later chunks all B rows.
static int rows_chunks(const Rows *r) { return r->P > 1 ? (r->T + r->len - 1) / r->len : r->n; }
static int chunk_index(const Rows *r, const Chunk *ch) {
    return ch->t0 < r->share ? ch->t0 / r->len : rows_shared_chunks(r) + (ch->t0 - r->share) / r->len;
}
static size_t chunk_rows_at(const Rows *r, const Chunk *ch) {
    return (size_t)r->B * ch->t0 - (size_t)(r->B / 2) * std::min(ch->t0, r->share);
}

// A shared prompt's keys and values (chunk.h's rows_share), as train_llama2.c's carry_share: after
// its last chunk's forward (dir > 0) copied in every layer from rows 0 .. B/2 - 1 of the KV carry
// into rows B/2 .. B - 1, which attend to them as their own; before that chunk's backward (dir < 0)
// the dK, dV those rows added at its positions summed into rows 0 .. B/2 - 1 (accumulate's add, in
// the carry's type, as every later chunk adds there), whose chunks' backward takes them on
template <typename floatX> void carry_share(Model *m, int dir) {
    const Rows *r = &m->rows;
    Buffers<floatX> &d = buffers<floatX>(m);
    const Config *c = &m->host.config;
    size_t KV = (size_t)c->n_kv_heads * c->head_dim, n = (size_t)r->share * KV, layer = (size_t)r->B * r->T * KV;
    size_t half = (size_t)r->B / 2 * r->T * KV; // rows 0 .. B/2 - 1 of a layer: the twins' start from their own
    if (r->P > 1 || r->share <= 0 || r->share >= r->T) die("internal: carry_share of %d positions in rows (%d, %d)", r->share, r->B, r->T);
    Chunk prompt = {r->B / 2, r->T, 0, r->share, 0, 0}; // the shared positions of B/2 rows of the carry
    for (int l = 0; l < c->n_layers; l++) {
        if (dir > 0) {
            rows_copy(d.k + l * layer + half, &prompt, d.k + l * layer, &prompt, KV, m->stream);
            rows_copy(d.v + l * layer + half, &prompt, d.v + l * layer, &prompt, KV, m->stream);
            continue;
        }
        for (int b = 0; b < r->B / 2; b++) {
            size_t own = l * layer + (size_t)b * r->T * KV;
            accumulate(d.dk + own, d.dk + own + half, n, m->stream);
            accumulate(d.dv + own, d.dv + own + half, n, m->stream);
        }
    }
}

// Checks a micro-batch on the host (a token outside the vocabulary would make the
// embedding read out of bounds on the device), then copies it there: its tokens,
// and for each chunk's output head (chunk_at's, of m->rows) the chunk's rows (b * len + i)
// whose position has a target (every row when every_row: logits for each position), with their
// targets (chunk_head) and, for preference tuning, their m->loss_weights (kept_weights); each
// kept row's position stays on the host (kept_at: target_losses).
static void upload_batch(Model *m, const int *tokens, const int *targets, int B, int T, bool every_row) {
    if (B > m->B || T > m->T) die("internal: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, m->B, m->T);
    int V = m->host.config.vocab_size;
    for (int i = 0; i < B * T; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) die("token id %d at position %d is outside the vocabulary (%d)", tokens[i], i, V);
        if (targets[i] >= V) die("target id %d at position %d is outside the vocabulary (%d)", targets[i], i, V);
    }
    std::vector<int> kept((size_t)B * T), kept_targets((size_t)B * T);
    std::vector<float> weights(m->loss_weights ? (size_t)B * T : 0);
    for (int j = 0; j < rows_chunks(&m->rows); j++) {
        Chunk ch = chunk_at(&m->rows, j);
        size_t at = chunk_rows_at(&m->rows, &ch);
        if (ch.B * ch.len > B * T - (int)at) die("internal: chunk %d of (%d, %d) rows past the micro-batch's targets", j, ch.B, ch.len);
        int nk = 0;
        for (int r = 0; r < B * ch.len; r++) {
            int pos = (r / ch.len) * T + ch.t0 + r % ch.len, t = targets[pos];
            if (!every_row && t < 0) continue;
            if (m->loss_weights) weights[at + nk] = m->loss_weights[pos];
            m->kept_at[at + nk] = pos, kept[at + nk] = r, kept_targets[at + nk++] = t;
        }
        m->n_kept[j] = nk;
    }
    size_t bytes = (size_t)B * T * sizeof(int);
    cudaCheck(cudaMemcpyAsync(m->tokens, tokens, bytes, cudaMemcpyHostToDevice, m->stream));
    cudaCheck(cudaMemcpyAsync(m->kept, kept.data(), bytes, cudaMemcpyHostToDevice, m->stream));
    cudaCheck(cudaMemcpyAsync(m->targets, kept_targets.data(), bytes, cudaMemcpyHostToDevice, m->stream));
    if (m->loss_weights) {
        if (!m->kept_weights) m->kept_weights = (float *)cudaMallocCheck((size_t)m->B * m->T * sizeof(float));
        cudaCheck(cudaMemcpyAsync(m->kept_weights, weights.data(), weights.size() * sizeof(float), cudaMemcpyHostToDevice, m->stream));
    }
    cudaCheck(cudaMemsetAsync(m->losses, 0, (size_t)B * T * sizeof(float), m->stream));
}

// the sum of the micro-batch's losses (each target's, chunk by chunk: chunk_head), on the host
static double losses_sum(Model *m, int B, int T) {
    double loss;
    global_sum(m->loss_sum, m->losses, (size_t)B * T, m->stream);
    cudaCheck(cudaMemcpyAsync(&loss, m->loss_sum, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    return loss;
}

// each target's loss (chunk_head's, fp32) into m->target_losses (B, T; host, double) at its position
static void losses_to_host(Model *m, const int *targets, int B, int T) {
    std::vector<float> losses((size_t)B * T);
    cudaCheck(cudaMemcpyAsync(losses.data(), m->losses, losses.size() * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    for (int j = 0; j < rows_chunks(&m->rows); j++) {
        Chunk ch = chunk_at(&m->rows, j);
        size_t at = chunk_rows_at(&m->rows, &ch);
        for (int i = 0; i < m->n_kept[j]; i++) {
            int pos = m->kept_at[at + i];
            if (targets[pos] >= 0) m->target_losses[pos] = losses[at + i];
        }
    }
}

// rows r0 .. r0 + n - 1 of a chunk's logits (n, V; device) to their positions
// in logits_out (B, T, V; host): a run of rows of one sequence per copy
static void logits_to_host(float *logits_out, const float *logits, const Chunk *ch, int r0, int n, int V,
                           cudaStream_t stream) {
    for (int r = r0; r < r0 + n;) {
        int b = r / ch->len, i = r % ch->len, rows = std::min(ch->len - i, r0 + n - r);
        size_t pos = (size_t)b * ch->T + ch->t0 + i;
        cudaCheck(cudaMemcpyAsync(logits_out + pos * V, logits + (size_t)(r - r0) * V, (size_t)rows * V * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream));
        r += rows;
    }
}

// --pure_bf16 in chunks: the micro-batch's fp32 gradient (summed over its chunks, and sharded
// over the ranks' bf16 parts: grads_done) rounded into the step's bf16 one, then zeroed for the next
static void grads_bf16_end(Model *m) {
    if (!pure_bf16_chunked(m)) return;
    if (m->cpu_offload) { // on the host, once the micro-batch's is all there
        cudaCheck(cudaStreamSynchronize(m->comm_stream));
        grads_add_staged(m);
        grads_bf16_add(m->grad_acc, m->grads, m->n_train);
        grads_host_zero(m);
        return;
    }
    grads_bf16_add(m->grad_acc, m->grads, m->n_train, m->stream);
    cudaCheck(cudaMemsetAsync(m->grads, 0, m->n_train * sizeof(float), m->stream));
}

// ----------------------------------------------------------------------------
// the ranks (docs/sharding.md): each rank's GPU, and its device buffers' collectives (fsdp.h's
// FsdpDeviceComms: NCCL or staged)

#ifdef FSDP_NCCL
static const int have_nccl = 1;
#else
static const int have_nccl = 0;
#endif

// Makes this process use its GPU, its rank on its node (as the launcher tells
// it: Open MPI, Slurm, MPICH's Hydra, torchrun; else its world rank) modulo the
// node's GPUs, and chooses how its device buffers meet the other ranks'
// (--collectives, fsdp_device_backend): before any NCCL call, since NCCL
// refuses two ranks on one device. Per rank: fsdp_device_comms_init makes the ranks agree.
static void set_device(Model *m) {
    const Fsdp *f = m->fsdp;
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"};
    int local = f->world.rank, devices;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) { local = atoi(getenv(vars[i])); break; }
    cudaCheck(cudaGetDeviceCount(&devices));
    int here = f->local_size ? f->local_size : f->world.size; // not told: every rank on this node
    char err[320];
    m->device_backend = fsdp_device_backend(m->collectives, f->world.size, here, devices, have_nccl, err, sizeof err);
    if (m->device_backend < 0) die("rank %d: %s", f->world.rank, err);
    if (local < 0) die("rank %d: its local rank is %d, not a GPU's (the launcher's environment)", f->world.rank, local);
    cudaCheck(cudaSetDevice(local % devices));
}

// c, one of the model's device communicators (m->dev), made at the first device collective
// (fsdp_device_comm)
static FsdpComm *device_comm(Model *m, FsdpComm *c) {
    return fsdp_device_comm(&m->dev, m->fsdp, m->device_backend, m->comm_stream, c);
}

// the stream waiter waits for the work enqueued on stream so far (event: one of the model's)
static void stream_after(cudaStream_t waiter, cudaStream_t stream, cudaEvent_t event) {
    cudaCheck(cudaEventRecord(event, stream));
    cudaCheck(cudaStreamWaitEvent(waiter, event, 0));
}

// ----------------------------------------------------------------------------
// building the model's buffers

// p = n elements of the layout l (support/utils.h), left as it is while l only counts.
// Device layouts start each piece 256-byte aligned (cuBLASLt and the tensor-core
// attention want aligned rows).
static Layout device_layout(void *base) { return Layout{(char *)base, 0, 256}; }
template <typename E> void place(Layout *l, E *&p, size_t n) {
    if (void *at = layout_take(l, n * sizeof(E))) p = (E *)at;
}
// an activation array of `layers` slices of n (layer_slice)
template <typename E> void place_layers(Layout *l, E *&p, size_t layers, size_t n) { place(l, p, layers * layer_stride<E>(n)); }

// the slot that holds unit u when gathered: a strategy that reshards after the
// forward has two that the units take in turn (so the next unit is gathered while
// this one computes: unit_prefetch; the head's and the last layer's differ), and a
// tied embedding, which the head reads beside the final norm's unit, a third of its
// own; else every unit has its own
// (the base streamed whole: the layers take the ring's two in turn; sharded, the slots as without it)
static int unit_slot(const Model *m, int u) {
    if (m->base_offload && !m->sharded) return u & 1;
    if (!m->fsdp->info->reshard_after_forward) return u;
    return m->host.config.tied ? (u ? 1 + (u & 1) : 0) : u & 1;
}
// whether unit u is read from a slot: sharded, every unit; the base streamed, the decoder layers
static bool unit_slotted(const Model *m, int u) {
    return m->sharded || (m->base_offload && u >= 1 && u <= m->host.config.n_layers);
}
// the base streamed: a layer's bytes up (its run, or its unit in the compute type; sharded, this rank's
// shard of either, padding included), in the ring and in base_host
static size_t layer_bytes(const Model *m) {
    const HostModel *h = &m->host;
    const FsdpUnit *layer = &h->units.units[fsdp_layer_unit(0)];
    if (h->quant_type != QUANT_NONE) return m->sharded ? layer->packed_shard : h->run_bytes;
    return (m->sharded ? layer->shard : layer->numel) * (m->fp32 ? sizeof(float) : sizeof(bf16));
}
// empties the slots (the forward-backward's end): the next use gathers again
static void units_reshard(Model *m) {
    for (int s = 0; s < m->n_unit_slots; s++) m->slot_unit[s] = -1;
}

// The sharded model's slot s, in elements of es bytes: as big as the biggest unit it holds, padding included
static size_t slot_numel(const Model *m, int s, size_t es) {
    const FsdpUnits *u = &m->host.units;
    size_t G = (size_t)m->fsdp->shard.size, need = 0;
    for (int i = 0; i < u->n_units; i++) // (a packed unit's bytes in elements)
        if (unit_slot(m, i) == s) need = std::max(need, u->units[i].packed ? ceil_div(G * u->units[i].packed_shard, es) : G * u->units[i].shard);
    return need;
}
template <typename floatX> void sharded_layout(Model *m, Buffers<floatX> &d, Layout *w) {
    for (int s = 0; s < m->n_unit_slots; s++) place(w, d.slot[s], slot_numel(m, s, sizeof(floatX)));
}
// The streamed base's ring: two of a layer's bytes, the slots (whole) or the shard ring (sharded)
template <typename floatX> void ring_layout(Model *m, Buffers<floatX> &d, Layout *w) {
    for (int s = 0; s < 2; s++) {
        if (m->sharded) place(w, m->shard_ring[s], layer_bytes(m));
        else place(w, d.slot[s], ceil_div(layer_bytes(m), sizeof(floatX)));
    }
}
// the biggest shard of a unit that trains (full fine-tuning's reduced gradient of one unit)
static size_t widest_trainable_shard(const HostModel *h) {
    size_t widest = 0;
    for (int i = h->frozen_units; i < h->units.n_units; i++) widest = std::max(widest, h->units.units[i].shard);
    return widest;
}
// the backward's gradients go into a unit's buffer (unit_grad), not straight into m->grads
static bool grads_by_unit(const Model *m) {
    return m->host.full_finetune && (m->sharded || m->cpu_offload || (m->pure_bf16 && !pure_bf16_chunked(m)));
}
// Full fine-tuning's gradient of a unit whole, where it does not go straight into
// m->grads: sharded (reduce-scattered from there into this rank's shard), or offloaded
// (to the host from there), and the reduced shard
static void unit_grad_layout(Model *m, Layout *p) {
    const FsdpUnits *u = &m->host.units;
    size_t G = m->sharded ? (size_t)m->fsdp->shard.size : 1, grad[2] = {0, 0};
    if (!grads_by_unit(m)) return;
    for (int i = m->host.frozen_units; i < u->n_units; i++) { // frozen units: no gradient
        size_t whole = m->sharded ? G * u->units[i].shard : u->units[i].numel; // (sharded: the padding too)
        grad[i != 0] = std::max(grad[i != 0], whole);
    }
    place(p, m->unit_grad[0], grad[0]);
    place(p, m->unit_grad[1], grad[1]);
    if (m->sharded) place(p, m->grad_part, widest_trainable_shard(&m->host));
}

// lays out one chunk's activations but its residuals, for Lk layers
template <typename floatX> void chunk_acts_layout(const Config *c, int B, int C, int r, int Lk, ChunkActs<floatX> *s,
                                                  Layout *a) {
    size_t N = (size_t)B * C, D = c->dim, H = c->hidden_dim, Q = (size_t)c->n_heads * c->head_dim;
    place_layers(a, s->ln1, Lk, N * D); place_layers(a, s->rstd1, Lk, N);
    place_layers(a, s->q, Lk, N * Q); place_layers(a, s->lse, Lk, N * c->n_heads); place_layers(a, s->atty, Lk, N * Q);
    place_layers(a, s->resid_mid, Lk, N * D); place_layers(a, s->ln2, Lk, N * D); place_layers(a, s->rstd2, Lk, N);
    place_layers(a, s->gate, Lk, N * H); place_layers(a, s->up, Lk, N * H); place_layers(a, s->hmlp, Lk, N * H);
    place_layers(a, s->lora_h, Lk, LORA_N_TARGETS * N * r);
}

// The chunks' slots i0 .. i1 - 1 (keep mode: one a chunk; recompute: one), each with its residuals
// and the rest for every layer; or with activation checkpointing one layer's worth of the rest, for
// the largest chunk, that all slots share (only the layer running uses it). For chunks of the
// capacity's (B, C) (r NULL), or in keep mode for the chunks of rows r, by their real sizes: a shared
// prompt's micro-batch (chunk.h's rows_share) runs chunks of B/2 rows, then of B, maybe one more
// chunk than the capacity's but no more positions (slots_place lays them out in the slots' room).
template <typename floatX> void slots_layout(Model *m, Buffers<floatX> &d, Layout *a, const Rows *r, int i0, int i1) {
    const Config *c = &m->host.config;
    size_t L = c->n_layers, lora_r = m->host.use_lora ? m->host.lora.r : 0;
    for (int i = i0; i < i1; i++) {
        Chunk ch = r ? chunk_at(r, i) : Chunk{m->B, m->T, 0, m->chunk_size, 0, 0};
        if (m->activation_checkpointing && i) d.chunk[i] = d.chunk[0];
        else if (m->activation_checkpointing) chunk_acts_layout(c, m->B, m->chunk_size, (int)lora_r, 1, &d.chunk[i], a);
        else chunk_acts_layout(c, ch.B, ch.len, (int)lora_r, (int)L, &d.chunk[i], a);
        place(a, d.chunk[i].resid, (m->activation_offloading ? 4 : L + 1) * ch.B * ch.len * c->dim); // (layer_in's slots)
    }
}

// Keep mode's slots laid out again where they are, for the chunks of rows r, or (NULL) the
// capacity's. A shared prompt's chunks take no more positions than the capacity's, but one more
// chunk starts its pieces (and each layer's slices) 256-byte aligned again: the chunks that do not
// fit the slots' room then go in share_room, allocated when a micro-batch first needs it (at most
// one chunk's slot, beside the plan, as kept_weights)
template <typename floatX> void slots_place(Model *m, const Rows *r) {
    Buffers<floatX> &d = buffers<floatX>(m);
    int n = r ? r->n : m->n_slots, fit = 0;
    if (n > m->n_slots + 1) die("internal: %d chunks for %d slots (and a shared prompt's one more)", n, m->n_slots);
    for (Layout count = device_layout(NULL); fit < n; fit++) { // the chunks that fit the room
        slots_layout(m, d, &count, r, fit, fit + 1);
        if (count.bytes > m->slots_bytes) break;
    }
    Layout room = device_layout((char *)m->alloc[2] + m->slots_at), more = device_layout(NULL);
    slots_layout(m, d, &more, r, fit, n);
    if (more.bytes > m->share_room_bytes) {
        if (m->share_room) cudaCheck(cudaFree(m->share_room));
        m->share_room = cudaMallocCheck(more.bytes), m->share_room_bytes = more.bytes;
    }
    more = device_layout((char *)m->share_room);
    slots_layout(m, d, &room, r, 0, fit);
    slots_layout(m, d, &more, r, fit, n);
}

// the base weights d.weights leaves out: the layers QLoRA keeps in runs (whole; sharded, in runs'
// shards, not in the units' shards), or the base streamed (host memory; sharded, the rank's shards of
// the layers), which param_layout and the shards' layout put between the embedding and the head unit
static size_t layers_apart(const Model *m) {
    const HostModel *h = &m->host;
    const FsdpUnit *layer = &h->units.units[fsdp_layer_unit(0)];
    if (m->sharded) return m->base_offload ? (size_t)h->config.n_layers * layer->shard : 0;
    return m->base_offload ? (size_t)h->config.n_layers * layer->numel : model_packed_numel(h);
}
// the base weights d.weights holds: whole, or this rank's shards, less the layers apart
static size_t weights_numel(const Model *m) {
    return (m->sharded ? m->host.units.shard_numel : m->host.num_params) - layers_apart(m);
}
// where tensor j of unit u (not a layer left out) is in d.weights (whole): param_layout's
// offset, less the layers left out
static size_t weight_offset(const Model *m, int u, int j) {
    size_t off = model_tensor_offset(&m->host.config, u, j);
    return u == 0 ? off : off - layers_apart(m);
}
// where unit u's shard (not a layer's streamed) is in d.weights (sharded): its shard_offset, less the
// layers apart
static size_t weight_shard_offset(const Model *m, int u) {
    return m->host.units.units[u].shard_offset - (u > m->host.config.n_layers ? layers_apart(m) : 0);
}
// where unit u's shard is in the trainable units' shards (sharded m->grads, m->params)
static size_t trainable_shard_at(const HostModel *h, int u) {
    return h->units.units[u].shard_offset - h->units.units[h->frozen_units].shard_offset;
}

// DPO's reference (m->reference): the elements of d.ref, a copy of the trainable weights where the
// forward reads them: LoRA's d.lora_w, or full fine-tuning's d.weights, the masters' copy (this
// rank's shards), or with frozen units the whole base they are runs of (as the CPU copies it whole)
static size_t model_reference_numel(const Model *m) {
    const HostModel *h = &m->host;
    if (!m->reference) return 0;
    if (h->use_lora || !h->frozen_units) return m->n_train;
    return weights_numel(m);
}

// QLoRA's dequantize scratch d.deq (its elements), and where tensor j of a layer goes in it (at[j]):
// the linear weights one at a time at 0 (each just before its product: weight_ready), but wv after
// wk, as llama_adapter's prompt reads the two together; then the two norms (fp32 in the run), in
// places of their own. Each place starts 256-byte aligned, as a device layout's pieces do.
static size_t deq_layout(const HostModel *h, size_t at[LAYER_TENSORS]) {
    const FsdpUnit *un = &h->units.units[fsdp_layer_unit(0)];
    const size_t align = 256 / sizeof(bf16); // (elements: 256 bytes in 16 bits, 512 in fp32)
    size_t end = 0;
    for (int j = 0; j < LAYER_TENSORS; j++) {
        if (!model_quantized(h, fsdp_layer_unit(0), j)) continue;
        at[j] = j == P_WV - P_ATTN_NORM ? ceil_div(un->tensors[P_WK - P_ATTN_NORM].numel, align) * align : 0;
        end = std::max(end, at[j] + un->tensors[j].numel);
    }
    for (int j = 0; j < LAYER_TENSORS; j++)
        if (!model_quantized(h, fsdp_layer_unit(0), j)) at[j] = ceil_div(end, align) * align, end = at[j] + un->tensors[j].numel;
    return end;
}

// Lays out every device buffer in four allocations: w the base weights, p the
// trainable parameters (masters, gradients, optimizer state, bf16/fp16 copy), a the
// activations and scratch, k the KV and dKV carries. Called once to count, once to place.
template <typename floatX> void model_layout(Model *m, Layout *w, Layout *p, Layout *a, Layout *k) {
    const HostModel *h = &m->host;
    const Config *c = &h->config;
    Buffers<floatX> &d = buffers<floatX>(m);
    bool fp32 = std::is_same<floatX, float>::value;
    size_t L = c->n_layers, N = (size_t)m->B * m->chunk_size, D = c->dim, H = c->hidden_dim, V = c->vocab_size;
    size_t Q = (size_t)c->n_heads * c->head_dim, KV = (size_t)c->n_kv_heads * c->head_dim;
    size_t r = h->use_lora ? h->lora.r : 0, widest = config_widest(c);
    size_t piece = (N + m->num_output_chunks - 1) / m->num_output_chunks; // the head's rows at a time
    // trainable: fp32 masters and gradients (offloaded: on the host); in bf16 (fp16), and
    // offloaded in any precision, the matmuls read a copy
    if (!m->cpu_offload) {
        if (!m->pure_bf16) place(p, m->params, m->n_train);
        if (!m->pure_bf16 || pure_bf16_chunked(m)) place(p, m->grads, m->n_train);
        if (m->pure_bf16) place(p, m->grad_acc, m->n_train);
        for (int i = 0; i < optimizer_n_states(&m->optimizer); i++) {
            size_t count, es = optimizer_state_elem(&m->optimizer, &m->opt_tensors, m->n_train, i, &count);
            if (void *at = layout_take(p, count * es)) m->opt_state[i] = at;
        }
    }
    bool all_train = h->full_finetune && !h->frozen_units; // then the weights are the masters or their copy
    if ((!fp32 || m->cpu_offload) && (all_train || h->use_lora)) place(p, d.params_lo, m->n_train);
    if ((m->cpu_offload || m->pure_bf16) && !fp32) place(p, m->upload_stage, UPLOAD_PIECE); // (pure_bf16: saves too)
    // base weights that do not all train (LoRA, --freeze_layers); trained ones are the masters or their
    // bf16/fp16 copy (model_alloc); with some frozen, the masters' values are copied into them (weights_refresh)
    if (!all_train) place(w, d.weights, weights_numel(m));
    // DPO's reference (model_reference_swap): a copy of the weights the forward reads, and LoRA's fp32 parameters
    // where those are not that copy (bf16, fp16)
    place(p, d.ref, model_reference_numel(m));
    place(p, m->ref_params, m->reference && h->use_lora && !fp32 ? m->n_train : 0);
    if (h->quant_type != QUANT_NONE) { // QLoRA: the layers' runs (sharded: this rank's shards), a weight at a time dequantized
        place(w, m->quant_bytes, m->base_offload ? 0 : model_run_bytes_held(h)); // (streamed: the ring's)
        place(w, d.deq, deq_layout(h, m->deq_at));
    }
    if (m->sharded) sharded_layout(m, d, w);
    if (m->base_offload) ring_layout(m, d, w);
    unit_grad_layout(m, p);
    // activations: the chunks' slots (slots_layout), then one chunk's scratch
    m->slots_at = a->bytes;
    slots_layout(m, d, a, NULL, 0, m->n_slots);
    m->slots_bytes = a->bytes - m->slots_at;
    place(a, d.lnf, N * D);
    if (!fp32) place(a, d.dlogits, piece * V);
    place(a, d.kv, N * KV);
    if (m->activation_offloading) place(a, d.dresid_seq, (size_t)m->B * m->T * D), d.dresid = d.dresid_seq;
    else place(a, d.dresid, N * D);
    place(a, d.group_in, m->activation_offloading ? (size_t)(m->offload_every - 1) * m->B * m->T * D : 0);
    place(a, d.dln, N * D);
    place(a, d.dq, N * Q); place(a, d.datty, N * Q);
    place(a, d.dgate, N * H); place(a, d.dup, N * H); place(a, d.dhmlp, N * H);
    place(a, d.lora_dh, N * r); place(a, d.xdrop, h->use_lora ? N * widest : 0);
    bool dora = h->use_lora && h->lora.use_dora, ia3 = h->use_lora && h->lora.ia3;
    place(a, d.dora_pre, dora || ia3 ? N * widest : 0); place(a, m->dora_norm, dora ? dora_norm_index(&h->lora, (int)L, 0) : 0);
    size_t A = h->use_lora ? h->lora.adapter_len : 0;
    place(a, d.adapter_y, A ? N * Q : 0); place(a, d.adapter_dkv, 2 * A * KV); place(a, m->adapter_kv, 2 * A * KV);
    place(a, m->adapter_coef, 2 * N * c->n_heads * A); place(a, m->adapter_gz, A ? N * c->n_heads : 0);
    place(a, m->rstdf, N); place(a, m->logits, piece * V);
    place(a, m->losses, (size_t)m->B * m->T); place(a, m->loss_sum, 1); place(a, m->grad_norm, 1);
    place(a, m->tokens, (size_t)m->B * m->T); place(a, m->chunk_tokens, N);
    place(a, m->kept, (size_t)m->B * m->T); place(a, m->targets, (size_t)m->B * m->T);
    size_t positions = host_prefix(h) + (size_t)m->T; // (a prefix's virtual positions first)
    place(a, m->rope_cos, positions * c->head_dim / 2); place(a, m->rope_sin, positions * c->head_dim / 2);
    // the carries hold the whole sequence, after a prefix's virtual positions; context parallel,
    // this rank's positions (T / P of each row), and one layer's worth of the group's gathered
    // (K, V, dK, dV at their absolute positions, and the collectives' fp32 stages: context_gather)
    int P = fsdp_context_size(m->fsdp);
    size_t carry = (m->activation_offloading ? 1 : L) * m->B * (P > 1 ? m->T / P : positions) * KV; // (carry_layer)
    size_t one = P > 1 ? m->B * positions * KV : 0;
    place(k, d.k, carry); place(k, d.v, carry); place(k, d.dk, carry); place(k, d.dv, carry);
    place(k, d.ck, one); place(k, d.cv, one); place(k, d.cdk, one); place(k, d.cdv, one);
    place(k, m->context_stage, one); place(k, m->context_part, one / P);
}

// dst (n, floatX) on the device = src (n, fp32) on the host; bf16 is converted on
// the device in pieces of UPLOAD_PIECE, so the model never needs an fp32 copy of itself there
// (stage: a device buffer of UPLOAD_PIECE floats, or NULL: one is allocated for the call);
// wait false with a stage: returns with the copies queued, src and the stage the stream's
// until it is synchronized (the overlapped offload step's uploads, beside the backward)
template <typename floatX> void upload(floatX *dst, const float *src, size_t n, cudaStream_t stream, float *stage = NULL,
                                       bool wait = true) {
    if constexpr (std::is_same<floatX, float>::value) {
        cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream));
    } else {
        size_t piece = std::min(n, UPLOAD_PIECE);
        float *buf = stage ? stage : (float *)cudaMallocCheck(piece * sizeof(float));
        for (size_t i = 0; i < n; i += piece) { // in stream order: a piece's convert runs before the next copy
            size_t k = std::min(piece, n - i);
            cudaCheck(cudaMemcpyAsync(buf, src + i, k * sizeof(float), cudaMemcpyHostToDevice, stream));
            convert(dst + i, buf, k, stream);
        }
        if (wait || !stage) cudaCheck(cudaStreamSynchronize(stream)); // (else the caller's: the stage's next user waits)
        if (!stage) cudaCheck(cudaFree(buf));
    }
}

// dst (n, fp32) on the host = src (n, bf16 or fp16) on the device, upload's way back: converted on
// the device in pieces of UPLOAD_PIECE through stage (a device buffer of that many floats, or
// NULL: one is allocated for the call)
template <typename floatX> void download(float *dst, const floatX *src, size_t n, cudaStream_t stream, float *stage) {
    float *buf = stage ? stage : (float *)cudaMallocCheck(std::min(n, UPLOAD_PIECE) * sizeof(float));
    for (size_t i = 0; i < n; i += UPLOAD_PIECE) {
        size_t k = std::min(UPLOAD_PIECE, n - i);
        convert(buf, src + i, k, stream);
        cudaCheck(cudaMemcpyAsync(dst + i, buf, k * sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream)); // (the stage takes the next piece)
    }
    if (!stage) cudaCheck(cudaFree(buf));
}

// Before the model's buffers are allocated (the cuBLASLt workspace already is):
// does the run (model_plan's bytes, and bf16's upload staging) fit? If not, say
// what it needs, by purpose, against what is free, and what to change.
static void check_fits(const Model *m) {
    size_t free_bytes, total_bytes, w = m->weight_bytes, p = m->param_bytes, a = m->act_bytes, k = m->carry_bytes;
    size_t stage = m->fp32 ? 0 : UPLOAD_PIECE * sizeof(float);
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    size_t need = w + p + a + k + stage;
    if (need <= free_bytes) return;
    const double MiB = 1048576.0;
    fprintf(stderr, "error: out of GPU memory: this run needs %.1f MiB but %.1f of %.1f MiB are free:\n"
            "  base weights (%s) %.1f MiB, trainable parameters and gradients %.1f MiB,\n"
            "  activations and scratch %.1f MiB (B = %d, chunks of %d, %s%s), KV and dKV carry %.1f MiB (T = %d),\n"
            "  staging the upload %.1f MiB\n"
            "  hint: %s\n", need / MiB, free_bytes / MiB, total_bytes / MiB, m->fp32 ? "fp32" : m->fp16 ? "fp16" : "bf16", w / MiB,
            p / MiB, a / MiB, m->B, m->chunk_size, m->recompute ? "recompute" : "keep",
            m->activation_checkpointing ? ", activation checkpointing" : "", k / MiB, m->T, stage / MiB,
            cuda_error_hint(cudaErrorMemoryAllocation));
    exit(EXIT_FAILURE);
}

// Whether a GPU of compute capability major.minor (named gpu) runs --precision:
// bf16 needs 8.0 (Ampere) or newer, for cuBLASLt's bf16 products and the bf16
// tensor cores; Volta (7.0, V100) and Turing (7.5, T4) have fp16 tensor cores
// only. 0 if it does, else -1 with the reason in msg (n bytes).
static int precision_supported(const char *precision, int major, int minor, const char *gpu, char *msg, size_t n) {
    if (strcmp(precision, "bf16") != 0 || major >= 8) return 0;
    snprintf(msg, n, "--precision bf16 needs a GPU of compute capability 8.0 or newer (Ampere: A100, A10, RTX 30xx, or "
             "later); this one, %s, is %d.%d, without bf16: use --precision fp16 (with dynamic loss scaling) or fp32",
             gpu, major, minor);
    return -1;
}

// stops with precision_supported's reason when this process's GPU cannot run --precision
static void check_precision(const Model *m, const char *precision) {
    int dev;
    cudaDeviceProp prop;
    char msg[512];
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    if (precision_supported(precision, prop.major, prop.minor, prop.name, msg, sizeof msg) != 0)
        die("rank %d: %s", m->fsdp ? m->fsdp->world.rank : 0, msg);
}

// The memory plan, on the host alone: the capacity, the slots and chunks, and
// the bytes of the four allocations (model_layout's counting pass). It makes
// no CUDA call, so --dry_run, which stops here, runs without a GPU.
static void model_plan(Model *m, int B, int T, int C, int recompute, int num_output_chunks) {
    const HostModel *h = &m->host;
    int P = fsdp_context_size(m->fsdp);
    Rows longest = rows_capacity(B, T, C, P, &m->context_len);
    int pieces = longest.n;
    T = longest.T, C = longest.len;
    m->B = B; m->T = T; m->chunk_size = C; m->recompute = recompute; m->num_output_chunks = num_output_chunks;
    if (m->activation_offloading) m->recompute = 1; // (one chunk's activations at a time: any --chunk_memory)
    m->n_slots = m->recompute ? 1 : pieces;
    if (m->activation_offloading) m->activation_checkpointing = 1; // (the layer-major schedule's backward recomputes)
    if (m->activation_offloading && h->config.tied && (h->full_finetune ? !h->frozen_units : lora_saved_at(&h->lora, 0) >= 0))
        die("--activation_offloading with a tied embedding that trains is not supported yet (the head's and the embedding's "
            "gradients would sum in another order than without it): freeze it (--freeze_layers, or leave embed out of "
            "--trainable_params), or train without --activation_offloading");
    m->sharded = host_sharded(h);
    m->n_train = h->use_lora ? h->lora.num_params : model_trainable_numel(h);
    m->n_runs = h->full_finetune ? model_trainable_runs(h, m->run_first, m->run_n) : 0;
    model_optim_tensors(h, &m->optimizer, m->sharded ? m->fsdp->shard.rank : -1, &m->opt_tensors);
    if (m->sharded) m->n_unit_slots = m->fsdp->info->reshard_after_forward ? (h->config.tied ? 3 : 2) : h->units.n_units;
    if (m->base_offload && !m->sharded) m->n_unit_slots = 2;
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        Buffers<floatX> &d = buffers<floatX>(m);
        free(d.chunk); // a plan before (--batch_size auto tries several)
        free(d.slot);
        d.chunk = (ChunkActs<floatX> *)callocCheck(m->n_slots + 1, sizeof(ChunkActs<floatX>)); // (+ 1: slots_place's shared prompt)
        d.slot = (floatX **)callocCheck(m->n_unit_slots + 1, sizeof(floatX *)); // + 1: not empty when whole
        Layout lay[4]; // weights, trainable, activations, carry
        for (Layout &l : lay) l = device_layout(NULL);
        model_layout<floatX>(m, &lay[0], &lay[1], &lay[2], &lay[3]);
        m->weight_bytes = lay[0].bytes; m->param_bytes = lay[1].bytes; m->act_bytes = lay[2].bytes; m->carry_bytes = lay[3].bytes;
    });
}

// Full fine-tuning's masters from the host model's trainable weights (its runs), and back;
// offloaded, a host copy (none when they are those weights: masters_aliased); --pure_bf16,
// the bf16 weights themselves, which are the parameters (exact both ways: bf16 values)
static void masters_upload(Model *m) {
    const float *base = m->sharded ? m->host.shards : m->host.params;
    for (int r = 0; r < m->n_runs && m->pure_bf16; r++)
        upload(m->b16.weights + m->run_first[r], base + m->run_first[r], m->run_n[r], m->stream, m->upload_stage);
    if (m->pure_bf16) return;
    size_t off = 0; // (a 7B model's runs pass 2^31 elements)
    for (int r = 0; r < m->n_runs && !m->masters_aliased; off += m->run_n[r++]) {
        if (m->cpu_offload) memcpy(m->params + off, base + m->run_first[r], m->run_n[r] * sizeof(float));
        else upload(m->params + off, base + m->run_first[r], m->run_n[r], m->stream);
    }
}
static void masters_download(Model *m) {
    float *base = m->sharded ? m->host.shards : m->host.params;
    for (int r = 0; r < m->n_runs && m->pure_bf16; r++)
        download(base + m->run_first[r], m->b16.weights + m->run_first[r], m->run_n[r], m->stream, m->upload_stage);
    if (m->pure_bf16) return;
    size_t off = 0;
    for (int r = 0; r < m->n_runs && !m->masters_aliased; off += m->run_n[r++]) {
        if (m->cpu_offload) memcpy(base + m->run_first[r], m->params + off, m->run_n[r] * sizeof(float));
        else cudaCheck(cudaMemcpyAsync(base + m->run_first[r], m->params + off, m->run_n[r] * sizeof(float), cudaMemcpyDeviceToHost,
                                       m->stream));
    }
}
// --freeze_layers: the weights the matmuls read get the masters' new values (run by run; the
// frozen ones stay as uploaded). Without frozen units they are the masters or adamw's bf16 copy
// (offloaded: weights_upload).
static void weights_refresh(Model *m) {
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        floatX *w = buffers<floatX>(m).weights;
        size_t off = 0; // (a 7B model's runs pass 2^31 elements)
        for (int r = 0; r < m->n_runs; off += m->run_n[r++]) {
            if (m->cpu_offload) upload(w + m->run_first[r], m->params + off, m->run_n[r], m->stream, m->upload_stage);
            else convert(w + m->run_first[r], m->params + off, m->run_n[r], m->stream);
        }
    });
}
// --pure_bf16 offloaded: the host's bf16 parameters (flat over the runs) and the GPU's bf16
// weights, run by run, as they are (no conversion): up after a step (weights_upload), down once
// the weights are there (model_alloc, a resume's optimizer_sync_device)
static void params_bf16_copy(Model *m, cudaMemcpyKind kind) {
    size_t off = 0;
    for (int r = 0; r < m->n_runs; off += m->run_n[r++]) {
        bf16 *dev = m->b16.weights + m->run_first[r], *host = m->params_bf16 + off;
        bool up = kind == cudaMemcpyHostToDevice;
        cudaCheck(cudaMemcpyAsync(up ? dev : host, up ? host : dev, m->run_n[r] * sizeof(bf16), kind, m->stream));
    }
}
// --cpu_offload: the weights the matmuls read get the masters' new values from the host
static void weights_upload(Model *m) {
    if (m->pure_bf16) { params_bf16_copy(m, cudaMemcpyHostToDevice); return; }
    if (m->host.frozen_units) { weights_refresh(m); return; }
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        upload(buffers<floatX>(m).params_lo, m->params, m->n_train, m->stream, m->upload_stage);
    });
}

// the reference taken (once): the weights the forward reads as they are now into d.ref, and
// LoRA's fp32 parameters into ref_params (bf16, fp16)
static void reference_take(Model *m) {
    if (m->ref_taken) return;
    bool lora = m->host.use_lora;
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        Buffers<floatX> &d = buffers<floatX>(m);
        cudaCheck(cudaMemcpyAsync(d.ref, lora ? d.lora_w : d.weights, model_reference_numel(m) * sizeof(floatX),
                                  cudaMemcpyDeviceToDevice, m->stream));
        if (lora && !std::is_same<floatX, float>::value)
            cudaCheck(cudaMemcpyAsync(m->ref_params, m->params, m->n_train * sizeof(float), cudaMemcpyDeviceToDevice, m->stream));
    });
    m->ref_taken = 1;
}
// Trades the reference's weights with the trained ones where the forward reads them (trainer.h's
// contract): the pointers d.lora_w or d.weights and d.ref, and LoRA's m->params and ref_params (the
// fp32 parameters IA3, DoRA and llama_adapter read beside their compute-type copy; in fp32 they are
// d.lora_w itself). The gathered units (sharded) then hold neither; what else the forward derives
// from the weights it derives again each forward (DoRA's norms, llama_adapter's prompt keys and
// values) or from frozen ones (QLoRA's dequantized layer). The first call copies them: it comes
// before the first optimizer step, after the policy's first forward (as the CPU's).
static void model_reference_swap(Model *m) {
    bool lora = m->host.use_lora;
    reference_take(m);
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        Buffers<floatX> &d = buffers<floatX>(m);
        floatX *&at = lora ? d.lora_w : d.weights;
        std::swap(at, d.ref);
        if constexpr (std::is_same<floatX, float>::value) { if (lora) m->params = at; }
        else if (lora) std::swap(m->params, m->ref_params);
    });
    if (m->sharded) units_reshard(m);
}
// Elements [first, first + count) of the reference in fp32 on the host, out and in (trainer.h's
// contract: a checkpoint's reference.safetensors), exactly: LoRA's fp32 parameters (ref_params;
// in fp32 d.ref), or full fine-tuning's d.ref in the compute type (bf16 and fp16 values are fp32
// values). set fills d.ref as model_alloc fills d.lora_w, converted from LoRA's fp32 parameters.
// Done when they return (the host buffer takes the next piece).
static int model_reference_get(Model *m, size_t first, size_t count, float *dst) {
    reference_take(m);
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        const floatX *ref = buffers<floatX>(m).ref + first;
        if constexpr (std::is_same<floatX, float>::value)
            cudaCheck(cudaMemcpyAsync(dst, ref, count * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
        else if (m->host.use_lora)
            cudaCheck(cudaMemcpyAsync(dst, m->ref_params + first, count * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
        else download(dst, ref, count, m->stream, m->upload_stage);
    });
    cudaCheck(cudaStreamSynchronize(m->stream));
    return 0;
}
static void model_reference_set(Model *m, size_t first, size_t count, const float *src) {
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        floatX *ref = buffers<floatX>(m).ref + first;
        if (!std::is_same<floatX, float>::value && m->host.use_lora) {
            cudaCheck(cudaMemcpyAsync(m->ref_params + first, src, count * sizeof(float), cudaMemcpyHostToDevice, m->stream));
            convert(ref, m->ref_params + first, count, m->stream);
        } else upload(ref, src, count, m->stream, m->upload_stage);
    });
    cudaCheck(cudaStreamSynchronize(m->stream));
    m->ref_taken = 1;
}

// --batch_size auto: what the memory plan may take on this rank's GPU: its free memory
// less a reserve for what the plan does not count (the CUDA context's growth, cuBLASLt's
// workspace, bf16's upload staging, NCCL's buffers, fragmentation): 5% of the GPU, at
// least 1 GiB; and no more than --memory_limit when given (a dry run: that alone).
static const int backend_measures_free_memory = 1;
static const int backend_streams_base = 1; // LoRA's base goes from the files to the GPU a piece at a time
static double model_memory_budget(Model *m, double limit) {
    if (m->dry_run && limit > 0) return limit; // a dry run touches no GPU: the limit alone
    if (m->fsdp && m->fsdp->world.size > 1) set_device(m); // this rank's GPU (model_alloc sets it again)
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    double budget = free_bytes - std::max(1073741824.0, 0.05 * total_bytes);
    return limit > 0 ? std::min(limit, budget) : budget;
}

// --cpu_offload's host side: what it keeps in host memory (offload_alloc), the gradients' way
// there and back, and its step overlapped with the backward
#include "offload.cuh"

// a piece of a frozen base weight from the host (model_stream_base) into its place in d.weights
// (the base streamed: a layer's into base_host, converted on the way through the ring's first slot, as
// they would be in d.weights)
template <typename floatX> void weights_put(void *ctx, int u, int j, size_t first, size_t count, const float *src) {
    Model *m = (Model *)ctx;
    if (unit_slotted(m, u)) {
        size_t at = m->host.units.units[u].tensors[j].offset + first;
        floatX *slot = buffers<floatX>(m).slot[0] + at, *dst = (floatX *)(m->base_host + (u - 1) * layer_bytes(m)) + at;
        upload(slot, src, count, m->stream, m->upload_stage);
        cudaCheck(cudaMemcpyAsync(dst, slot, count * sizeof(floatX), cudaMemcpyDeviceToHost, m->stream));
    } else upload(buffers<floatX>(m).weights + weight_offset(m, u, j) + first, src, count, m->stream, m->upload_stage);
    cudaCheck(cudaStreamSynchronize(m->stream)); // (src is the next piece's buffer)
}
// the base streamed, sharded: each layer's shard (host.shards) into base_host, converted on the way
// through the shard ring's first buffer, as the resident path's upload converts it into d.weights
template <typename floatX> void layer_shards_put(Model *m) {
    const HostModel *h = &m->host;
    for (int l = 0; l < h->config.n_layers; l++) {
        const FsdpUnit *un = &h->units.units[fsdp_layer_unit(l)];
        upload((floatX *)m->shard_ring[0], h->shards + un->shard_offset, un->shard, m->stream);
        cudaCheck(cudaMemcpyAsync(m->base_host + (size_t)l * layer_bytes(m), m->shard_ring[0], layer_bytes(m), cudaMemcpyDeviceToHost, m->stream));
    }
}
// the part of tensor j of unit u this rank holds (model_tensor_part), at *at of d.weights too
// (weight_offset's, a streamed base being no QLoRA's)
static size_t base_part(const Model *m, int u, int j, size_t *first, size_t *at) {
    return model_tensor_part(&m->host, u, j, m->sharded ? m->fsdp->shard.rank : 0, first, at);
}
// where element x of the base weights this rank holds lies in the masters (their runs one
// after another: model_tensor_offset_from's layout, or the trainable units' shards), SIZE_MAX
// where no run holds it (a frozen unit's)
static size_t masters_offset(const Model *m, size_t x) {
    size_t off = 0;
    for (int r = 0; r < m->n_runs; off += m->run_n[r++])
        if (x - m->run_first[r] < m->run_n[r]) return off + (x - m->run_first[r]);
    return SIZE_MAX;
}
// Full fine-tuning's base streamed, a piece at a time (elements [x, x + count) of the base
// weights this rank holds, of one unit: so in one run or none): a unit that trains into its
// masters, and into the weights the matmuls read where those are not the masters' copy made
// after (--freeze_layers), or are the parameters (--pure_bf16, rounded to bf16 as they go up, as
// model_round_bf16 rounds)
template <typename floatX> void masters_put_at(Model *m, size_t x, size_t count, const float *src) {
    size_t at = masters_offset(m, x);
    if (!m->pure_bf16 && at != SIZE_MAX) upload(m->params + at, src, count, m->stream);
    if (m->pure_bf16 || m->host.frozen_units) upload(buffers<floatX>(m).weights + x, src, count, m->stream, m->upload_stage);
    cudaCheck(cudaStreamSynchronize(m->stream)); // (src is the next piece's buffer)
}
// ... from the files (model_stream_base), by tensor
template <typename floatX> void masters_put(void *ctx, int u, int j, size_t first, size_t count, const float *src) {
    Model *m = (Model *)ctx;
    size_t lo, at;
    base_part(m, u, j, &lo, &at);
    masters_put_at<floatX>(m, at + (first - lo), count, src);
}
// ... from a sharded checkpoint's "params" (host.shards_put), in the rank's flat shard layout
template <typename floatX> void shards_put(void *ctx, size_t first, size_t count, const void *src) {
    masters_put_at<floatX>((Model *)ctx, first, count, (const float *)src);
}
// ... and back, for a save: the masters, or --pure_bf16's bf16 weights, widened
static void masters_get_at(Model *m, size_t x, size_t count, float *dst) {
    if (m->pure_bf16) download(dst, m->b16.weights + x, count, m->stream, m->upload_stage);
    else cudaCheck(cudaMemcpyAsync(dst, m->params + masters_offset(m, x), count * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
}
// ... by tensor (host.weights_get), a frozen unit's from the files it came from (model_base_read:
// the GPU has them in bf16 alone)
static int masters_get(void *ctx, int u, int j, size_t first, size_t count, float *dst) {
    Model *m = (Model *)ctx;
    const HostModel *h = &m->host;
    if (u < h->frozen_units && !m->pure_bf16) return model_base_read(h, u, j, first, count, dst);
    size_t lo, at;
    base_part(m, u, j, &lo, &at);
    masters_get_at(m, at + (first - lo), count, dst);
    return 0;
}
// ... sharded, in the rank's flat shard layout (host.shards_get: a sharded checkpoint's "params",
// the final save's gather; the units frozen with --freeze_layers are not streamed sharded but
// with --pure_bf16, whose bf16 weights hold them exactly)
static int shards_get(void *ctx, size_t first, size_t count, void *dst) {
    masters_get_at((Model *)ctx, first, count, (float *)dst);
    return 0;
}
// ... and whether those of the units that train are all finite (host.weights_finite), without
// the copy: each tensor's (this rank's part of it) sum in double where it lies (as
// optimizer_state_finite checks the state)
static int masters_finite(void *ctx) {
    Model *m = (Model *)ctx;
    const HostModel *h = &m->host;
    int finite = 1;
    for (int u = h->frozen_units; u < h->units.n_units && finite; u++)
        for (int j = 0; j < h->units.units[u].n_tensors && finite; j++) {
            size_t lo, at, n = base_part(m, u, j, &lo, &at);
            double sum;
            if (!n) continue;
            if (m->pure_bf16) global_sum(m->grad_norm, m->b16.weights + at, n, m->stream);
            else global_sum(m->grad_norm, m->params + masters_offset(m, at), n, m->stream);
            cudaCheck(cudaMemcpyAsync(&sum, m->grad_norm, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
            cudaCheck(cudaStreamSynchronize(m->stream));
            finite = isfinite(sum) != 0;
        }
    return finite;
}

// Device buffers for micro-batches of up to B rows of T tokens, run in chunks of
// C positions (C = 0: T), and the host model (loaded by model_setup) uploaded.
// A dry run stops after the plan.
static void model_alloc(Model *m, int B, int T, int C, int recompute, int num_output_chunks) {
    HostModel *h = &m->host;
    const Config *c = &h->config;
    model_plan(m, B, T, C, recompute, num_output_chunks);
    size_t n_base = m->sharded ? h->units.shard_numel : h->num_params; // the base weights this rank holds
    const float *base = m->sharded ? h->shards : h->params;
    if (m->dry_run) return;
    if (m->fsdp && m->fsdp->world.size > 1) set_device(m); // before any allocation
    check_precision(m, m->fp32 ? "fp32" : m->fp16 ? "fp16" : "bf16");
    cudaCheck(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&m->comm_stream, cudaStreamNonBlocking));
    profile_track(m->stream, "compute stream");
    profile_track(m->comm_stream, "collectives stream");
    cudaCheck(cudaEventCreateWithFlags(&m->computed, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&m->communicated, cudaEventDisableTiming));
    if (m->base_offload) {
        cudaCheck(cudaStreamCreateWithFlags(&m->base_stream, cudaStreamNonBlocking));
        profile_track(m->base_stream, "base stream");
    }
    if (m->sharded || m->base_offload) {
        m->slot_unit = (int *)mallocCheck(m->n_unit_slots * sizeof(int));
        m->gathered = (cudaEvent_t *)callocCheck(m->n_unit_slots, sizeof(cudaEvent_t));
        for (int s = 0; s < m->n_unit_slots; s++)
            cudaCheck(cudaEventCreateWithFlags(&m->gathered[s], cudaEventDisableTiming));
        units_reshard(m);
    }
    for (int b = 0; b < 2; b++) m->grad_open[b] = -1;
    matmul_setup();
    m->next_logits = (float *)mallocCheck((size_t)c->vocab_size * sizeof(float));
    m->n_kept = (int *)mallocCheck((size_t)((m->T + m->chunk_size - 1) / m->chunk_size + 1) * sizeof(int)); // (m->T: padded;
                                                                                                           // + 1: a shared prompt's)
    m->kept_at = (int *)mallocCheck((size_t)m->B * m->T * sizeof(int));
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        Buffers<floatX> &d = buffers<floatX>(m);
        check_fits(m);
        size_t bytes[4] = {m->weight_bytes, m->param_bytes, m->act_bytes, m->carry_bytes};
        Layout lay[4]; // weights, trainable, activations, carry: model_layout places what model_plan counted
        for (int i = 0; i < 4; i++) {
            m->alloc[i] = cudaMallocCheck(bytes[i] + 1); // + 1: a valid pointer also when empty
            lay[i] = device_layout(m->alloc[i]);
        }
        model_layout<floatX>(m, &lay[0], &lay[1], &lay[2], &lay[3]);
        // the trainable masters, then the weights the matmuls read; a streamed base first, as it
        // seeds the trained copies of --trainable_params (model_stream_base), or full fine-tuning's
        // masters (and what masters_put puts beside them), which saves read back (masters_get)
        cudaStream_t st = m->stream;
        bool streamed = h->base_deferred && h->full_finetune;
        if (streamed) {
            if (m->pure_bf16 && !h->frozen_units) d.weights = d.params_lo; // (the parameters)
            h->base_keep = h->frozen_units && !m->pure_bf16; // (masters_get reads the frozen units' there)
            h->weights_finite = masters_finite, h->weights_ctx = m;
            if (m->sharded) h->shards_get = shards_get, h->shards_put = shards_put<floatX>;
            else h->weights_get = masters_get;
        }
        if (streamed && m->sharded) { // the shards' padding, which no piece puts, is zero (as the host's shards)
            if (!m->pure_bf16) cudaCheck(cudaMemsetAsync(m->params, 0, m->n_train * sizeof(float), st));
            if (m->pure_bf16 || h->frozen_units) cudaCheck(cudaMemsetAsync(d.weights, 0, n_base * sizeof(floatX), st));
        }
        // (a sharded checkpoint's weights come with its optimizer state: load_trainable, shards_put)
        if (m->base_offload) base_offload_alloc(m); // (sharded: layer_shards_put fills it, below)
        if (m->activation_offloading) act_offload_alloc(m);
        if (h->base_deferred && !h->base_resumed &&
            model_stream_base(&m->host, m->sharded ? m->fsdp->shard.rank : 0, streamed ? masters_put<floatX> : weights_put<floatX>, m) != 0)
            exit(1); // (it said why)
        if (m->cpu_offload) offload_alloc(m);
        if (h->use_lora) upload(m->params, h->lora.params, m->n_train, st);
        else if (!m->pure_bf16 && !streamed) masters_upload(m); // (--pure_bf16: the weights are the parameters, uploaded below)
        if (!m->cpu_offload) { // (offload_alloc zeroed the host's)
            if (m->grads) cudaCheck(cudaMemsetAsync(m->grads, 0, m->n_train * sizeof(float), st));
            if (m->grad_acc) cudaCheck(cudaMemsetAsync(m->grad_acc, 0, m->n_train * sizeof(bf16), st));
            for (int i = 0; i < optimizer_n_states(&m->optimizer); i++) {
                size_t count, es = optimizer_state_elem(&m->optimizer, &m->opt_tensors, m->n_train, i, &count);
                cudaCheck(cudaMemsetAsync(m->opt_state[i], 0, count * es, st));
            }
        }
        if (h->full_finetune && h->frozen_units) {
            if (!streamed) upload(d.weights, base, n_base, st);
        } else if (h->full_finetune && m->cpu_offload && !m->pure_bf16) {
            d.weights = d.params_lo;
            weights_upload(m);
        } else if (h->full_finetune) {
            if constexpr (std::is_same<floatX, float>::value) d.weights = m->params;
            else if (m->pure_bf16) { d.weights = d.params_lo; if (!streamed) upload(d.weights, base, n_base, st, m->upload_stage); }
            else { d.weights = d.params_lo; convert(d.weights, m->params, m->n_train, st); }
        } else {
            if (h->quant_type == QUANT_NONE || m->sharded) { // (LoRA's whole base streamed above: base_deferred)
                size_t at = h->units.units[fsdp_layer_unit(0)].shard_offset, apart = layers_apart(m); // sharded: the layers' streamed
                if (!h->base_deferred) upload(d.weights, base, at, st), upload(d.weights + at, base + at + apart, n_base - at - apart, st);
                if (m->base_offload && !h->base_deferred && h->quant_type == QUANT_NONE) layer_shards_put<floatX>(m);
            } else { // whole: the weights but the layers' (packed units, kept in runs)
                for (int u = 0; u < h->units.n_units; u++)
                    for (int j = 0; !h->units.units[u].packed && j < h->units.units[u].n_tensors; j++)
                        upload(d.weights + weight_offset(m, u, j), base + model_tensor_offset(c, u, j),
                               h->units.units[u].tensors[j].numel, st);
            }
            if (h->quant_type != QUANT_NONE && !m->base_offload) { // the runs, or this rank's shards of them, as the host laid them out
                cudaCheck(cudaMemcpyAsync(m->quant_bytes, m->sharded ? h->quant_shards : h->quant_bytes, model_run_bytes_held(h),
                                          cudaMemcpyHostToDevice, st));
            }
            for (int j = 0; j < LAYER_TENSORS; j++) m->deq_held[j] = -1;
            if constexpr (std::is_same<floatX, float>::value) d.lora_w = m->params;
            else { d.lora_w = d.params_lo; convert(d.lora_w, m->params, m->n_train, st); }
        }
        if (m->cpu_offload && m->pure_bf16) params_bf16_copy(m, cudaMemcpyDeviceToHost); // (the bf16 weights as uploaded)
        size_t table = (size_t)(host_prefix(&m->host) + m->T) * (c->head_dim / 2); // RoPE's, computed on the host (model.h)
        std::vector<float> inv_freq(c->head_dim / 2), cosb(table), sinb(table);
        rope_inv_freq(c, inv_freq.data());
        rope_tables(cosb.data(), sinb.data(), host_prefix(&m->host) + m->T, c->head_dim, inv_freq.data());
        cudaCheck(cudaMemcpy(m->rope_cos, cosb.data(), table * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(m->rope_sin, sinb.data(), table * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaDeviceSynchronize()); // the copies run on the legacy stream, which st does not wait for
    });
}

// (a model whose setup failed before model_alloc has no device memory: no CUDA call then)
static void model_free(Model *m) {
    for (int i = 0; i < 4; i++)
        if (m->alloc[i]) cudaCheck(cudaFree(m->alloc[i]));
    fsdp_device_comms_free(&m->dev); // (before the collectives' stream is destroyed)
    offload_free(m);
    base_offload_free(m);
    act_offload_free(m);
    if (m->stream) cudaCheck(cudaStreamDestroy(m->stream));
    if (m->comm_stream) cudaCheck(cudaStreamDestroy(m->comm_stream));
    if (m->computed) cudaCheck(cudaEventDestroy(m->computed));
    if (m->communicated) cudaCheck(cudaEventDestroy(m->communicated));
    free(m->f32.chunk);
    free(m->b16.chunk);
    free(m->h16.chunk);
    free(m->f32.slot);
    free(m->b16.slot);
    free(m->h16.slot);
    for (int s = 0; m->gathered && s < m->n_unit_slots; s++) cudaCheck(cudaEventDestroy(m->gathered[s]));
    free(m->gathered);
    free(m->slot_unit);
    free(m->next_logits);
    free(m->n_kept);
    free(m->kept_at);
    if (m->kept_weights) cudaCheck(cudaFree(m->kept_weights));
    if (m->share_room) cudaCheck(cudaFree(m->share_room));
    optim_tensors_free(&m->opt_tensors);
    host_model_free(&m->host);
    memset(m, 0, sizeof *m);
}

// ----------------------------------------------------------------------------
// where the base weights are (docs/sharding.md), as on the CPU: whole in
// d.weights, or sharded over the shard group, each unit gathered whole into a
// slot when the forward or backward needs it (collective)

// full (size * n) = every rank's part (n) of a device buffer in the compute type, in rank order
template <typename floatX> void all_gather(FsdpComm *c, floatX *full, const floatX *part, size_t n) {
    if constexpr (std::is_same<floatX, float>::value) fsdp_all_gather(c, full, part, n);
    else fsdp_all_gather_bf16(c, full, part, n); // (16-bit: fp16 moves as bf16 does)
}

// Starts gathering unit u (0 .. n_units - 1; sharded) into its slot from the
// shards, unless the slot holds it (collective). The gather waits for the
// compute enqueued so far, which holds the last reads of the slot's old unit;
// what is enqueued after it may overlap it. The base streamed: a layer's unit
// copied up instead (whole), or its shard copied up into the shard ring first,
// the gather waiting for the copy (the slot's event marks it in, then the gather).
template <typename floatX> void unit_prefetch(Model *m, int u) {
    Buffers<floatX> &d = buffers<floatX>(m);
    int s = unit_slot(m, u);
    if (m->slot_unit[s] == u) return;
    m->slot_unit[s] = u;
    bool up = m->base_offload && u >= 1 && u <= m->host.config.n_layers;
    if (up && !m->sharded) { layer_up(m, u, s, d.slot[s]); return; }
    const FsdpUnit *un = &m->host.units.units[u];
    uint8_t *shard = up ? m->shard_ring[u & 1] : un->packed ? m->quant_bytes + un->packed_offset : (uint8_t *)(d.weights + weight_shard_offset(m, u));
    if (up) layer_up(m, u, s, shard);
    stream_after(m->comm_stream, m->stream, m->computed);
    if (up) cudaCheck(cudaStreamWaitEvent(m->comm_stream, m->gathered[s], 0));
    PROF_BEGIN_UNIT(m->comm_stream, "gather", u, m->host.config.n_layers,
                    (long long)m->fsdp->shard.size * (un->packed ? un->packed_shard : un->shard * sizeof(floatX)));
    if (un->packed) // QLoRA: a layer's run, as bytes
        fsdp_all_gather_u8(device_comm(m, &m->dev.shard), d.slot[s], shard, un->packed_shard);
    else all_gather(device_comm(m, &m->dev.shard), d.slot[s], (const floatX *)shard, un->shard);
    PROF_END(m->comm_stream);
    if (up) cudaCheck(cudaEventRecord(m->ring_read[u & 1], m->comm_stream));
    cudaCheck(cudaEventRecord(m->gathered[s], m->comm_stream));
}
// unit u's parameters, whole, for the compute stream, which waits for their gather
template <typename floatX> floatX *unit_gather(Model *m, int u) {
    unit_prefetch<floatX>(m, u);
    int s = unit_slot(m, u);
    cudaCheck(cudaStreamWaitEvent(m->stream, m->gathered[s], 0));
    return buffers<floatX>(m).slot[s];
}
// the unit a forward (dir 1) or backward (-1) needs after unit u, gathered while u computes
template <typename floatX> void prefetch_next(Model *m, int u, int dir) {
    if (unit_slotted(m, u + dir)) unit_prefetch<floatX>(m, u + dir);
}

// QLoRA: tensor j of decoder layer unit u in its place in d.deq (deq_layout), from the layer's run
// (whole, or gathered into its slot: collective), a linear weight dequantized (quant.cuh, as quant.h's
// dequant_tensor), a norm converted from fp32; unless the place holds it already (the weights are
// frozen; every rank asks in the same order). The places it overlaps hold nothing then. One stream:
// the products that read a place before run before it is overwritten.
template <typename floatX> floatX *unit_dequant(Model *m, int u, int j) {
    const HostModel *h = &m->host;
    const FsdpUnit *un = &h->units.units[u];
    floatX *dst = buffers<floatX>(m).deq + m->deq_at[j];
    if (m->deq_held[j] == u) return dst;
    uint8_t *run = unit_slotted(m, u) ? (uint8_t *)unit_gather<floatX>(m, u) : m->quant_bytes + (size_t)(u - 1) * h->run_bytes;
    if (model_quantized(h, u, j)) dequant_tensor(model_run_tensor(h, run, j), dst, m->stream);
    else convert(dst, (const float *)(run + h->run_offset[j]), un->tensors[j].numel, m->stream);
    for (int k = 0; k < LAYER_TENSORS; k++)
        if (m->deq_at[k] < m->deq_at[j] + un->tensors[j].numel && m->deq_at[j] < m->deq_at[k] + un->tensors[k].numel)
            m->deq_held[k] = -1;
    m->deq_held[j] = u;
    return dst;
}
// QLoRA: linear weight t (LORA_Q .. LORA_DOWN) of layer l into its place in d.deq, where
// layer_params points, just before a product reads it (nothing without QLoRA)
template <typename floatX> void weight_ready(Model *m, int l, int t) {
    static const int tensor[LORA_N_TARGETS] = {P_WQ, P_WK, P_WV, P_WO, P_WGATE, P_WUP, P_WDOWN};
    if (m->host.quant_type != QUANT_NONE) unit_dequant<floatX>(m, fsdp_layer_unit(l), tensor[t] - P_ATTN_NORM);
}

// tensor j of unit u (fsdp_units_llama's order), where the forward reads it; QLoRA's layers: a
// norm converted into d.deq now, a linear weight's place there (weight_ready fills it)
template <typename floatX> floatX *param_at(Model *m, int u, int j) {
    if (m->host.units.units[u].packed)
        return model_quantized(&m->host, u, j) ? buffers<floatX>(m).deq + m->deq_at[j] : unit_dequant<floatX>(m, u, j);
    if (!unit_slotted(m, u)) return buffers<floatX>(m).weights + weight_offset(m, u, j);
    return unit_gather<floatX>(m, u) + m->host.units.units[u].tensors[j].offset;
}
// --trainable_params: saved tensor k (lora_saved's numbering) where the forward reads it, LoRA's
// copy for the matmuls (the masters, or the optimizer's bf16/fp16 copy), else w (the base's)
template <typename floatX> floatX *saved_or(Model *m, int k, floatX *w) {
    int64_t at = lora_saved_at(&m->host.lora, k);
    return at < 0 ? w : buffers<floatX>(m).lora_w + at;
}
// the embedding (--trainable_params embed: LoRA's trained copy)
template <typename floatX> floatX *embed_weight(Model *m) { return saved_or(m, 0, param_at<floatX>(m, 0, 0)); }
// the output projection: lm_head, or with tied embeddings the embedding
template <typename floatX> floatX *head_weight(Model *m) {
    return m->host.config.tied ? embed_weight<floatX>(m) : param_at<floatX>(m, fsdp_head_unit(&m->host.units), 1);
}
// the final norm (--trainable_params norm: LoRA's trained copy)
template <typename floatX> floatX *final_norm(Model *m) {
    return saved_or(m, 1 + 2 * m->host.config.n_layers, param_at<floatX>(m, fsdp_head_unit(&m->host.units), 0));
}
template <typename floatX> LayerWeights<floatX> layer_params(Model *m, int l) {
    floatX *t[LAYER_TENSORS];
    for (int j = 0; j < LAYER_TENSORS; j++) t[j] = param_at<floatX>(m, fsdp_layer_unit(l), j);
    LayerWeights<floatX> w = layer_weights(t);
    w.attn_norm = saved_or(m, 1 + 2 * l, w.attn_norm);
    w.mlp_norm = saved_or(m, 2 + 2 * l, w.mlp_norm);
    return w;
}

// ----------------------------------------------------------------------------
// context parallelism (docs/long_context.md; the layout: chunk.h's context_layout and
// context_piece): the ranks run their pieces group by group, in step. Each rank's KV and
// dKV carries hold its own positions alone, compact: its piece of group j at rows
// [j len, (j + 1) len) of T / P (carry_rows). At each layer a piece's keys and values are
// gathered from the group's carries into one layer's buffers at their absolute positions
// (context_gather), where the attention reads them as it reads the carry; in the backward
// the gradients it gives them there are summed over the group into their owners' dKV
// carries (context_reduce).

// Layer l's keys and values of every position up to the end of piece ch's group j into ck, cv
// (B, T, KV) at their absolute positions: each rank's compact rows of groups 0 .. j (B, (j + 1) len,
// KV), all-gathered over the context group (collective), rank r's piece of group g where
// context_piece puts it. Nothing when they are there already (held_layer, held_group).
template <typename floatX> void context_gather(Model *m, const Chunk *ch, int l) {
    Buffers<floatX> &d = buffers<floatX>(m);
    const Config *c = &m->host.config;
    int P = context_comm(m)->size, j = context_group(&m->rows, ch), len = ch->len, B = ch->B, T = ch->T;
    if (m->held_layer == l && m->held_group == j) return;
    size_t KV = (size_t)c->n_kv_heads * c->head_dim, n = (size_t)B * (j + 1) * len * KV, carry = (size_t)B * (T / P) * KV;
    Chunk mine = {B, T / P, 0, (j + 1) * len, 0, 0}, packed = {B, (j + 1) * len, 0, (j + 1) * len, 0, 0};
    floatX *part = (floatX *)m->context_part, *all = (floatX *)m->context_stage; // (B, (j + 1) len, KV), P of them
    PROF_BEGIN(m->stream, "context all-gather", l, j, (long long)(2 * P * n * sizeof(floatX)));
    for (int kv = 0; kv < 2; kv++) {
        rows_copy(part, &packed, LAYER(kv ? d.v : d.k, l, carry), &mine, KV, m->stream);
        stream_after(m->comm_stream, m->stream, m->computed);
        all_gather(device_comm(m, &m->dev.context), all, part, n);
        stream_after(m->stream, m->comm_stream, m->communicated);
        for (int r = 0; r < P; r++)
            for (int g = 0; g <= j; g++) {
                Chunk from = {B, (j + 1) * len, g * len, len, 0, 0}, to = context_piece(P, B, T, len, g, r, 0);
                rows_copy(kv ? d.cv : d.ck, &to, all + r * n, &from, KV, m->stream);
            }
    }
    PROF_END(m->stream);
    m->held_layer = l, m->held_group = j;
}

// The gradients cdk, cdv (B, T, KV) that the ranks' pieces of group j gave the positions up to
// its end, summed over the context group in fp32 (a reduce-scatter: collective) and added into
// the owners' dKV carries of layer l, rows of groups 0 .. j. The rank's piece of group j is
// complete then (the later groups' shares came first).
template <typename floatX> void context_reduce(Model *m, const Chunk *ch, int l) {
    Buffers<floatX> &d = buffers<floatX>(m);
    const Config *c = &m->host.config;
    int P = context_comm(m)->size, j = context_group(&m->rows, ch), len = ch->len, B = ch->B, T = ch->T;
    size_t KV = (size_t)c->n_kv_heads * c->head_dim, rows = (size_t)(j + 1) * len, n = B * rows * KV, carry = (size_t)B * (T / P) * KV;
    PROF_BEGIN(m->stream, "context reduce-scatter", l, j, (long long)(2 * P * n * sizeof(float)));
    for (int kv = 0; kv < 2; kv++) {
        floatX *g = kv ? d.cdv : d.cdk, *dc = LAYER(kv ? d.dv : d.dk, l, carry);
        for (int r = 0; r < P; r++) // rank r's rows (B, (j + 1) len, KV) in fp32, in its compact order
            for (int p = 0; p <= j; p++) {
                Chunk at = context_piece(P, B, T, len, p, r, 0);
                for (int b = 0; b < B; b++)
                    convert(m->context_stage + r * n + (b * rows + p * len) * KV, g + ((size_t)b * T + at.t0) * KV, len * KV, m->stream);
            }
        stream_after(m->comm_stream, m->stream, m->computed);
        fsdp_reduce_scatter(device_comm(m, &m->dev.context), m->context_part, m->context_stage, n);
        stream_after(m->stream, m->comm_stream, m->communicated);
        for (int b = 0; b < B; b++) accumulate(dc + b * (T / P) * KV, m->context_part + b * rows * KV, rows * KV, m->stream);
    }
    PROF_END(m->stream);
}

// ----------------------------------------------------------------------------
// the gradients of full fine-tuning's units: where the backward adds them

// Full fine-tuning's gradients (fp32), as in train_llama2.c: whole, straight in
// m->grads; sharded, a unit's gradient whole (zeroed as it opens), reduce-scattered
// by grads_done into this rank's shard of m->grads, on the collectives' stream.
// Offloaded (m->grads on the host): whole, the unit's running total goes up as it opens
// (zeros at its first) and down again when done, so the backward adds to it as it
// adds to m->grads; sharded, the reduced shard goes down and the host adds it
// (grads_to_host), as accumulate adds it on the device.
static float *grad_at(Model *m, int u, int j) {
    const HostModel *h = &m->host;
    if (!grads_by_unit(m)) return m->grads + model_tensor_offset_from(&h->config, h->frozen_units, u, j);
    const FsdpUnit *un = &h->units.units[u];
    int b = u != 0;
    if (m->grad_open[b] != u) {
        if (m->sharded || !m->cpu_offload || !m->grad_held[u]) { // (sharded: the padding too)
            size_t n = m->sharded ? (size_t)m->fsdp->shard.size * un->shard : un->numel;
            cudaCheck(cudaMemsetAsync(m->unit_grad[b], 0, n * sizeof(float), m->stream));
        } else {
            unit_grad_copy(m, u, b, cudaMemcpyHostToDevice, m->stream);
        }
        m->grad_open[b] = u;
    }
    return m->unit_grad[b] + un->tensors[j].offset;
}
static void grads_done(Model *m, int u) {
    const HostModel *h = &m->host;
    if (!grads_by_unit(m)) return;
    const FsdpUnit *un = &h->units.units[u];
    float *g = m->unit_grad[u != 0];
    stream_after(m->comm_stream, m->stream, m->computed);
    if (m->sharded) {
        if (m->pure_bf16) round_bf16(g, (size_t)m->fsdp->shard.size * un->shard, m->comm_stream); // each rank's part bf16
        PROF_BEGIN_UNIT(m->comm_stream, "reduce-scatter", u, h->config.n_layers, (long long)m->fsdp->shard.size * un->shard * sizeof(float));
        fsdp_reduce_scatter(device_comm(m, &m->dev.shard), m->grad_part, g, un->shard);
        PROF_END(m->comm_stream);
        size_t at = trainable_shard_at(h, u); // m->grads: the trainable units' shards
        if (m->cpu_offload) grads_to_host(m, u, at);
        else if (m->pure_bf16 && !pure_bf16_chunked(m)) grads_bf16_add(m->grad_acc + at, m->grad_part, un->shard, m->comm_stream);
        else accumulate(m->grads + at, m->grad_part, un->shard, m->comm_stream);
    } else if (m->pure_bf16 && !m->cpu_offload) { // whole sequences: the unit's micro-batch gradient into the step's, tensor by tensor
        for (int k = 0; k < un->n_tensors; k++)
            grads_bf16_add(m->grad_acc + model_tensor_offset_from(&h->config, h->frozen_units, u, k), g + un->tensors[k].offset,
                           un->tensors[k].numel, m->comm_stream);
    } else if (m->pure_bf16 && !pure_bf16_chunked(m)) { // offloaded, whole sequences: the same, on the host
        grads_to_host(m, u, 0);
    } else {
        unit_grad_copy(m, u, u != 0, cudaMemcpyDeviceToHost, m->comm_stream);
        m->grad_held[u] = 1;
        if (offload_step_final(m)) offload_step_copied(m, u);
    }
    stream_after(m->stream, m->comm_stream, m->communicated); // before the unit's gradient is zeroed again
    m->grad_open[u != 0] = -1;
}
static LayerWeights<float> layer_grads(Model *m, int l) {
    float *t[LAYER_TENSORS];
    for (int j = 0; j < LAYER_TENSORS; j++) t[j] = grad_at(m, fsdp_layer_unit(l), j);
    return layer_weights(t);
}
// LoRA's gradient of saved tensor k (lora_saved's numbering), NULL when it does not train
static float *saved_grad(Model *m, int k) { return lora_saved(&m->host.lora, m->grads, k, NULL); }

// ----------------------------------------------------------------------------
// optimizer: AdamW as torch.optim.AdamW, SGD as torch.optim.SGD, clipping as
// torch.nn.utils.clip_grad_norm_, on the device (layers.cuh); the state lives
// there alone (a checkpoint streams it through a staging buffer: optimizer_state_get)

typedef struct {
    Model *model;           // its trainable parameters, gradients and optimizer state (device)
    size_t n;
    OptimizerSettings s;
    int t;                  // optimizer steps taken
    FsdpComm *grad_sum;     // the ranks whose gradients of these parameters are summed before the step (device;
                            // offloaded, the host's: the gradients are there)
    FsdpComm *norm_sum;     // host side: the ranks whose squared norms make up the global norm (NULL: this rank's is)
} Optimizer;

// The state is the model's (model_alloc zeroed it).
// As on the CPU: replicated parameters (LoRA's, or every weight with a shard
// group of one) sum their gradients over every rank; shards over the ranks that
// hold the same shard (the replica group), and their norm over the shard group.
static void optimizer_init(Optimizer *o, Model *m) {
    memset(o, 0, sizeof *o);
    o->model = m;
    o->n = m->n_train;
    o->s = m->optimizer;
    int shard = m->sharded && !m->host.use_lora;
    if (m->fsdp && m->fsdp->world.size > 1) {
        const FsdpComm *sum_over = shard ? &m->fsdp->replica : &m->fsdp->world; // its host side: the size
        o->grad_sum = sum_over->size == 1 ? NULL : m->cpu_offload ? (FsdpComm *)sum_over : shard ? &m->dev.replica : &m->dev.world;
        o->norm_sum = shard ? &m->fsdp->shard : NULL;
    }
    offload_step_start(m, o->grad_sum != NULL);
}

static void optimizer_free(Optimizer *o) {
    if (o->model) offload_step_stop(o->model);
    memset(o, 0, sizeof *o);
}

// the trainer, before a step's first micro-batch (BACKEND_STEP_IN_BACKWARD): with the overlapped
// offload step, whether this one overlaps (not with a loss scale, which skips a step whose
// gradients overflow), and what its units step with
#define BACKEND_STEP_IN_BACKWARD
static void optimizer_begin_step(Optimizer *o, int step, float lr, int micro_batches, int loss_scaled) {
    OffloadStep *w = o->model->offload_step;
    if (!w) return;
    pthread_mutex_lock(&w->lock); // (the worker is idle: the last step joined it)
    w->on = !loss_scaled, w->step = step, w->t = o->t + 1, w->lr = lr, w->passes_left = micro_batches;
    w->queued = w->taken = w->stepped = w->uploaded = w->n_copying = 0;
    pthread_mutex_unlock(&w->lock);
}

static void optimizer_zero_grad(Optimizer *o) {
    Model *m = o->model;
    if (!m->cpu_offload) {
        if (m->grads) cudaCheck(cudaMemsetAsync(m->grads, 0, o->n * sizeof(float), m->stream));
        if (m->grad_acc) cudaCheck(cudaMemsetAsync(m->grad_acc, 0, o->n * sizeof(bf16), m->stream));
        return;
    }
    grads_host_zero(m);
    if (m->grad_acc) memset(m->grad_acc, 0, o->n * sizeof(bf16));
}

// AdamW8bit's step (the t-th) over the trainable tensors (or this rank's pieces of them),
// each on its own as torchao steps it (8-bit or fp32 state; as train_llama2.c's
// adamw8bit_step), writing the bf16/fp16 copy too (copy NULL: none); offloaded, on the host,
// those that start in elements [lo, hi) of the flat parameters
template <typename E> void adamw8bit_step(Model *m, int t, float lr, E *copy, size_t lo = 0, size_t hi = SIZE_MAX) {
    const OptimizerSettings *s = &m->optimizer;
    const OptimTensors *ts = &m->opt_tensors;
    double b1 = float_decimal(s->beta1), b2 = float_decimal(s->beta2), eps = float_decimal(s->eps), wd = float_decimal(s->weight_decay);
    Adamw8bitState a = adamw8bit_state(m->opt_state);
    for (int k = 0; k < ts->n; k++) {
        size_t n = ts->numel[k], at = ts->at[k], f = ts->first[k]; // f: in the flat masters, gradients and copy
        if (f < lo || f >= hi) continue;
        E *c = copy ? copy + f : NULL;
        if (m->cpu_offload && ts->quant[k])
            adamw8bit_update(m->params + f, m->grads + f, a.codes[0] + at, a.absmax[0] + at / ADAMW8BIT_BLOCK, a.codes[1] + at,
                             a.absmax[1] + at / ADAMW8BIT_BLOCK, n, t, lr, b1, b2, eps, wd);
        else if (m->cpu_offload) adamw_torchao_update(m->params + f, m->grads + f, a.fp32[0] + at, a.fp32[1] + at, n, t, lr, b1, b2, eps, wd);
        else if (ts->quant[k])
            adamw8bit_update(m->params + f, m->grads + f, a.codes[0] + at, a.absmax[0] + at / ADAMW8BIT_BLOCK, a.codes[1] + at,
                             a.absmax[1] + at / ADAMW8BIT_BLOCK, n, t, lr, b1, b2, eps, wd, c, m->stream);
        else adamw_torchao_update(m->params + f, m->grads + f, a.fp32[0] + at, a.fp32[1] + at, n, t, lr, b1, b2, eps, wd, c, m->stream);
    }
}

// --pure_bf16 offloaded with replicas: grads_bf16_all_reduce on the host, the step's bf16 gradients
// a piece at a time in fp32 summed over c (the host collectives, in rank order), each sum rounded to bf16 once
static void grads_bf16_all_reduce_host(Model *m, FsdpComm *c) {
    float *piece = m->step_pieces;
    for (size_t i = 0; i < m->n_train; i += UPLOAD_PIECE) {
        size_t k = std::min(UPLOAD_PIECE, m->n_train - i);
        #pragma omp parallel for
        for (size_t j = 0; j < k; j++) piece[j] = __bfloat162float(m->grad_acc[i + j]);
        fsdp_all_reduce(c, piece, k, FSDP_F32);
        #pragma omp parallel for
        for (size_t j = 0; j < k; j++) m->grad_acc[i + j] = __float2bfloat16(piece[j]);
    }
}

// --pure_bf16 offloaded: anyprecision_step on the host, with the clipping (on the device
// clip_grads'): the bf16 parameters and gradients a piece at a time in fp32 through the CPU
// twin's code (train_llama2.c's optimizer_step: clip_grads, round_bf16, anyprecision_update;
// each element the kernels'), the state bf16 where it lies; flat over the runs, elements
// [first, first + n) (element by element: a unit's ranges step as the whole does, OffloadStep)
static void anyprecision_step_host(Model *m, size_t first, size_t n, int t, float lr, double norm, float inv_scale) {
    const OptimizerSettings *s = &m->optimizer;
    uint16_t **state = (uint16_t **)m->opt_state; // m, v and with Kahan summation the compensation
    float *p = m->step_pieces, *g = p + std::min(UPLOAD_PIECE, m->n_train); // (one step at a time: the overlapped one or this)
    for (size_t i = first; i < first + n; i += UPLOAD_PIECE) {
        size_t k = std::min(UPLOAD_PIECE, first + n - i);
        #pragma omp parallel for
        for (size_t j = 0; j < k; j++) p[j] = __bfloat162float(m->params_bf16[i + j]), g[j] = __bfloat162float(m->grad_acc[i + j]);
        clip_grads(g, k, norm, s->grad_clip, inv_scale);
        round_bf16(g, k); // (clipped or unscaled: as clip_grads' kernel stores bf16)
        anyprecision_update(p, g, state[0] + i, state[1] + i, s->kahan ? state[2] + i : NULL, k, t, lr,
                            float_decimal(s->beta1), float_decimal(s->beta2), float_decimal(s->eps), float_decimal(s->weight_decay));
        #pragma omp parallel for
        for (size_t j = 0; j < k; j++) m->params_bf16[i + j] = __float2bfloat16(p[j]); // (exact: bf16 values)
    }
}

// --cpu_offload: the update (the t-th) of elements [first, first + n) of the masters with their
// gradients and state, with the CPU's code, whose elements are the kernels' (support/optimizer.h):
// element by element (AdamW8bit's tensor by tensor), so a unit's ranges step as the whole does
static void optimizer_update_host(Model *m, size_t first, size_t n, int t, float lr) {
    const OptimizerSettings *s = &m->optimizer;
    float *p = m->params + first, *g = m->grads + first, **state = (float **)m->opt_state;
    if (s->kind == OPTIMIZER_SGD) sgd_update(p, g, state[0] ? state[0] + first : NULL, n, t == 1, lr, s->momentum, s->nesterov, s->weight_decay);
    else if (s->kind == OPTIMIZER_ADAMW8BIT) adamw8bit_step<float>(m, t, lr, NULL, first, first + n);
    else adamw_update(p, g, state[0] + first, state[1] + first, n, t, lr, s->beta1, s->beta2, s->eps, s->weight_decay);
}

// --cpu_offload: the host's part of the step, where the gradients and the state are: the
// norm in the device's order (sum_host), clipping, the update (optimizer_update_host), and
// the new weights up to the GPU; or, overlapped with the backward (OffloadStep), each unit's
// update and upload as its gradient became final, the norm meanwhile (the gradients are the
// same: nothing clips them)
static double optimizer_step_host(Optimizer *o, float lr, float inv_scale, int update) {
    Model *m = o->model;
    const OptimizerSettings *s = &o->s;
    bool overlapped = m->offload_step && m->offload_step->on;
    if (overlapped) offload_step_dispatch(m);
    cudaCheck(cudaStreamSynchronize(m->comm_stream)); // every gradient is down
    grads_add_staged(m);
    if (o->grad_sum && m->pure_bf16) grads_bf16_all_reduce_host(m, o->grad_sum);
    else if (o->grad_sum) fsdp_all_reduce(o->grad_sum, m->grads, o->n, FSDP_F32);
    double sumsq = m->pure_bf16 ? sum_host<true>(m->grad_acc, o->n) : sum_host<true>(m->grads, o->n);
    if (o->norm_sum) fsdp_all_reduce(o->norm_sum, &sumsq, 1, FSDP_F64);
    double norm = sqrt(sumsq) * inv_scale; // the same on every rank; unscaled (exact: a power of two)
    if (overlapped) {
        offload_step_join(m);
        if (!update || !isfinite(norm)) { // (on every rank: the loss and the norm are every rank's)
            fprintf(stderr, "error: step %d: the loss or the gradient norm is NaN or inf, but --cpu_offload without --grad_clip "
                    "has already stepped each unit as its gradient was final, so the step cannot be skipped; stopping (the "
                    "last checkpoint is intact). To have such steps skipped, resume with --grad_clip (1e9 clips no norm "
                    "below it: the same results, the step after the backward)\n", m->offload_step->step);
            exit(EXIT_FAILURE);
        }
        o->t++;
        return norm;
    }
    if (!update || !isfinite(norm)) return norm; // a skipped step: nothing changes
    if (!m->pure_bf16) clip_grads(m->grads, o->n, norm, s->grad_clip, inv_scale); // (--pure_bf16's: anyprecision_step_host)
    o->t++;
    if (m->pure_bf16) anyprecision_step_host(m, 0, o->n, o->t, lr, norm, inv_scale);
    else optimizer_update_host(m, 0, o->n, o->t, lr);
    weights_upload(m);
    return norm;
}

// --pure_bf16 with replicas (NO_SHARD, HYBRID_SHARD): the step's bf16 gradients summed over c
// as train_llama2.c sums them: in fp32 (the host collectives: in rank order), the sum rounded to
// bf16 once; in pieces through the upload stage, on the collectives' stream (no fp32 copy of the whole)
static void grads_bf16_all_reduce(Model *m, FsdpComm *c) {
    for (size_t i = 0; i < m->n_train; i += UPLOAD_PIECE) {
        size_t k = std::min(UPLOAD_PIECE, m->n_train - i);
        convert(m->upload_stage, m->grad_acc + i, k, m->comm_stream);
        fsdp_all_reduce(c, m->upload_stage, k, FSDP_F32);
        convert(m->grad_acc + i, m->upload_stage, k, m->comm_stream);
    }
}

// --pure_bf16: AnyPrecisionAdamW's step (the t-th) on the bf16 weights' trainable runs with the
// step's bf16 gradients and the bf16 state, flat over the runs (as train_llama2.c's)
static void anyprecision_step(Model *m, int t, float lr) {
    const OptimizerSettings *s = &m->optimizer;
    bf16 **state = (bf16 **)m->opt_state; // m, v and with Kahan summation the compensation
    size_t off = 0; // the run's first element in the gradients and the state
    for (int r = 0; r < m->n_runs; off += m->run_n[r++]) // (the hyperparameters as the numbers typed, as llama-recipes')
        anyprecision_update(m->b16.weights + m->run_first[r], m->grad_acc + off, state[0] + off, state[1] + off,
                            s->kahan ? state[2] + off : NULL, m->run_n[r], t, lr, float_decimal(s->beta1),
                            float_decimal(s->beta2), float_decimal(s->eps), float_decimal(s->weight_decay), m->stream);
}

// the global gradient norm (returned, before clipping); if update and the norm
// is finite, unscaling and clipping, then the optimizer's update, which also
// writes the bf16/fp16 copy of the parameters the next forward reads (--pure_bf16:
// the step's bf16 gradients, clipped and rounded to bf16, step the bf16 weights themselves)
static double optimizer_step(Optimizer *o, float lr, float inv_scale, int update) {
    Model *m = o->model;
    const OptimizerSettings *s = &o->s;
    if (m->cpu_offload) return optimizer_step_host(o, lr, inv_scale, update);
    if (o->grad_sum) {
        stream_after(m->comm_stream, m->stream, m->computed);
        PROF_BEGIN(m->comm_stream, "all-reduce gradients", -1, -1, (long long)(o->n * sizeof(float)));
        if (m->pure_bf16) grads_bf16_all_reduce(m, device_comm(m, o->grad_sum));
        else fsdp_all_reduce(device_comm(m, o->grad_sum), m->grads, o->n, FSDP_F32);
        PROF_END(m->comm_stream);
        stream_after(m->stream, m->comm_stream, m->communicated);
    }
    double sumsq, norm; // (--pure_bf16: of the bf16 gradients, which clip_grads rounds to bf16 again)
    if (m->pure_bf16) grad_sumsq(m->grad_norm, m->grad_acc, o->n, false, m->stream);
    else grad_sumsq(m->grad_norm, m->grads, o->n, false, m->stream);
    cudaCheck(cudaMemcpyAsync(&sumsq, m->grad_norm, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    if (o->norm_sum) fsdp_all_reduce(o->norm_sum, &sumsq, 1, FSDP_F64);
    norm = sqrt(sumsq) * inv_scale; // the same on every rank; unscaled (exact: a power of two)
    if (!update || !isfinite(norm)) return norm; // a skipped step: nothing changes
    // clip_grads reads it there (a pageable source: the call returns once it is copied)
    cudaCheck(cudaMemcpyAsync(m->grad_norm, &norm, sizeof(double), cudaMemcpyHostToDevice, m->stream));
    if (m->pure_bf16) clip_grads(m->grad_acc, o->n, m->grad_norm, s->grad_clip, inv_scale, m->stream);
    else clip_grads(m->grads, o->n, m->grad_norm, s->grad_clip, inv_scale, m->stream);
    o->t++;
    if (m->pure_bf16) {
        anyprecision_step(m, o->t, lr);
        return norm;
    }
    with_precision(m, [&](auto tag) { // (fp32, or some units frozen: no copy, params_lo is NULL)
        auto *copy = buffers<typename decltype(tag)::type>(m).params_lo;
        if (s->kind == OPTIMIZER_SGD)
            sgd_update(m->params, m->grads, (float *)m->opt_state[0], o->n, o->t, lr, s->momentum, s->nesterov, s->weight_decay,
                       copy, m->stream);
        else if (s->kind == OPTIMIZER_ADAMW8BIT) adamw8bit_step(m, o->t, lr, copy);
        else
            adamw_update(m->params, m->grads, (float *)m->opt_state[0], (float *)m->opt_state[1], o->n, o->t, lr, s->beta1,
                         s->beta2, s->eps, s->weight_decay, copy, m->stream);
    });
    if (m->host.frozen_units) weights_refresh(m);
    return norm;
}

// a piece of state tensor i to the host and back, for checkpoints: in the compute stream's
// order, done when they return (the host buffer is reused for the next piece)
static int optimizer_state_get(Optimizer *o, int i, size_t first, size_t count, void *dst) {
    Model *m = o->model;
    size_t n, es = optimizer_state_elem(&m->optimizer, &m->opt_tensors, m->n_train, i, &n);
    if (m->cpu_offload) {
        memcpy(dst, (char *)m->opt_state[i] + first * es, count * es);
        return 0;
    }
    cudaCheck(cudaMemcpyAsync(dst, (char *)m->opt_state[i] + first * es, count * es, cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    return 0;
}
static void optimizer_state_set(Optimizer *o, int i, size_t first, size_t count, const void *src) {
    Model *m = o->model;
    size_t n, es = optimizer_state_elem(&m->optimizer, &m->opt_tensors, m->n_train, i, &n);
    if (m->cpu_offload) {
        memcpy((char *)m->opt_state[i] + first * es, src, count * es);
        return;
    }
    cudaCheck(cudaMemcpyAsync((char *)m->opt_state[i] + first * es, src, count * es, cudaMemcpyHostToDevice, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
}
// every float state tensor's sum, in double on the device: finite exactly when every element
// is (a sum of floats cannot reach double's range, and an inf or NaN stays one); codes are bytes
static int optimizer_state_finite(Optimizer *o) {
    Model *m = o->model;
    int finite = 1;
    for (int i = 0; i < optimizer_n_states(&o->s); i++) {
        size_t n, es = optimizer_state_elem(&m->optimizer, &m->opt_tensors, m->n_train, i, &n);
        if (es == 1) continue; // (codes)
        double sum;
        if (m->cpu_offload) {
            sum = es == sizeof(bf16) ? sum_host<false>((const bf16 *)m->opt_state[i], n) : sum_host<false>((const float *)m->opt_state[i], n);
            finite &= isfinite(sum) != 0;
            continue;
        }
        if (es == sizeof(bf16)) global_sum(m->grad_norm, (const bf16 *)m->opt_state[i], n, m->stream); // (--pure_bf16's)
        else global_sum(m->grad_norm, (const float *)m->opt_state[i], n, m->stream);
        cudaCheck(cudaMemcpyAsync(&sum, m->grad_norm, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
        cudaCheck(cudaStreamSynchronize(m->stream));
        finite &= isfinite(sum) != 0;
    }
    return finite;
}

// the trainable weights into the host model, for a save
static void model_sync_host(Model *m) {
    HostModel *h = &m->host;
    cudaStream_t st = m->stream;
    if (h->use_lora) cudaCheck(cudaMemcpyAsync(h->lora.params, m->params, m->n_train * sizeof(float), cudaMemcpyDeviceToHost, st));
    else if (!h->base_deferred) masters_download(m); // (streamed: the save reads them back, masters_get)
    cudaCheck(cudaStreamSynchronize(st));
}

// full fine-tuning's weights a resumed run read from its checkpoint (a sharded checkpoint's
// are read after model_alloc), onto the device with the copy the matmuls read (the
// optimizer state went there as it was read: optimizer_state_set); a streamed base is
// the checkpoint's already (model_alloc read it from there; a sharded checkpoint's went into
// the masters as it was read, shards_put: only their copy is left, and --cpu_offload's bf16
// parameters, the host's copy of what went into the GPU's bf16 weights)
static void optimizer_sync_device(Optimizer *o) {
    Model *m = o->model;
    const HostModel *h = &m->host;
    if (h->full_finetune && m->cpu_offload && !h->base_deferred) {
        masters_upload(m); // (--pure_bf16: into the GPU's bf16 weights, which the host's then copy)
        if (m->pure_bf16) params_bf16_copy(m, cudaMemcpyDeviceToHost);
        else weights_upload(m);
    } else if (h->full_finetune && (!h->base_deferred || h->base_resumed)) {
        if (!h->base_deferred) masters_upload(m); // (--pure_bf16: into the bf16 weights themselves, nothing more to copy)
        if (m->cpu_offload) params_bf16_copy(m, cudaMemcpyDeviceToHost); // (streamed offloaded: --pure_bf16)
        if (h->frozen_units && !m->pure_bf16) weights_refresh(m);
        else if (!m->pure_bf16) with_precision(m, [&](auto tag) {
            using floatX = typename decltype(tag)::type;
            if constexpr (!std::is_same<floatX, float>::value) convert(buffers<floatX>(m).params_lo, m->params, o->n, m->stream);
        });
    }
    cudaCheck(cudaStreamSynchronize(m->stream));
}

// ----------------------------------------------------------------------------
// what else trainer.h asks of the backend: the memory in use and the plans, the options it runs

// Device memory in use, in MiB, the most seen so far: cudaMemGetInfo's view,
// this process's allocations and its CUDA context (and any other process on the
// GPU). The model allocates everything before the first step, so after one
// step this is the run's peak.
static double model_peak_mb(Model *m) {
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    m->peak_mb = std::max(m->peak_mb, (total_bytes - free_bytes) / 1048576.0);
    return m->peak_mb;
}
// QLoRA: d.deq, the biggest linear weight and what goes beside it (deq_layout), in the compute
// type (the kernel works each absmax out as it goes)
static size_t model_dequant_scratch_bytes(const Model *m) {
    size_t at[LAYER_TENSORS];
    return deq_layout(&m->host, at) * (m->fp32 ? sizeof(float) : sizeof(bf16));
}
static const char *const backend_dequant_scratch = "one projection";
static const char *const backend_memory = "GPU memory";

// --cpu_offload with an adapter, the memory plan's lines (memory_plan): the ring on the GPU (sharded,
// the shard ring, and what stays as without the offload: the slots the layers are gathered into,
// the embedding's and the head's shards), and a micro-batch's layers (sharded, the rank's shards)
// streamed up against its compute. Each pass over the layers streams every one: a chunk's forward,
// its forward again in recompute mode (not the last chunk's), its backward (activation
// checkpointing's forward reads the slot the backward reads); the ring's two layers may spare one
// or two at a turn, so the bytes are a bound; sharded without resharding after the forward, the
// slots keep every layer gathered until the micro-batch's end, so one pass. The gathers move the
// rest of each layer between the GPUs, as without the offload: not over this PCIe link from the
// host (the rank's own link is counted). Their time over PCIe at PLAN_PCIE_GBS
// (a 16-lane PCIe 4.0 link's pinned host-to-device rate), the compute's at --peak_tflops, or
// PLAN_PEAK_TFLOPS (an RTX 4090's dense bf16 products with fp32 accumulation); the compute is
// flops_per_sequence's, which leaves recomputed forwards out, so the warning errs toward warning.
#define PLAN_PCIE_GBS 25.0
#define PLAN_PEAK_TFLOPS 165.0
static double flops_per_sequence(const HostModel *m, int T, int s2); // (trainer/plan.h)
static double layer_matmul_params(const Config *c);
static double attention_flops(const Config *c, int T, int s2);
static bool group_rerun(const Model *m, int l); // (support/act_offload.cuh)
static void base_offload_plan(const Model *m) {
    const HostModel *h = &m->host;
    const double MiB = 1048576.0;
    int L = h->config.n_layers, n = (m->T + m->chunk_size - 1) / m->chunk_size, passes = 2 * n + (m->recompute ? n - 1 : 0);
    int rerun = 0; // layers up once more: --offload_every K's groups re-run before their backward, K - 1 layers each
    if (m->activation_offloading) { // (layer-major: each layer up once in the forward, once in the backward)
        passes = 2;
        for (int l = 0; l < L; l++) rerun += group_rerun(m, l) ? m->offload_every - 1 : 0;
    }
    if (m->sharded && !m->fsdp->info->reshard_after_forward) passes = 1, rerun = 0;
    double ring = 2.0 * layer_bytes(m), up = ((double)passes * L + rerun) * layer_bytes(m);
    double tflops = m->peak_tflops > 0 ? m->peak_tflops : PLAN_PEAK_TFLOPS;
    double pcie_ms = up / (PLAN_PCIE_GBS * 1e9) * 1e3, compute_ms = m->B * flops_per_sequence(h, m->T, m->s2_attn) / (tflops * 1e12) * 1e3;
    bool quant = h->quant_type != QUANT_NONE;
    char what[128];
    if (quant) snprintf(what, sizeof what, "%s%s, blocks of %d", quant_type_names[h->quant_type], h->double_quant ? ", double quantization" : "", QUANT_BLOCK);
    else snprintf(what, sizeof what, "%s", m->fp32 ? "fp32" : m->fp16 ? "fp16" : "bf16");
    printf("    %-32s %10.1f MiB   (2 of the %d decoder layers%s, %s; the rest in pinned host memory)\n", "of which the layers' ring",
           ring / MiB, L, m->sharded ? ", this rank's shards" : "", what);
    if (m->sharded) { // what stays as without the offload
        size_t es = m->fp32 ? sizeof(float) : sizeof(bf16);
        Layout slots = device_layout(NULL);
        for (int s = 0; s < m->n_unit_slots; s++) layout_take(&slots, slot_numel(m, s, es) * es);
        printf("    %-32s %10.1f MiB   (%d units gathered whole at once, as without the offload)\n", "of which the gathered slots",
               slots.bytes / MiB, m->n_unit_slots);
        printf("    %-32s %10.1f MiB   (this rank's shards, as without the offload)\n", "of which embedding and head",
               weights_numel(m) * es / MiB);
    }
    if (quant) printf("    %-32s %10.1f MiB   (%s, %s)\n", "of which dequantize scratch", model_dequant_scratch_bytes(m) / MiB,
                      backend_dequant_scratch, m->fp32 ? "fp32" : m->fp16 ? "fp16" : "bf16");
    char again[48] = "";
    if (rerun) snprintf(again, sizeof again, " and %d re-run", rerun);
    printf("  %-34s %10.1f MiB   (%d pass%s over %d layers%s%s: %.1f ms at %.0f GB/s, against %.1f ms of compute at %.0f TFLOP/s)\n",
           "streamed up a micro-batch", up / MiB, passes, passes == 1 ? "" : "es", L, again,
           m->sharded ? "' shards; their gathers as without the offload, not PCIe" : "", pcie_ms, PLAN_PCIE_GBS, compute_ms, tflops);
    if (pcie_ms > compute_ms) {
        fflush(stdout);
        fprintf(stderr, "warning: --cpu_offload 1: streaming the base takes %.1f ms a micro-batch over PCIe (%.0f GB/s), more than "
                "its %.1f ms of compute at %.0f TFLOP/s: the GPU waits for it (more rows a micro-batch, longer chunks or "
                "--chunk_memory keep hide more of it)\n", pcie_ms, PLAN_PCIE_GBS, compute_ms, tflops);
    }
}
#include "support/act_offload.cuh" // --activation_offloading's host memory, its copies and its plan
// beside the GPU's plan, the host's: the host model as loaded (fp32, this rank's shards of
// LoRA's base, and QLoRA's 4-bit runs; --cpu_offload's whole or its shards), or for a base that
// streams to the GPU (whole on one rank: LoRA's, full fine-tuning's; and full fine-tuning's
// shards; its saves stream it back, a sharded final save a piece at a time from each rank), a
// piece of it (and a tied embedding, or its shard, whole), LoRA's weights and gradients, and
// the buffer a checkpoint streams the optimizer state through (optimizer_state_get; none of it
// stays on the host); with --cpu_offload, the
// gradients, the optimizer state, the masters when they are not the host model's weights
// (some units frozen; --pure_bf16: the bf16 parameters, the step's bf16 gradients, in chunks a
// micro-batch's fp32 sum, and the step's two pieces in fp32), and the stages (offload_stage_numel);
// with an adapter, the streamed layers in the compute type (sharded, the rank's shards of them, beside
// its fp32 shards as loaded; QLoRA's runs, or their shards, are counted as held)
#define BACKEND_HOST_PLAN
enum { HOST_PLAN_PARTS = 5 };
static const char *const host_plan_names[HOST_PLAN_PARTS] = {"base weights (fp32: held, or streamed)", "LoRA weights and grads",
                                                             "checkpoint staging", "offloaded grads and optimizer state",
                                                             "layer inputs (pinned)"};
static const int host_plan_always = 4; // the parts listed when empty (the later ones, when a run has them)
static double model_host_bytes(const Model *m, int part) {
    const HostModel *h = &m->host;
    if (part == 4) return m->activation_offloading ? (double)inputs_kept(m) * resid_bytes(m) : 0; // (support/act_offload.cuh)
    if (part == 3 && !m->cpu_offload) return 0;
    if (part == 3) {
        double n = (double)m->n_train, stages = 2.0 * offload_stage_numel(m) * sizeof(float);
        double masters = m->pure_bf16 ? n * sizeof(bf16) : m->n_runs == 1 ? 0 : n * sizeof(float);
        double grads = (m->pure_bf16 ? n * sizeof(bf16) : 0) + (!m->pure_bf16 || pure_bf16_chunked(m) ? n * sizeof(float) : 0);
        double pieces = m->pure_bf16 ? 2.0 * std::min(UPLOAD_PIECE, m->n_train) * sizeof(float) : 0;
        return masters + grads + (double)optimizer_state_bytes(&m->optimizer, &m->opt_tensors, m->n_train) + stages + pieces;
    }
    double pinned = m->base_offload && h->quant_type == QUANT_NONE ? (double)h->config.n_layers * layer_bytes(m) : 0;
    if (part == 0 && h->base_deferred) // (a tied embedding whole, or this rank's shard of it; the layers streamed, pinned)
        return MODEL_STREAM_PIECE * sizeof(float) + (h->config.tied ? (m->sharded ? h->units.units[0].shard : h->units.units[0].numel) * sizeof(float) : 0) +
               pinned;
    if (part == 0) return model_weight_bytes(h) - (h->quant_type != QUANT_NONE ? model_quant_scratch_bytes(h) : 0) + pinned;
    if (part == 1) return h->use_lora ? 2.0 * h->lora.num_params * sizeof(float) : 0;
    return (double)optimizer_staging_bytes(&m->optimizer, &m->opt_tensors, m->n_train);
}
static const char *const model_host_advice = "";
static const char *const backend_precisions[] = {"bf16", "fp16", "fp32"};
static const int backend_sharding = 1; // any number of ranks, every strategy
static const int backend_context_parallel = 2; // --context_parallel, with what its tests cover (model_forward_backward, model_forward)
static const char *const backend_collectives[] = {"auto", "nccl", "host"};
#define BACKEND_BASE_OFFLOAD // --cpu_offload with an adapter: m->base_offload, m->peak_tflops, base_offload_plan
#define BACKEND_ACTIVATION_OFFLOAD // --activation_offloading: m->activation_offloading, activation_offload_plan
static const int backend_activation_offloading = 1; // (options.h's refusals: what the layer-major schedule does not run)
#define BACKEND_PREFERENCE // --objective dpo and orpo (trainer/preference.h): loss_weights, target_losses, model_reference_swap
#define BACKEND_SHARED_PROMPT // --shared_prompt: shared_prompt (chunk.h's rows_share)

// ----------------------------------------------------------------------------
// the host side: options, loading, the training loop, checkpoints, main

#include "trainer.h"

#ifndef TESTING
int main(int argc, char **argv) { return train_main(argc, argv); }
#endif
