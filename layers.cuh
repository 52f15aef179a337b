// The layers of the CUDA trainer, forward and backward, with the names and the
// semantics of their CPU twins in train_llama2.c (dev/cuda/ checks each against
// its twin). Tensors are float, __nv_bfloat16 or __half (template T); every kernel reads
// them into fp32 registers, so statistics, softmax and the loss are fp32
// (docs/precision.md). The backward's gradients of trainable parameters are fp32
// (--pure_bf16 rounds them into a bf16 step's gradient: round_bf16, grads_bf16_add).
// Every launcher takes the stream it runs on, and no kernel uses atomics: each
// output is summed in a fixed order, so results repeat bit for bit.
//
// Shapes: N rows (tokens), D = hidden size, V = vocabulary, n = elements.
#pragma once
#include <algorithm>
#include <vector>
#include "support/cuda_common.cuh"
#include "chunk.h"
#include "support/optimizer.h"
#include "support/optimizer_qmap.h"

constexpr int ELEMENTWISE_THREADS = 256;

// ----------------------------------------------------------------------------
// embedding

// out row to[i] = in row from[i] for i < N, rows of D elements (a NULL to or from:
// row i): a gather (from) or a scatter (to; rows not in it keep what they held).
// The embedding's lookup, and chunk_head's moves of the rows that have a target.
template <typename T>
__global__ void copy_rows_kernel(T *out, const int *to, const T *in, const int *from, int N, int D) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * D) return;
    size_t i = idx / D, d = idx % D;
    out[(size_t)(to ? to[i] : i) * D + d] = in[(size_t)(from ? from[i] : i) * D + d];
}
template <typename T>
void copy_rows(T *out, const int *to, const T *in, const int *from, int N, int D, cudaStream_t stream) {
    if (N == 0) return;
    copy_rows_kernel<<<ceil_div((size_t)N * D, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        out, to, in, from, N, D);
    cudaLaunchCheck();
}

// out (N, D) = embed (V, D) rows of tokens (N)
template <typename T>
void embedding_forward(T *out, const int *tokens, const T *embed, int N, int D, cudaStream_t stream) {
    copy_rows(out, (const int *)NULL, embed, tokens, N, D, stream);
}

// dembed (V, D) += dout (N, D) scattered to the rows of tokens. One thread per
// column adds the N rows in token order, exactly as the CPU does: repeated tokens
// need no atomics and the fp32 sums match the CPU's bit for bit. Only D threads
// run, but this runs once per micro-batch and only in full fine-tuning.
template <typename T>
__global__ void embedding_backward_kernel(float *dembed, const T *dout, const int *tokens, int N, int D) {
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    for (int i = 0; i < N; i++) dembed[(size_t)tokens[i] * D + d] += to_float(dout[(size_t)i * D + d]);
}
template <typename T>
void embedding_backward(float *dembed, const T *dout, const int *tokens, int N, int D, cudaStream_t stream) {
    embedding_backward_kernel<<<ceil_div(D, 128), 128, 0, stream>>>(dembed, dout, tokens, N, D);
    cudaLaunchCheck();
}

// ----------------------------------------------------------------------------
// RMSNorm: out = x * rsqrt(mean(x^2) + eps) * w, one warp per row of D

constexpr int RMSNORM_WARPS = 8; // rows per block

template <typename T>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int D, float eps) {
    int row = blockIdx.x * RMSNORM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *x = inp + (size_t)row * D;
    float ss = 0.0f;
    for (int d = lane; d < D; d += 32) ss += to_float(x[d]) * to_float(x[d]);
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / D + eps); // correctly rounded, unlike rsqrtf
    if (lane == 0) rstd[row] = r;
    for (int d = lane; d < D; d += 32) out[(size_t)row * D + d] = from_float<T>(to_float(x[d]) * r * to_float(w[d]));
}
// out (N, D), rstd (N) saved for the backward, inp (N, D), w (D)
template <typename T>
void rmsnorm_forward(T *out, float *rstd, const T *inp, const T *w, int N, int D, float eps, cudaStream_t stream) {
    rmsnorm_forward_kernel<<<ceil_div(N, RMSNORM_WARPS), RMSNORM_WARPS * 32, 0, stream>>>(out, rstd, inp, w, N, D, eps);
    cudaLaunchCheck();
}

