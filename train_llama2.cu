/*
CUDA trainer for Llama-2-family models: the GPU backend of trainer.h, with the
structure and the names of train_llama2.c's CPU backend, which judges it
(test/test_llama2cu.cu runs both on the same model and batch).

Precision (DESIGN section 6). --precision bf16, the default, stores the base
weights and the activations in bf16; cuBLASLt accumulates in fp32; RMSNorm
statistics, softmax, the log-sum-exp, the logits and the loss are fp32; the
trainable parameters keep fp32 masters, fp32 gradients and fp32 AdamW moments,
and AdamW writes the bf16 copy the matmuls read. --precision fp32 runs every
tensor in fp32 (true fp32, no TF32), to compare with the CPU twin tightly.
The compute type is a template parameter, floatX (float or bf16), of every
function below; the Model holds the buffers of one of them, and the backend's
entry points pick floatX once (with_precision).

Chunked training (DESIGN section 4) runs exactly as on the CPU: chunk_forward,
chunk_head and chunk_backward per chunk, the KV carry and the dKV carry, the
keep and recompute memory modes, the output head in --num_output_chunks pieces.
Whole-sequence training is the chunk C = T.

Sharding (fsdp.h, NCCL) is not here yet: this backend runs one rank (W = 1).
The seam is the trainable flat buffers (Model.params, Model.grads): with W > 1
the gradients are reduced between model_forward_backward and optimizer_step,
and the frozen base weights (Buffers.weights) are gathered per unit before use.

Shapes: B rows of T tokens in chunks of C, D = hidden_size, H = intermediate_size,
NH / NKV = attention / key-value heads, hd = head_dim, V = vocab_size.
*/
#include "model.h"
#include "cuda_common.cuh"
#include "matmul.cuh"
#include "layers.cuh"
#include "attention.cuh"
#include "lora.cuh"

#define LAYER(buf, l, size) ((buf) + (size_t)(l) * (size))

// ----------------------------------------------------------------------------
// device buffers

// hands out consecutive pieces of one allocation; a first pass with base NULL
// only counts the bytes. Each piece starts 256-byte aligned (cuBLASLt and the
// tensor-core attention want aligned rows).
struct Layout {
    char *base = NULL;
    size_t bytes = 0;
    template <typename E> void place(E *&p, size_t n) {
        if (base) p = (E *)(base + bytes);
        bytes += (n * sizeof(E) + 255) / 256 * 256;
    }
};

// the base weights' tensors in a flat buffer, P_* order (model.h)
template <typename E> struct Tensors { E *t[NUM_PARAM_TENSORS]; };

// the tensors of a device buffer laid out as the host's params (param_layout's
// order, the head at the embedding when tied): each at its host offset
template <typename E> Tensors<E> tensors_at(const HostModel *h, E *base) {
    float *hp[NUM_PARAM_TENSORS];
    param_tensors(&h->w, hp);
    Tensors<E> t;
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) t.t[p] = base + (hp[p] - h->params);
    return t;
}

// one chunk's activations, kept from its forward for its backward
template <typename floatX> struct ChunkActs {
    floatX *resid;      // (L+1, B, C, D) input of each layer, and the final residual
    floatX *ln1;        // (L, B, C, D)
    float *rstd1;       // (L, B, C)
    floatX *q;          // (L, B, C, NH*hd) after RoPE
    float *lse;         // (L, B, NH, C) log-sum-exp of each query's attention scores
    floatX *atty;       // (L, B, C, NH*hd) attention output
    floatX *resid_mid;  // (L, B, C, D) after the attention block
    floatX *ln2;        // (L, B, C, D)
    float *rstd2;       // (L, B, C)
    floatX *gate;       // (L, B, C, H) pre-activation
    floatX *up;         // (L, B, C, H)
    floatX *hmlp;       // (L, B, C, H) silu(gate) * up
    floatX *lora_h;     // (L, 7, B, C, r) LoRA A-projections
};

// everything on the device that is stored in the compute type
template <typename floatX> struct Buffers {
    floatX *weights;    // (num_params) base weights, param_layout's order: frozen (LoRA), or the
                        // trainable ones (the fp32 masters themselves, or AdamW's bf16 copy)
    Tensors<floatX> w;  // their tensors
    floatX *lora_w;     // (LoRA num_params) A and B for the matmuls (the masters, or AdamW's bf16 copy)
    ChunkActs<floatX> *chunk; // (n_slots) one per chunk in keep mode, one in all in recompute mode
    floatX *k, *v;      // (L, B, T, NKV*hd) the KV carry (keys after RoPE)
    floatX *dk, *dv;    // (L, B, T, NKV*hd) the dKV carry: gradients for earlier positions
    // scratch for one chunk
    floatX *lnf;        // (B, C, D)
    floatX *dlogits;    // (ceil(C / num_output_chunks), V) bf16: the logits' gradient for the head's backward
    floatX *kv;         // (B, C, NKV*hd) a chunk's keys or values before they enter the carry
    floatX *dresid;     // (B, C, D)
    floatX *dln;        // (B, C, D)
    floatX *dq, *datty; // (B, C, NH*hd)
    floatX *dgate, *dup, *dhmlp; // (B, C, H)
    floatX *lora_dh;    // (B, C, r)
    floatX *xdrop;      // (B, C, max(D, H, NH*hd)) LoRA dropout scratch
};