// dinp += rstd * (w dout - x rstd^2 mean(w dout x)), one warp per row
template <typename T>
__global__ void rmsnorm_backward_kernel(T *dinp, const T *dout, const T *inp, const T *w, const float *rstd,
                                        int N, int D) {
    int row = blockIdx.x * RMSNORM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    size_t off = (size_t)row * D;
    float dot = 0.0f;
    for (int d = lane; d < D; d += 32) dot += to_float(w[d]) * to_float(dout[off + d]) * to_float(inp[off + d]);
    dot = warp_sum(dot);
    float r = rstd[row], c = dot / D * r * r;
    for (int d = lane; d < D; d += 32) {
        float g = r * (to_float(w[d]) * to_float(dout[off + d]) - to_float(inp[off + d]) * c);
        dinp[off + d] = from_float<T>(to_float(dinp[off + d]) + g);
    }
}
// dw (D) += sum over rows of dout x rstd. A block owns 32 columns and its 32 rows
// of threads take every 32nd row, then the 32 partial sums are added in order:
// deterministic, with no atomics and no scratch buffer.
template <typename T>
__global__ void rmsnorm_backward_dw_kernel(float *dw, const T *dout, const T *inp, const float *rstd, int N, int D) {
    __shared__ float partial[32][33]; // +1: the column sums below read down a column without bank conflicts
    int d = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (d < D)
        for (int i = threadIdx.y; i < N; i += 32)
            s += to_float(dout[(size_t)i * D + d]) * to_float(inp[(size_t)i * D + d]) * rstd[i];
    partial[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || d >= D) return;
    float total = 0.0f;
    for (int y = 0; y < 32; y++) total += partial[y][threadIdx.x];
    dw[d] += total;
}
// dinp (N, D) += d/dinp, dw (D, fp32; NULL when the norm weight is frozen) += d/dw
template <typename T>
void rmsnorm_backward(T *dinp, float *dw, const T *dout, const T *inp, const T *w, const float *rstd, int N, int D,
                      cudaStream_t stream) {
    rmsnorm_backward_kernel<<<ceil_div(N, RMSNORM_WARPS), RMSNORM_WARPS * 32, 0, stream>>>(dinp, dout, inp, w, rstd,
                                                                                           N, D);
    cudaLaunchCheck();
    if (dw) {
        rmsnorm_backward_dw_kernel<<<ceil_div(D, 32), dim3(32, 32), 0, stream>>>(dw, dout, inp, rstd, N, D);
        cudaLaunchCheck();
    }
}

// ----------------------------------------------------------------------------
// RoPE in Hugging Face's rotate_half layout: pairs are (j, j + hd/2)

// The cos and sin tables (T, hd/2) are model.h's rope_tables, the CPU twin's, computed on the
// host and copied to the device (model_alloc), so both trainers rotate by identical numbers.