// the CUDA backend's model (trainer.h lists what every backend's Model holds)
typedef struct {
    HostModel host;           // config, fp32 weights, LoRA layout: loaded here, uploaded, saved from here
    int fp32;                 // --precision fp32: every tensor fp32 (else bf16 storage)
    Buffers<float> f32;       // the buffers of the run's precision (the other stays empty)
    Buffers<bf16> b16;
    // the trainable parameters, flat (LoRA's layout, or param_layout's), fp32 in either precision
    float *params, *grads;    // (n_train) masters and gradients
    float *adam_m, *adam_v;   // (n_train) AdamW moments (the Optimizer's; here so the fit check counts them)
    size_t n_train;
    bf16 *params_bf16;        // bf16: the copy of params the matmuls read (in b16.weights or b16.lora_w)
    Tensors<float> g;         // full fine-tuning: the base weights' gradients, in grads
    // fp32 in either precision
    float *rope_cos, *rope_sin; // (T, hd/2)
    float *rstdf;             // (B, C) the final norm's statistics
    float *logits;            // (ceil(C / num_output_chunks), V) one piece of one row at a time
    float *losses;            // (B, T) each position's cross-entropy (0 without a target)
    double *loss_sum;         // the micro-batch's summed loss
    double *grad_norm;        // the step's gradient norm
    float *next_logits;       // (V) host: model_next_logits' result
    int *tokens, *targets;    // (B, T) the micro-batch
    int *chunk_tokens;        // (B, C)
    int B, T;                 // activation capacity
    int chunk_size;           // C (== T: whole sequence)
    int recompute;            // chunk memory mode: 1 recompute, 0 keep
    int num_output_chunks;    // the output head runs in this many pieces of a chunk
    int n_slots;
    size_t weight_bytes, param_bytes, act_bytes, carry_bytes; // device memory by purpose (the memory plan)
    void *alloc[4];           // the four allocations behind them
    double peak_mb;           // the most device memory seen in use (model_peak_mb)
    uint64_t dropout_key;     // set per micro-batch by the training loop
    int row0;                 // set by the trainer: this rank's first row in the global micro-batch
    Fsdp *fsdp;               // set by the trainer (this backend runs one process: backend_sharding)
    cudaStream_t stream;      // everything runs on this one stream, in order
} Model;

template <typename floatX> Buffers<floatX> &buffers(Model *m);
template <> Buffers<float> &buffers<float>(Model *m) { return m->f32; }
template <> Buffers<bf16> &buffers<bf16>(Model *m) { return m->b16; }

// calls f(type_identity<floatX>()) with the run's compute type
template <typename F> auto with_precision(const Model *m, F f) {
    return m->fp32 ? f(type_identity<float>()) : f(type_identity<bf16>());
}

// ----------------------------------------------------------------------------
// building the model's buffers

// lays out one chunk's activations
template <typename floatX> void chunk_acts_layout(const Config *c, int B, int C, int r, ChunkActs<floatX> *s, Layout *a) {
    size_t L = c->n_layers, N = (size_t)B * C, D = c->dim, H = c->hidden_dim, Q = (size_t)c->n_heads * c->head_dim;
    a->place(s->resid, (L + 1) * N * D); a->place(s->ln1, L * N * D); a->place(s->rstd1, L * N);
    a->place(s->q, L * N * Q); a->place(s->lse, L * N * c->n_heads); a->place(s->atty, L * N * Q);
    a->place(s->resid_mid, L * N * D); a->place(s->ln2, L * N * D); a->place(s->rstd2, L * N);
    a->place(s->gate, L * N * H); a->place(s->up, L * N * H); a->place(s->hmlp, L * N * H);
    a->place(s->lora_h, L * LORA_N_TARGETS * N * r);
}

// Lays out every device buffer in four allocations: w the base weights, p the
// trainable parameters (masters, gradients, moments, bf16 copy), a the
// activations and scratch, k the KV and dKV carries. Called once to count, once to place.
template <typename floatX> void model_layout(Model *m, Layout *w, Layout *p, Layout *a, Layout *k) {
    const HostModel *h = &m->host;
    const Config *c = &h->config;
    Buffers<floatX> &d = buffers<floatX>(m);
    bool fp32 = std::is_same<floatX, float>::value;
    size_t L = c->n_layers, N = (size_t)m->B * m->chunk_size, D = c->dim, H = c->hidden_dim, V = c->vocab_size;
    size_t Q = (size_t)c->n_heads * c->head_dim, KV = (size_t)c->n_kv_heads * c->head_dim;
    size_t r = h->use_lora ? h->lora.r : 0, widest = std::max(std::max(D, H), Q);
    size_t piece = (m->chunk_size + m->num_output_chunks - 1) / m->num_output_chunks;
    // trainable: fp32 masters and gradients; in bf16 the matmuls read a bf16 copy
    p->place(m->params, m->n_train);
    p->place(m->grads, m->n_train);
    p->place(m->adam_m, m->n_train);
    p->place(m->adam_v, m->n_train);
    if (!fp32) p->place(m->params_bf16, m->n_train);
    // frozen base weights (LoRA); trained ones are the masters or their bf16 copy (model_alloc)
    if (!h->full_finetune) w->place(d.weights, h->num_params);
    // activations: one slot per chunk (keep) or one (recompute), then one chunk's scratch
    for (int i = 0; i < m->n_slots; i++) chunk_acts_layout(c, m->B, m->chunk_size, (int)r, &d.chunk[i], a);
    a->place(d.lnf, N * D);
    if (!fp32) a->place(d.dlogits, piece * V);
    a->place(d.kv, N * KV); a->place(d.dresid, N * D); a->place(d.dln, N * D);
    a->place(d.dq, N * Q); a->place(d.datty, N * Q);
    a->place(d.dgate, N * H); a->place(d.dup, N * H); a->place(d.dhmlp, N * H);
    a->place(d.lora_dh, N * r); a->place(d.xdrop, h->use_lora ? N * widest : 0);
    a->place(m->rstdf, N); a->place(m->logits, piece * V);
    a->place(m->losses, (size_t)m->B * m->T); a->place(m->loss_sum, 1); a->place(m->grad_norm, 1);
    a->place(m->tokens, (size_t)m->B * m->T); a->place(m->targets, (size_t)m->B * m->T); a->place(m->chunk_tokens, N);
    a->place(m->rope_cos, (size_t)m->T * c->head_dim / 2); a->place(m->rope_sin, (size_t)m->T * c->head_dim / 2);
    // the carries hold the whole sequence
    size_t carry = L * m->B * (size_t)m->T * KV;
    k->place(d.k, carry); k->place(d.v, carry); k->place(d.dk, carry); k->place(d.dv, carry);
}

// dst (n, floatX) on the device = src (n, fp32) on the host; bf16 is converted on
// the device in pieces, so the model never needs an fp32 copy of itself there
template <typename floatX> void upload(floatX *dst, const float *src, size_t n, cudaStream_t stream) {
    if constexpr (std::is_same<floatX, float>::value) {
        cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream));
    } else {
        size_t piece = std::min(n, (size_t)1 << 24);
        float *stage = (float *)cudaMallocCheck(piece * sizeof(float));
        for (size_t i = 0; i < n; i += piece) { // in stream order: a piece's convert runs before the next copy
            size_t k = std::min(piece, n - i);
            cudaCheck(cudaMemcpyAsync(stage, src + i, k * sizeof(float), cudaMemcpyHostToDevice, stream));
            convert(dst + i, stage, k, stream);
        }
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(stage));
    }
}

// Before anything is allocated: does the run fit? If not, say what it needs, by
// purpose, against what is free, and what to change.
static void check_fits(const Model *m, size_t w, size_t p, size_t a, size_t k) {
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    size_t need = w + p + a + k + CUBLASLT_WORKSPACE_BYTES;
    if (need <= free_bytes) return;
    const double MiB = 1048576.0;
    fprintf(stderr, "error: out of GPU memory: this run needs %.1f MiB but %.1f of %.1f MiB are free:\n"
            "  base weights (%s) %.1f MiB, trainable parameters and gradients %.1f MiB,\n"
            "  activations and scratch %.1f MiB (B = %d, chunks of %d, %s), KV and dKV carry %.1f MiB (T = %d)\n"
            "  hint: %s\n", need / MiB, free_bytes / MiB, total_bytes / MiB, m->fp32 ? "fp32" : "bf16", w / MiB,
            p / MiB, a / MiB, m->B, m->chunk_size, m->recompute ? "recompute" : "keep", k / MiB, m->T,
            cuda_error_hint(cudaErrorMemoryAllocation));
    exit(EXIT_FAILURE);
}