// one thread per pair; sgn = -1 rotates backwards (the transpose)
template <typename T>
__global__ void rope_kernel(T *x, const float *cosb, const float *sinb, Chunk ch, int nh, int hd, float sgn) {
    int half = hd / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)ch.B * ch.len * nh * half) return;
    int j = idx % half;
    size_t row_head = idx / half, row = row_head / nh; // x is (B * len, nh, hd)
    size_t pos = ch.t0 + row % ch.len;
    float c = cosb[pos * half + j], s = sinb[pos * half + j];
    T *v = x + row_head * hd;
    float x1 = to_float(v[j]), x2 = to_float(v[j + half]);
    v[j] = from_float<T>(x1 * c - sgn * x2 * s);
    v[j + half] = from_float<T>(x2 * c + sgn * x1 * s);
}
// rotates x (B, len, nh, hd) of chunk ch in place, row n at position t0 + n % len;
// inverse = 1 applies the transpose (the backward)
template <typename T>
void rope_forward(T *x, const float *cosb, const float *sinb, const Chunk *ch, int nh, int hd, int inverse,
                  cudaStream_t stream) {
    size_t pairs = (size_t)ch->B * ch->len * nh * (hd / 2);
    rope_kernel<<<ceil_div(pairs, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        x, cosb, sinb, *ch, nh, hd, inverse ? -1.0f : 1.0f);
    cudaLaunchCheck();
}
template <typename T>
void rope_backward(T *dx, const float *cosb, const float *sinb, const Chunk *ch, int nh, int hd, cudaStream_t stream) {
    rope_forward(dx, cosb, sinb, ch, nh, hd, 1, stream);
}

// ----------------------------------------------------------------------------
// SwiGLU: out = silu(gate) * up, elementwise over n

template <typename T>
__global__ void swiglu_forward_kernel(T *out, const T *gate, const T *up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = to_float(gate[i]);
    out[i] = from_float<T>(g / (1.0f + expf(-g)) * to_float(up[i]));
}
template <typename T>
void swiglu_forward(T *out, const T *gate, const T *up, size_t n, cudaStream_t stream) {
    swiglu_forward_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(out, gate, up, n);
    cudaLaunchCheck();
}

// dgate, dup are overwritten
template <typename T>
__global__ void swiglu_backward_kernel(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = to_float(gate[i]), dy = to_float(dout[i]), sig = 1.0f / (1.0f + expf(-g));
    dup[i] = from_float<T>(dy * g * sig);
    dgate[i] = from_float<T>(dy * to_float(up[i]) * sig * (1.0f + g * (1.0f - sig)));
}
template <typename T>
void swiglu_backward(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n, cudaStream_t stream) {
    swiglu_backward_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(dgate, dup, dout,
                                                                                               gate, up, n);
    cudaLaunchCheck();
}

// ----------------------------------------------------------------------------
// elementwise: sums into a buffer, and storage conversion

template <typename T, typename X>
__global__ void accumulate_kernel(T *out, const X *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_float<T>(to_float(out[i]) + to_float(x[i]));
}
// out (n) += x (n): the residual connections (the CPU's `mid[i] += x[i]` loops), the LoRA
// dropout's input gradient, and fp32 sums into the compute type's dKV carry (context_reduce)
template <typename T, typename X>
void accumulate(T *out, const X *x, size_t n, cudaStream_t stream) {
    accumulate_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(out, x, n);
    cudaLaunchCheck();
}

template <typename TO, typename TI>
__global__ void convert_kernel(TO *out, const TI *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_float<TO>(to_float(x[i]));
}
// out (n) = x (n) in another storage type (fp32 -> bf16 or fp16 rounds to nearest even):
// weights uploaded in fp32 into the bf16 or fp16 model, fp32 logit gradients for their matmul
template <typename TO, typename TI>
void convert(TO *out, const TI *x, size_t n, cudaStream_t stream) {
    convert_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(out, x, n);
    cudaLaunchCheck();
}