// Device buffers for micro-batches of up to B rows of T tokens, run in chunks of
// C positions (C = 0: T), and the host model (loaded by model_setup) uploaded.
static void model_alloc(Model *m, int B, int T, int C, int recompute, int num_output_chunks) {
    HostModel *h = &m->host;
    const Config *c = &h->config;
    if (C <= 0 || C > T) C = T;
    m->B = B; m->T = T; m->chunk_size = C; m->recompute = recompute; m->num_output_chunks = num_output_chunks;
    m->n_slots = recompute ? 1 : (T + C - 1) / C;
    m->n_train = h->use_lora ? h->lora.num_params : h->num_params;
    cudaCheck(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    matmul_setup();
    m->next_logits = (float *)mallocCheck((size_t)c->vocab_size * sizeof(float));
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        Buffers<floatX> &d = buffers<floatX>(m);
        d.chunk = (ChunkActs<floatX> *)callocCheck(m->n_slots, sizeof(ChunkActs<floatX>));
        Layout lay[4]; // weights, trainable, activations, carry
        model_layout<floatX>(m, &lay[0], &lay[1], &lay[2], &lay[3]);
        check_fits(m, lay[0].bytes, lay[1].bytes, lay[2].bytes, lay[3].bytes);
        for (int i = 0; i < 4; i++) {
            m->alloc[i] = cudaMallocCheck(lay[i].bytes + 1); // + 1: a valid pointer also when empty
            lay[i] = Layout{(char *)m->alloc[i], 0};
        }
        model_layout<floatX>(m, &lay[0], &lay[1], &lay[2], &lay[3]);
        m->weight_bytes = lay[0].bytes; m->param_bytes = lay[1].bytes; m->act_bytes = lay[2].bytes; m->carry_bytes = lay[3].bytes;
        // the trainable masters, then the weights the matmuls read
        cudaStream_t st = m->stream;
        upload(m->params, h->use_lora ? h->lora.params : h->params, m->n_train, st);
        cudaCheck(cudaMemsetAsync(m->grads, 0, m->n_train * sizeof(float), st));
        cudaCheck(cudaMemsetAsync(m->adam_m, 0, m->n_train * sizeof(float), st));
        cudaCheck(cudaMemsetAsync(m->adam_v, 0, m->n_train * sizeof(float), st));
        if (h->full_finetune) {
            m->g = tensors_at(h, m->grads);
            if constexpr (std::is_same<floatX, float>::value) d.weights = m->params;
            else { d.weights = m->params_bf16; convert(d.weights, m->params, m->n_train, st); }
        } else {
            upload(d.weights, h->params, h->num_params, st);
            if constexpr (std::is_same<floatX, float>::value) d.lora_w = m->params;
            else { d.lora_w = m->params_bf16; convert(d.lora_w, m->params, m->n_train, st); }
        }
        d.w = tensors_at(h, d.weights);
        rope_tables(m->rope_cos, m->rope_sin, T, c->head_dim, c->rope_theta);
        cudaCheck(cudaDeviceSynchronize()); // rope_tables copies on the legacy stream, which st does not wait for
    });
}

// (a model whose setup failed before model_alloc has no device memory: no CUDA call then)
static void model_free(Model *m) {
    for (int i = 0; i < 4; i++)
        if (m->alloc[i]) cudaCheck(cudaFree(m->alloc[i]));
    if (m->stream) cudaCheck(cudaStreamDestroy(m->stream));
    free(m->f32.chunk);
    free(m->b16.chunk);
    free(m->next_logits);
    host_model_free(&m->host);
    memset(m, 0, sizeof *m);
}

// ----------------------------------------------------------------------------
// forward and backward of one micro-batch, chunk by chunk (DESIGN section 4)

// a base linear layer plus its LoRA adapter, if any: out (N, O) = inp (N, I) W^T + lora, N = B * len
template <typename floatX>
void linear_forward(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int layer, int t, floatX *out, const floatX *inp,
                    const floatX *w) {
    LoRA *l = &m->host.lora;
    Buffers<floatX> &d = buffers<floatX>(m);
    int in[LORA_N_TARGETS], outd[LORA_N_TARGETS], N = ch->B * ch->len;
    lora_shapes(&m->host.config, in, outd);
    matmul_forward(out, inp, w, N, in[t], outd[t], 1.0f, 0, m->stream);
    if (m->host.use_lora && (l->targets & (1u << t))) {
        floatX *h = s->lora_h + ((size_t)layer * LORA_N_TARGETS + t) * N * l->r;
        Chunk dc = lora_dropout_chunk(ch, m->row0);
        lora_forward(l, d.lora_w, layer, t, out, inp, h, d.xdrop, &dc, m->dropout_key, m->stream);
    }
}
// dinp (N, I) += dout W (+ LoRA); dW += dout^T inp when training the base weights
template <typename floatX>
void linear_backward(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int layer, int t, floatX *dinp, float *dw,
                     const floatX *dout, const floatX *inp, const floatX *w) {
    LoRA *l = &m->host.lora;
    Buffers<floatX> &d = buffers<floatX>(m);
    int in[LORA_N_TARGETS], outd[LORA_N_TARGETS], N = ch->B * ch->len;
    lora_shapes(&m->host.config, in, outd);
    matmul_backward(dinp, m->host.full_finetune ? dw : NULL, dout, inp, w, N, in[t], outd[t], 1.0f, m->stream);
    if (m->host.use_lora && (l->targets & (1u << t))) {
        const floatX *h = s->lora_h + ((size_t)layer * LORA_N_TARGETS + t) * N * l->r;
        Chunk dc = lora_dropout_chunk(ch, m->row0);
        lora_backward(l, d.lora_w, m->grads, layer, t, dinp, dout, inp, h, d.lora_dh, d.xdrop, &dc, m->dropout_key,
                      m->stream);
    }
}

// the chunk's tokens (B, len) out of the micro-batch's (B, T), both on the device
static void chunk_tokens(int *dst, const int *tokens, const Chunk *ch, cudaStream_t stream) {
    size_t row = ch->len * sizeof(int);
    cudaCheck(cudaMemcpy2DAsync(dst, row, tokens + ch->t0, ch->T * sizeof(int), row, ch->B, cudaMemcpyDeviceToDevice,
                                stream));
}
// a chunk's rows x (B, len, w) into the carry (B, T, w), or back out (dir = -1)
template <typename floatX> void carry_copy(floatX *carry, floatX *x, const Chunk *ch, size_t w, int dir,
                                           cudaStream_t stream) {
    size_t row = ch->len * w * sizeof(floatX), pitch = ch->T * w * sizeof(floatX);
    floatX *c = carry + ch->t0 * w;
    if (dir > 0) cudaCheck(cudaMemcpy2DAsync(c, pitch, x, row, row, ch->B, cudaMemcpyDeviceToDevice, stream));
    else cudaCheck(cudaMemcpy2DAsync(x, row, c, pitch, row, ch->B, cudaMemcpyDeviceToDevice, stream));
}

// Forward of one chunk through every decoder layer into the activations s,
// appending the chunk's keys and values to the KV carry. The micro-batch's
// tokens are in m->tokens.
template <typename floatX> void chunk_forward(Model *m, ChunkActs<floatX> *s, const Chunk *ch) {
    Config *c = &m->host.config;
    Buffers<floatX> &d = buffers<floatX>(m);
    Tensors<floatX> &w = d.w;
    cudaStream_t st = m->stream;
    int N = ch->B * ch->len, D = c->dim, H = c->hidden_dim, NH = c->n_heads, NKV = c->n_kv_heads, hd = c->head_dim;
    size_t Q = (size_t)NH * hd, KV = (size_t)NKV * hd, ND = (size_t)N * D, NHd = (size_t)N * H;
    size_t carry = (size_t)ch->B * ch->T * KV;
    chunk_tokens(m->chunk_tokens, m->tokens, ch, st);
    embedding_forward(s->resid, m->chunk_tokens, w.t[P_EMBED], N, D, st);
    for (int l = 0; l < c->n_layers; l++) {
        floatX *x = LAYER(s->resid, l, ND), *ln1 = LAYER(s->ln1, l, ND), *q = LAYER(s->q, l, N * Q);
        floatX *atty = LAYER(s->atty, l, N * Q), *mid = LAYER(s->resid_mid, l, ND), *ln2 = LAYER(s->ln2, l, ND);
        floatX *gate = LAYER(s->gate, l, NHd), *up = LAYER(s->up, l, NHd), *hm = LAYER(s->hmlp, l, NHd);
        floatX *out = LAYER(s->resid, l + 1, ND), *kc = LAYER(d.k, l, carry), *vc = LAYER(d.v, l, carry);
        rmsnorm_forward(ln1, LAYER(s->rstd1, l, N), x, LAYER(w.t[P_ATTN_NORM], l, D), N, D, c->norm_eps, st);
        linear_forward(m, s, ch, l, LORA_Q, q, ln1, LAYER(w.t[P_WQ], l, Q * D));
        rope_forward(q, m->rope_cos, m->rope_sin, ch, NH, hd, 0, st);
        linear_forward(m, s, ch, l, LORA_K, d.kv, ln1, LAYER(w.t[P_WK], l, KV * D));
        rope_forward(d.kv, m->rope_cos, m->rope_sin, ch, NKV, hd, 0, st);
        carry_copy(kc, d.kv, ch, KV, 1, st);
        linear_forward(m, s, ch, l, LORA_V, d.kv, ln1, LAYER(w.t[P_WV], l, KV * D));
        carry_copy(vc, d.kv, ch, KV, 1, st);
        attention_forward(atty, LAYER(s->lse, l, (size_t)N * NH), q, kc, vc, ch, NH, NKV, hd, st);
        linear_forward(m, s, ch, l, LORA_O, mid, atty, LAYER(w.t[P_WO], l, D * Q));
        accumulate(mid, x, ND, st);
        rmsnorm_forward(ln2, LAYER(s->rstd2, l, N), mid, LAYER(w.t[P_MLP_NORM], l, D), N, D, c->norm_eps, st);
        linear_forward(m, s, ch, l, LORA_GATE, gate, ln2, LAYER(w.t[P_WGATE], l, (size_t)H * D));
        linear_forward(m, s, ch, l, LORA_UP, up, ln2, LAYER(w.t[P_WUP], l, (size_t)H * D));
        swiglu_forward(hm, gate, up, NHd, st);
        linear_forward(m, s, ch, l, LORA_DOWN, out, hm, LAYER(w.t[P_WDOWN], l, (size_t)D * H));
        accumulate(out, mid, ND, st);
    }
}