// --pure_bf16 (docs/precision.md): x (n, fp32) rounded to bf16 in place, as train_llama2.c's
// round_bf16: each rank's part of a unit's gradient before the sum over ranks
__global__ void round_bf16_kernel(float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = bf16_rn(x[i]);
}
inline void round_bf16(float *x, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    round_bf16_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(x, n);
    cudaLaunchCheck();
}
__global__ void grads_bf16_add_kernel(__nv_bfloat16 *acc, const float *g, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] = __float2bfloat16(bf16_grad_add(__bfloat162float(acc[i]), g[i]));
}
// --pure_bf16: acc (n, bf16) = bf16(acc + bf16(g)), a micro-batch's fp32 gradient g (n) added
// to the step's bf16 gradient (support/optimizer.h's bf16_grad_add, as train_llama2.c's grads_bf16_end)
inline void grads_bf16_add(__nv_bfloat16 *acc, const float *g, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    grads_bf16_add_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(acc, g, n);
    cudaLaunchCheck();
}
// ... and the same on the host (acc and g host memory: --cpu_offload's)
inline void grads_bf16_add(__nv_bfloat16 *acc, const float *g, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) acc[i] = __float2bfloat16(bf16_grad_add(__bfloat162float(acc[i]), g[i]));
}

// ----------------------------------------------------------------------------
// cross-entropy, fused with its gradient: one block per row of V logits

constexpr int CROSSENTROPY_THREADS = 512;

// (m, s) summarises a set of logits as its max m and sum of exp(z - m); merging
// two sets rescales both sums to the larger max (an empty set is (-inf, 0))
__device__ inline void softmax_merge(float &m, float &s, float m2, float s2) {
    float mm = fmaxf(m, m2);
    if (mm == -INFINITY) return; // both empty
    s = s * expf(m - mm) + s2 * expf(m2 - mm);
    m = mm;
}

// One pass over the row finds (max, sum of exp) online; a second writes the
// gradient grad_scale * w * (softmax - onehot) over the logits, w the row's weight
// (weights[row], or 1 without weights: see train_llama2.c's twin). The probabilities
// are never stored. Rows with a target < 0 get loss 0 and gradient 0.
template <typename T>
__global__ void crossentropy_kernel(T *logits, float *losses, const int *targets, const float *weights, int V, float grad_scale) {
    __shared__ float warp_m[CROSSENTROPY_THREADS / 32], warp_s[CROSSENTROPY_THREADS / 32];
    T *z = logits + (size_t)blockIdx.x * V;
    int y = targets[blockIdx.x], warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (y < 0) {
        if (grad_scale != 0.0f)
            for (int j = threadIdx.x; j < V; j += blockDim.x) z[j] = from_float<T>(0.0f);
        if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        return;
    }
    float zy = to_float(z[y]); // read before any thread overwrites the row
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) softmax_merge(m, s, to_float(z[j]), 1.0f);
    for (int offset = 16; offset > 0; offset /= 2)
        softmax_merge(m, s, __shfl_xor_sync(0xffffffff, m, offset), __shfl_xor_sync(0xffffffff, s, offset));
    if (lane == 0) { warp_m[warp] = m; warp_s[warp] = s; }
    __syncthreads();
    m = warp_m[0]; s = warp_s[0];
    for (int w = 1; w < CROSSENTROPY_THREADS / 32; w++) softmax_merge(m, s, warp_m[w], warp_s[w]);
    if (threadIdx.x == 0) losses[blockIdx.x] = m + logf(s) - zy;
    if (grad_scale == 0.0f) return;
    float gs = weights ? grad_scale * weights[blockIdx.x] : grad_scale, sc = gs / s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = expf(to_float(z[j]) - m) * sc;
        z[j] = from_float<T>(j == y ? g - gs : g);
    }
}
// For each of n rows of logits (n, V) with its target (-100: none): losses[i] =
// its cross-entropy (fp32; 0 without a target). With grad_scale != 0 the logits
// are replaced by d(grad_scale * w_i * loss_i)/d(logits), w_i = weights[i] (device, (n);
// NULL: 1, SFT's uniform weight; preference tuning's own, trainer/preference.h). The CPU
// twin returns the sum; here the per-row losses stay on the device, so a step sums them
// once, with global_sum (deterministic), instead of synchronising per piece.
template <typename T>
void crossentropy_forward_backward(T *logits, float *losses, const int *targets, const float *weights, int n, int V,
                                   float grad_scale, cudaStream_t stream) {
    crossentropy_kernel<<<n, CROSSENTROPY_THREADS, 0, stream>>>(logits, losses, targets, weights, V, grad_scale);
    cudaLaunchCheck();
}

// ----------------------------------------------------------------------------
// reductions over flat fp32 buffers: the loss sum and the gradient norm

// The grid depends on n alone (never on the device's SM count), so the summation
// order, and with it the result, is the same on every GPU: as many blocks as the
// data fills, up to SUM_BLOCKS. Each block writes a partial sum (fp64, as the CPU
// sums) and one block adds the partials in order.
constexpr int SUM_BLOCKS = 512, SUM_THREADS = 512;
__device__ double sum_partials[SUM_BLOCKS]; // used by one reduction at a time (keep them on one stream)

template <bool SQUARES, typename T>
__global__ void sum_partials_kernel(const T *x, size_t n) {
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double xi = to_float(x[i]); // (exact)
        acc = SQUARES ? fma(xi, xi, acc) : acc + xi; // (fused: as sum_host does)
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) sum_partials[blockIdx.x] = acc;
}
// one thread a partial (blocks of them), in a block of whole warps
__global__ void sum_final_kernel(double *out, int blocks, bool take_sqrt) {
    double acc = block_sum((int)threadIdx.x < blocks ? sum_partials[threadIdx.x] : 0.0);
    if (threadIdx.x == 0) *out = take_sqrt ? sqrt(acc) : acc;
}
inline int sum_blocks(size_t n) { return (int)std::min<size_t>(SUM_BLOCKS, std::max<size_t>(1, (n + SUM_THREADS - 1) / SUM_THREADS)); }
template <bool SQUARES, typename T> void sum_launch(double *out, const T *x, size_t n, bool take_sqrt, cudaStream_t stream) {
    int blocks = sum_blocks(n);
    sum_partials_kernel<SQUARES, T><<<blocks, SUM_THREADS, 0, stream>>>(x, n);
    cudaLaunchCheck();
    sum_final_kernel<<<1, ceil_div(blocks, 32) * 32, 0, stream>>>(out, blocks, take_sqrt);
    cudaLaunchCheck();
}

// The same sum on the host, in the same order, for what lives there (--cpu_offload's
// gradients and state): each thread's strided partial, then block_sum's butterflies (within a warp,
// lane 0 adds its partner at offsets 16, 8, .., 1; a + b == b + a in IEEE arithmetic, so
// every lane's pairs are lane 0's), over the warps' sums, over the blocks' partials.
inline double warp_sum_host(const double *lanes) { // (32)
    double x[32], y[32];
    memcpy(x, lanes, sizeof x);
    for (int offset = 16; offset > 0; offset /= 2) {
        for (int k = 0; k < 32; k++) y[k] = x[k] + x[k ^ offset];
        memcpy(x, y, sizeof x);
    }
    return x[0];
}
inline double block_sum_host(const double *x, int threads) { // (threads) a multiple of 32, at most 1024
    double warps[32] = {0};
    for (int w = 0; w < threads / 32; w++) warps[w] = warp_sum_host(x + 32 * w);
    return warp_sum_host(warps);
}
template <bool SQUARES, typename T> double sum_host(const T *x, size_t n) { // (fp32, or --pure_bf16's bf16)
    int blocks = sum_blocks(n);
    size_t G = (size_t)blocks * SUM_THREADS; // the threads, each summing x[i], x[i + G], ...
    std::vector<double> acc(G, 0.0), partials(ceil_div(blocks, 32) * 32, 0.0);
    #pragma omp parallel for
    for (size_t t0 = 0; t0 < G; t0 += SUM_THREADS) // (a block's threads: contiguous reads)
        for (size_t i0 = 0; i0 + t0 < n; i0 += G)
            for (size_t t = t0; t < t0 + SUM_THREADS && i0 + t < n; t++)
                acc[t] = SQUARES ? fma((double)to_float(x[i0 + t]), (double)to_float(x[i0 + t]), acc[t]) : acc[t] + to_float(x[i0 + t]);
    for (int b = 0; b < blocks; b++) partials[b] = block_sum_host(&acc[(size_t)b * SUM_THREADS], SUM_THREADS);
    return block_sum_host(partials.data(), (int)partials.size());
}