// Final norm, output head and cross-entropy of one chunk: each position's loss
// goes to m->losses (the micro-batch sums them once at its end). The head runs
// on pieces of ceil(len / num_output_chunks) positions of one row at a time, so
// full-vocabulary logits (fp32) exist only for a piece. With grad_scale != 0
// each piece's d(grad_scale * loss)/d(logits) is formed in place while its
// logits are at hand, and d.dresid ends up holding d loss / d(final residual)
// for the chunk. logits_out (B, T, V, host), when given, receives the logits.
template <typename floatX> void chunk_head(Model *m, ChunkActs<floatX> *s, const Chunk *ch, float grad_scale,
                                           float *logits_out) {
    Config *c = &m->host.config;
    Buffers<floatX> &d = buffers<floatX>(m);
    cudaStream_t st = m->stream;
    int N = ch->B * ch->len, D = c->dim, V = c->vocab_size, full = m->host.full_finetune;
    int piece = (ch->len + m->num_output_chunks - 1) / m->num_output_chunks;
    const floatX *xL = LAYER(s->resid, c->n_layers, (size_t)N * D), *head = d.w.t[P_HEAD];
    rmsnorm_forward(d.lnf, m->rstdf, xL, d.w.t[P_NORM], N, D, c->norm_eps, st);
    if (grad_scale != 0.0f) cudaCheck(cudaMemsetAsync(d.dln, 0, (size_t)N * D * sizeof(floatX), st));
    for (int b = 0; b < ch->B; b++)
        for (int p0 = 0; p0 < ch->len; p0 += piece) {
            int n = std::min(ch->len - p0, piece);
            size_t row = (size_t)b * ch->len + p0, pos = (size_t)b * ch->T + ch->t0 + p0; // in the chunk, in the batch
            const floatX *xf = d.lnf + row * D;
            matmul_forward(m->logits, xf, head, n, D, V, 1.0f, 0, st); // (n, V) in fp32
            if (logits_out)
                cudaCheck(cudaMemcpyAsync(logits_out + pos * V, m->logits, (size_t)n * V * sizeof(float),
                                          cudaMemcpyDeviceToHost, st));
            crossentropy_forward_backward(m->logits, m->losses + pos, m->targets + pos, n, V, grad_scale, st);
            if (grad_scale == 0.0f) continue;
            const floatX *dlogits;
            if constexpr (std::is_same<floatX, float>::value) dlogits = m->logits;
            else { convert(d.dlogits, m->logits, (size_t)n * V, st); dlogits = d.dlogits; }
            matmul_backward(d.dln + row * D, full ? m->g.t[P_HEAD] : NULL, dlogits, xf, head, n, D, V, 1.0f, st);
        }
    if (grad_scale != 0.0f) {
        cudaCheck(cudaMemsetAsync(d.dresid, 0, (size_t)N * D * sizeof(floatX), st));
        rmsnorm_backward(d.dresid, full ? m->g.t[P_NORM] : NULL, d.dln, xL, d.w.t[P_NORM], m->rstdf, N, D, st);
    }
}

// Backward of one chunk through every decoder layer, from d.dresid (chunk_head's).
// At each layer's attention the chunk adds dK, dV for every position before its
// end into the dKV carry; its own rows are complete then (later chunks ran
// first), so they flow on through its key and value projections at once.
template <typename floatX> void chunk_backward(Model *m, ChunkActs<floatX> *s, const Chunk *ch) {
    Config *c = &m->host.config;
    Buffers<floatX> &d = buffers<floatX>(m);
    Tensors<floatX> &w = d.w;
    Tensors<float> &g = m->g;
    cudaStream_t st = m->stream;
    int N = ch->B * ch->len, D = c->dim, H = c->hidden_dim, NH = c->n_heads, NKV = c->n_kv_heads, hd = c->head_dim;
    size_t Q = (size_t)NH * hd, KV = (size_t)NKV * hd, ND = (size_t)N * D, NHd = (size_t)N * H;
    size_t carry = (size_t)ch->B * ch->T * KV;
    int full = m->host.full_finetune;
    for (int l = c->n_layers - 1; l >= 0; l--) {
        floatX *x = LAYER(s->resid, l, ND), *ln1 = LAYER(s->ln1, l, ND), *q = LAYER(s->q, l, N * Q);
        floatX *atty = LAYER(s->atty, l, N * Q), *mid = LAYER(s->resid_mid, l, ND), *ln2 = LAYER(s->ln2, l, ND);
        floatX *gate = LAYER(s->gate, l, NHd), *up = LAYER(s->up, l, NHd), *hm = LAYER(s->hmlp, l, NHd);
        floatX *kc = LAYER(d.k, l, carry), *vc = LAYER(d.v, l, carry);
        floatX *dkc = LAYER(d.dk, l, carry), *dvc = LAYER(d.dv, l, carry);
        // MLP block; the residual passes dresid through unchanged
        cudaCheck(cudaMemsetAsync(d.dhmlp, 0, NHd * sizeof(floatX), st));
        linear_backward(m, s, ch, l, LORA_DOWN, d.dhmlp, full ? LAYER(g.t[P_WDOWN], l, (size_t)D * H) : NULL, d.dresid,
                        hm, LAYER(w.t[P_WDOWN], l, (size_t)D * H));
        swiglu_backward(d.dgate, d.dup, d.dhmlp, gate, up, NHd, st);
        cudaCheck(cudaMemsetAsync(d.dln, 0, ND * sizeof(floatX), st));
        linear_backward(m, s, ch, l, LORA_GATE, d.dln, full ? LAYER(g.t[P_WGATE], l, (size_t)H * D) : NULL, d.dgate,
                        ln2, LAYER(w.t[P_WGATE], l, (size_t)H * D));
        linear_backward(m, s, ch, l, LORA_UP, d.dln, full ? LAYER(g.t[P_WUP], l, (size_t)H * D) : NULL, d.dup, ln2,
                        LAYER(w.t[P_WUP], l, (size_t)H * D));
        rmsnorm_backward(d.dresid, full ? LAYER(g.t[P_MLP_NORM], l, D) : NULL, d.dln, mid,
                         LAYER(w.t[P_MLP_NORM], l, D), LAYER(s->rstd2, l, N), N, D, st);
        // attention block
        cudaCheck(cudaMemsetAsync(d.datty, 0, (size_t)N * Q * sizeof(floatX), st));
        linear_backward(m, s, ch, l, LORA_O, d.datty, full ? LAYER(g.t[P_WO], l, D * Q) : NULL, d.dresid, atty,
                        LAYER(w.t[P_WO], l, D * Q));
        attention_backward(d.dq, dkc, dvc, d.datty, atty, LAYER(s->lse, l, (size_t)N * NH), q, kc, vc, ch, NH, NKV, hd,
                           st);
        rope_backward(d.dq, m->rope_cos, m->rope_sin, ch, NH, hd, st);
        cudaCheck(cudaMemsetAsync(d.dln, 0, ND * sizeof(floatX), st));
        linear_backward(m, s, ch, l, LORA_Q, d.dln, full ? LAYER(g.t[P_WQ], l, Q * D) : NULL, d.dq, ln1,
                        LAYER(w.t[P_WQ], l, Q * D));
        carry_copy(dkc, d.kv, ch, KV, -1, st);
        rope_backward(d.kv, m->rope_cos, m->rope_sin, ch, NKV, hd, st);
        linear_backward(m, s, ch, l, LORA_K, d.dln, full ? LAYER(g.t[P_WK], l, KV * D) : NULL, d.kv, ln1,
                        LAYER(w.t[P_WK], l, KV * D));
        carry_copy(dvc, d.kv, ch, KV, -1, st);
        linear_backward(m, s, ch, l, LORA_V, d.dln, full ? LAYER(g.t[P_WV], l, KV * D) : NULL, d.kv, ln1,
                        LAYER(w.t[P_WV], l, KV * D));
        rmsnorm_backward(d.dresid, full ? LAYER(g.t[P_ATTN_NORM], l, D) : NULL, d.dln, x,
                         LAYER(w.t[P_ATTN_NORM], l, D), LAYER(s->rstd1, l, N), N, D, st);
    }
    if (full) {
        chunk_tokens(m->chunk_tokens, m->tokens, ch, st); // a later chunk's forward replaced them (keep mode)
        embedding_backward(g.t[P_EMBED], d.dresid, m->chunk_tokens, N, D, st);
    }
}

// Checks a micro-batch on the host (a token outside the vocabulary would make
// the embedding read out of bounds on the device), then copies it there.
static void upload_batch(Model *m, const int *tokens, const int *targets, int B, int T) {
    if (B > m->B || T > m->T) die("internal: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, m->B, m->T);
    int V = m->host.config.vocab_size;
    for (int i = 0; i < B * T; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) die("token id %d at position %d is outside the vocabulary (%d)", tokens[i], i, V);
        if (targets[i] >= V) die("target id %d at position %d is outside the vocabulary (%d)", targets[i], i, V);
    }
    cudaCheck(cudaMemcpyAsync(m->tokens, tokens, (size_t)B * T * sizeof(int), cudaMemcpyHostToDevice, m->stream));
    cudaCheck(cudaMemcpyAsync(m->targets, targets, (size_t)B * T * sizeof(int), cudaMemcpyHostToDevice, m->stream));
}

// the sum of the micro-batch's per-position losses (B, T), on the host
static double losses_sum(Model *m, int B, int T) {
    double loss;
    global_sum(m->loss_sum, m->losses, (size_t)B * T, m->stream);
    cudaCheck(cudaMemcpyAsync(&loss, m->loss_sum, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    return loss;
}

static Chunk chunk_at(const Model *m, int B, int T, int j) {
    Chunk ch = {B, T, j * m->chunk_size, m->chunk_size};
    if (ch.t0 + ch.len > T) ch.len = T - ch.t0; // the last chunk may be shorter
    return ch;
}

// The summed cross-entropy of B rows of T tokens over targets != -100 (no
// gradients: evaluation, tests). logits_out as in chunk_head.
static double model_forward(Model *m, const int *tokens, const int *targets, int B, int T, float *logits_out) {
    upload_batch(m, tokens, targets, B, T);
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        ChunkActs<floatX> *s = &buffers<floatX>(m).chunk[0];
        for (int j = 0; j * m->chunk_size < T; j++) {
            Chunk ch = chunk_at(m, B, T, j);
            chunk_forward(m, s, &ch);
            chunk_head(m, s, &ch, 0.0f, logits_out);
        }
    });
    return losses_sum(m, B, T);
}