// *out (device) = sum of x (n; fp32, or --pure_bf16's bf16 state); e.g. crossentropy_forward_backward's losses
template <typename T> void global_sum(double *out, const T *x, size_t n, cudaStream_t stream) {
    sum_launch<false>(out, x, n, false, stream);
}

// *out (device) = the sum of squares of g (n; fp32, or --pure_bf16's bf16), or with take_sqrt its
// L2 norm (a sharded trainer adds the ranks' sums of squares before the root)
template <typename T> void grad_sumsq(double *out, const T *g, size_t n, bool take_sqrt, cudaStream_t stream) {
    sum_launch<true>(out, g, n, take_sqrt, stream);
}
// *norm (device) = the global L2 norm of g (n). It stays on the device: clip_grads
// reads it there, so the step never waits for the host.
inline void grad_norm(double *norm, const float *g, size_t n, cudaStream_t stream) { grad_sumsq(norm, g, n, true, stream); }

template <typename T>
__global__ void clip_grads_kernel(T *g, size_t n, const double *norm, float max_norm, float inv_scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    double coef = max_norm > 0 ? max_norm / (*norm + 1e-6) : 1.0;
    coef = coef < 1.0 ? coef * inv_scale : inv_scale;
    if (i < n && coef != 1.0) g[i] = from_float<T>((float)(to_float(g[i]) * coef)); // (bf16: as the CPU, fp32 then bf16)
}
// g (n) holds 1 / inv_scale times the gradients (a loss scale, a power of two; 1:
// none): unscaled as torch's GradScaler.unscale_ and clipped as
// torch.nn.utils.clip_grad_norm_ (times max_norm / (norm + 1e-6) when that is
// below 1; max_norm <= 0: no clipping) in one pass, as train_llama2.c's clip_grads;
// norm is the unscaled gradients' norm, on the device; g fp32, or --pure_bf16's bf16
template <typename T> void clip_grads(T *g, size_t n, const double *norm, float max_norm, float inv_scale, cudaStream_t stream) {
    if (max_norm <= 0 && inv_scale == 1.0f) return;
    clip_grads_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(g, n, norm, max_norm, inv_scale);
    cudaLaunchCheck();
}

// ----------------------------------------------------------------------------
// AdamW as torch.optim.AdamW: decoupled weight decay, bias-corrected moments

template <typename E>
__global__ void adamw_kernel(float *params, const float *grads, float *m, float *v, size_t n, AdamWScalars s,
                             E *params_copy) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    adamw_elem(params + i, grads[i], m + i, v + i, &s);
    if (params_copy) params_copy[i] = from_float<E>(params[i]);
}
// One step over n fp32 parameters with their fp32 moments m, v; t is the step
// number, 1 for the first (the CPU's Optimizer.t after its increment). The bias
// corrections are computed on the host in double, as the CPU does. params_copy,
// when not NULL, receives the updated parameters rounded to E (bf16 or fp16, to
// nearest even): the copy the bf16 or fp16 forward reads, written in the same pass.
template <typename E>
void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, int t, float lr, float beta1,
                  float beta2, float eps, float wd, E *params_copy, cudaStream_t stream) {
    adamw_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        params, grads, m, v, n, adamw_scalars(t, lr, beta1, beta2, eps, wd), params_copy);
    cudaLaunchCheck();
}

// ----------------------------------------------------------------------------
// SGD as torch.optim.SGD with dampening 0: weight decay into the gradient, then
// the momentum buffer (b = g at the first step, then b = momentum * b + g) and
// the step along g + momentum * b (Nesterov) or b; without momentum no buffer