// Forward and backward of one micro-batch: returns the summed cross-entropy and
// adds grad_scale * d(loss)/d(parameter) into the gradients of the trainable ones.
// Chunks run forward in order, filling the KV carry, then backward in reverse
// order with the dKV carry; in recompute mode a chunk's forward runs again just
// before its backward (the last chunk's activations are still there).
static double model_forward_backward(Model *m, const int *tokens, const int *targets, int B, int T, float grad_scale) {
    upload_batch(m, tokens, targets, B, T);
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        Buffers<floatX> &d = buffers<floatX>(m);
        const Config *c = &m->host.config;
        size_t carry = (size_t)c->n_layers * B * T * c->n_kv_heads * c->head_dim;
        cudaCheck(cudaMemsetAsync(d.dk, 0, carry * sizeof(floatX), m->stream));
        cudaCheck(cudaMemsetAsync(d.dv, 0, carry * sizeof(floatX), m->stream));
        int n = (T + m->chunk_size - 1) / m->chunk_size;
        for (int j = 0; j < n; j++) {
            Chunk ch = chunk_at(m, B, T, j);
            chunk_forward(m, &d.chunk[m->recompute ? 0 : j], &ch);
        }
        for (int j = n - 1; j >= 0; j--) {
            Chunk ch = chunk_at(m, B, T, j);
            ChunkActs<floatX> *s = &d.chunk[m->recompute ? 0 : j];
            if (m->recompute && j < n - 1) chunk_forward(m, s, &ch);
            chunk_head(m, s, &ch, grad_scale, NULL);
            chunk_backward(m, s, &ch);
        }
    });
    return losses_sum(m, B, T);
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
        rmsnorm_forward(d.lnf, m->rstdf, x, d.w.t[P_NORM], 1, c->dim, c->norm_eps, st);
        matmul_forward(m->logits, d.lnf, d.w.t[P_HEAD], 1, c->dim, c->vocab_size, 1.0f, 0, st);
    });
    cudaCheck(cudaMemcpyAsync(m->next_logits, m->logits, c->vocab_size * sizeof(float), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaStreamSynchronize(st));
    return m->next_logits;
}

// ----------------------------------------------------------------------------
// optimizer: AdamW as torch.optim.AdamW, clipping as torch.nn.utils.clip_grad_norm_,
// on the device (layers.cuh); the host holds the moments only for checkpoints

typedef struct {
    Model *model;           // its trainable parameters, gradients and moments (device)
    size_t n;
    float *m, *v;           // AdamW moments: host copies for checkpoints (model_sync_host, optimizer_sync_device)
    int t;                  // optimizer steps taken
} Optimizer;

// the moments are the model's (model_alloc zeroed them); the host keeps copies
static void optimizer_init(Optimizer *o, Model *m) {
    memset(o, 0, sizeof *o);
    o->model = m;
    o->n = m->n_train;
    o->m = (float *)callocCheck(o->n, sizeof(float));
    o->v = (float *)callocCheck(o->n, sizeof(float));
}

static void optimizer_free(Optimizer *o) {
    free(o->m);
    free(o->v);
    memset(o, 0, sizeof *o);
}

static void optimizer_zero_grad(Optimizer *o) {
    cudaCheck(cudaMemsetAsync(o->model->grads, 0, o->n * sizeof(float), o->model->stream));
}

// the global gradient norm (returned, before clipping); if update and the norm
// is finite, clipping, then AdamW, which also writes the bf16 copy of the
// parameters the next forward reads
static double optimizer_step(Optimizer *o, float lr, float beta1, float beta2, float eps, float weight_decay,
                             float grad_clip, int update) {
    Model *m = o->model;
    double norm;
    grad_norm(m->grad_norm, m->grads, o->n, m->stream);
    cudaCheck(cudaMemcpyAsync(&norm, m->grad_norm, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    if (!update || !isfinite(norm)) return norm; // a skipped step: nothing changes
    clip_grads(m->grads, o->n, m->grad_norm, grad_clip, m->stream);
    o->t++;
    adamw_update(m->params, m->grads, m->adam_m, m->adam_v, o->n, o->t, lr, beta1, beta2, eps, weight_decay,
                 m->params_bf16, m->stream);
    return norm;
}

// the trainable weights into the host model and the moments into o, for a save
static void model_sync_host(Model *m, Optimizer *o) {
    HostModel *h = &m->host;
    cudaStream_t st = m->stream;
    float *dst = h->use_lora ? h->lora.params : h->params;
    cudaCheck(cudaMemcpyAsync(dst, m->params, m->n_train * sizeof(float), cudaMemcpyDeviceToHost, st));
    if (o) {
        cudaCheck(cudaMemcpyAsync(o->m, m->adam_m, o->n * sizeof(float), cudaMemcpyDeviceToHost, st));
        cudaCheck(cudaMemcpyAsync(o->v, m->adam_v, o->n * sizeof(float), cudaMemcpyDeviceToHost, st));
    }
    cudaCheck(cudaStreamSynchronize(st));
}

// the moments a resumed run read from its checkpoint, onto the device
static void optimizer_sync_device(Optimizer *o) {
    Model *m = o->model;
    cudaCheck(cudaMemcpyAsync(m->adam_m, o->m, o->n * sizeof(float), cudaMemcpyHostToDevice, m->stream));
    cudaCheck(cudaMemcpyAsync(m->adam_v, o->v, o->n * sizeof(float), cudaMemcpyHostToDevice, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
}

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
static const char *const backend_memory = "GPU memory";
static const char *const backend_precisions[] = {"bf16", "fp32"};
static const int backend_sharding = 0; // one process (one GPU) for now: NCCL sharding comes next

// ----------------------------------------------------------------------------
// the host side: options, loading, the training loop, checkpoints, main

#include "trainer.h"

#ifndef TESTING
int main(int argc, char **argv) { return train_main(argc, argv); }
#endif