template <typename E>
__global__ void sgd_kernel(float *params, const float *grads, float *buf, size_t n, bool first, float lr,
                           float momentum, bool nesterov, float wd, E *params_copy) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    sgd_elem(params + i, grads[i], buf ? buf + i : NULL, first, lr, momentum, nesterov, wd);
    if (params_copy) params_copy[i] = from_float<E>(params[i]);
}
// One step over n fp32 parameters; buf, the fp32 momentum buffer, is NULL without
// momentum; t is the step number, 1 for the first (the CPU's Optimizer.t after its
// increment). params_copy, when not NULL, receives the updated parameters rounded
// to E (bf16 or fp16), as adamw_update writes them.
template <typename E>
void sgd_update(float *params, const float *grads, float *buf, size_t n, int t, float lr, float momentum,
                int nesterov, float wd, E *params_copy, cudaStream_t stream) {
    sgd_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        params, grads, buf, n, t == 1, lr, momentum, nesterov != 0, wd, params_copy);
    cudaLaunchCheck();
}

// ----------------------------------------------------------------------------
// torchao's AdamW8bit and llama-recipes' AnyPrecisionAdamW, as train_llama2.c's
// twins compute them (op for op as torch does eagerly): every rounding explicit,
// (support/optimizer.h's elements: mul_rn where a product must not fuse into the next sum,
// fmaf where torch fuses)

// torchao's 8-bit state: one absmax per block of ADAMW8BIT_BLOCK (support/optimizer.h)
// elements, codes into its two maps
struct Qmap8 {
    float m[256]; // signed, exp_avg's
    float v[256]; // unsigned, exp_avg_sq's
};

// One thread block per block of 256 elements, a thread an element: the maps go to
// shared memory (each thread reads its own codes' entries), the block's new absmax is a
// block max (exact, in any order); every thread reads the old absmax before the max's
// barriers, thread 0 writes the new one after them.
template <typename E>
__global__ void adamw8bit_kernel(float *params, const float *grads, uint8_t *m_codes, float *m_absmax,
                                 uint8_t *v_codes, float *v_absmax, TorchaoAdamScalars s,
                                 const __grid_constant__ Qmap8 qmap, E *params_copy) {
    __shared__ float qm[ADAMW8BIT_BLOCK], qv[ADAMW8BIT_BLOCK];
    int k = threadIdx.x;
    size_t b = blockIdx.x, i = b * ADAMW8BIT_BLOCK + k;
    qm[k] = qmap.m[k];
    qv[k] = qmap.v[k];
    __syncthreads();
    float g = grads[i];
    float m = torch_lerp(mul_rn(qm[m_codes[i]], m_absmax[b]), g, s.w1);
    float v = torch_lerp(mul_rn(qv[v_codes[i]], v_absmax[b]), mul_rn(g, g), s.w2);
    float p = torchao_adam_param(params[i], m, v, &s);
    params[i] = p;
    if (params_copy) params_copy[i] = from_float<E>(p);
    // at least 1e-12, torchao's clip (a block of zeros divides by it)
    float m_scale = fmaxf(block_max(fabsf(m)), (float)1e-12), v_scale = fmaxf(block_max(fabsf(v)), (float)1e-12);
    m_codes[i] = qmap8_code(m / m_scale, qm);
    v_codes[i] = qmap8_code(v / v_scale, qv);
    if (k == 0) m_absmax[b] = m_scale, v_absmax[b] = v_scale;
}
// One AdamW8bit step (the t-th, 1 for the first) on n fp32 parameters whose moments are
// torchao's 8-bit state: codes m_codes, v_codes (n) and absmax m_absmax, v_absmax
// (n / 256), all zero at the start; n a multiple of 256, the blocks counted from params'
// first element (so any run of whole blocks of a tensor, a shard, with its state).
// Hyperparameters as the Python floats torchao takes; params_copy as adamw_update's.
template <typename E>
void adamw8bit_update(float *params, const float *grads, uint8_t *m_codes, float *m_absmax, uint8_t *v_codes,
                      float *v_absmax, size_t n, int t, double lr, double beta1, double beta2, double eps, double wd,
                      E *params_copy, cudaStream_t stream) {
    if (n % ADAMW8BIT_BLOCK) {
        fprintf(stderr, "error: adamw8bit_update: %zu elements are not whole blocks of %d\n", n, ADAMW8BIT_BLOCK);
        exit(EXIT_FAILURE);
    }
    if (n == 0) return;
    Qmap8 qmap;
    memcpy(qmap.m, qmap8_signed, sizeof qmap.m);
    memcpy(qmap.v, qmap8_unsigned, sizeof qmap.v);
    adamw8bit_kernel<<<ceil_div(n, ADAMW8BIT_BLOCK), ADAMW8BIT_BLOCK, 0, stream>>>(
        params, grads, m_codes, m_absmax, v_codes, v_absmax, torchao_adam_scalars(t, lr, beta1, beta2, eps, wd), qmap,
        params_copy);
    cudaLaunchCheck();
}

template <typename E>
__global__ void adamw_torchao_kernel(float *params, const float *grads, float *m, float *v, size_t n,
                                     TorchaoAdamScalars s, E *params_copy) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grads[i];
    float mi = m[i] = torch_lerp(m[i], g, s.w1);
    float vi = v[i] = torch_lerp(v[i], mul_rn(g, g), s.w2);
    float p = params[i] = torchao_adam_param(params[i], mi, vi, &s);
    if (params_copy) params_copy[i] = from_float<E>(p);
}
// One step of AdamW8bit's fp32 path (its tensors of fewer than 4096 elements or not whole
// blocks): fp32 moments m, v (n, zero at the start), torchao's formula and rounding
template <typename E>
void adamw_torchao_update(float *params, const float *grads, float *m, float *v, size_t n, int t, double lr,
                          double beta1, double beta2, double eps, double wd, E *params_copy, cudaStream_t stream) {
    if (n == 0) return;
    adamw_torchao_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        params, grads, m, v, n, torchao_adam_scalars(t, lr, beta1, beta2, eps, wd), params_copy);
    cudaLaunchCheck();
}

__global__ void anyprecision_kernel(__nv_bfloat16 *params, const __nv_bfloat16 *grads, __nv_bfloat16 *m,
                                    __nv_bfloat16 *v, __nv_bfloat16 *comp, size_t n, AnyPrecisionScalars s) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float mi = __bfloat162float(m[i]), vi = __bfloat162float(v[i]), ci = comp ? __bfloat162float(comp[i]) : 0.0f;
    params[i] = __float2bfloat16(anyprecision_elem(__bfloat162float(params[i]), __bfloat162float(grads[i]), &mi, &vi,
                                                   comp ? &ci : NULL, &s));
    m[i] = __float2bfloat16(mi);
    v[i] = __float2bfloat16(vi);
    if (comp) comp[i] = __float2bfloat16(ci);
}
// One AnyPrecisionAdamW step (the t-th) on n bf16 parameters with bf16 gradients, bf16
// moments m, v and, with Kahan summation, the bf16 compensation comp (NULL: none), all
// zero at the start; as train_llama2.c's anyprecision_update
inline void anyprecision_update(__nv_bfloat16 *params, const __nv_bfloat16 *grads, __nv_bfloat16 *m,
                                __nv_bfloat16 *v, __nv_bfloat16 *comp, size_t n, int t, double lr, double beta1,
                                double beta2, double eps, double wd, cudaStream_t stream) {
    if (n == 0) return;
    anyprecision_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(
        params, grads, m, v, comp, n, anyprecision_scalars(t, lr, beta1, beta2, eps, wd));
    cudaLaunchCheck();
}
