// LoRA's forward and backward on the GPU: the twins of lora_dropout,
// lora_forward and lora_backward in lora.h, with the same names and meaning
// (dev/cuda/lora.cu checks each against its twin).
//
// lora.h keeps what is not compute: the layout (LoRA: offsets, shapes, scale,
// dropout), the init and the PEFT files. Here the adapter's weights w are a
// device copy of lora.h's flat buffer in the compute type T (the fp32 masters
// themselves with --precision fp32, the bf16 copy AdamW writes otherwise), and
// its gradients g a device fp32 buffer of the same layout. The A/B products go
// through cuBLASLt (matmul.cuh); the dropout mask is lora.h's counter hash of
// (key, absolute position, feature), so the GPU drops exactly what the CPU drops.
#pragma once
#include "lora.h"
#include "support/matmul.cuh"
#include "layers.cuh"

// lora.h's lora_A / lora_B for a buffer of any element type (the bf16 weights)
template <typename T> T *lora_A(const LoRA *l, T *base, int layer, int t) { return base + l->offset[layer * LORA_N_TARGETS + t]; }
template <typename T> T *lora_B(const LoRA *l, T *base, int layer, int t) { return lora_A(l, base, layer, t) + (size_t)l->r * l->in[t]; }

// one thread per element: row n of the chunk is position t0 + n % len of sequence n / len
template <typename T>
__global__ void lora_dropout_kernel(T *out, const T *inp, int in, Chunk ch, uint64_t key, float p, float keep_scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)ch.B * ch.len * in) return;
    size_t n = i / in, j = i % in;
    uint64_t pos = (uint64_t)(n / ch.len) * ch.T + ch.t0 + n % ch.len;
    out[i] = hash_uniform(key, pos * in + j) < p ? from_float<T>(0.0f) : from_float<T>(to_float(inp[i]) * keep_scale);
}
// out (B * len, in) = dropout(inp) as torch's nn.Dropout (zero with probability p,
// survivors scaled by 1 / (1 - p)); out may be inp
template <typename T>
void lora_dropout(const LoRA *l, T *out, const T *inp, int in, const Chunk *ch, uint64_t key, cudaStream_t stream) {
    float keep_scale = 1.0f / (1.0f - l->dropout);
    size_t n = (size_t)ch->B * ch->len * in;
    lora_dropout_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(out, inp, in, *ch, key,
                                                                                             l->dropout, keep_scale);
    cudaLaunchCheck();
}

// out (N, out) += scale * (dropout(inp) (N, in) @ A^T) @ B^T with N = B * len rows;
// h (N, r) is kept for the backward; xdrop is scratch (N, in), used only with dropout
template <typename T>
void lora_forward(const LoRA *l, const T *w, int layer, int t, T *out, const T *inp, T *h, T *xdrop, const Chunk *ch,
                  uint64_t key, cudaStream_t stream) {
    const T *x = inp;
    int N = ch->B * ch->len;
    if (l->training && l->dropout > 0.0f) {
        lora_dropout(l, xdrop, inp, l->in[t], ch, lora_dropout_key(key, layer, t), stream);
        x = xdrop;
    }
    matmul_forward(h, x, lora_A(l, w, layer, t), N, l->in[t], l->r, 1.0f, 0, stream);
    matmul_forward(out, h, lora_B(l, w, layer, t), N, l->r, l->out[t], l->scale, 1, stream);
}

// given dout (N, out): g's dB += scale dout^T h and dA += dh^T dropout(x) with
// dh = scale dout B, and dinp (N, in) += dropout'(dh A). dh is scratch (N, r),
// xdrop as in the forward.
template <typename T>
void lora_backward(const LoRA *l, const T *w, float *g, int layer, int t, T *dinp, const T *dout, const T *inp,
                   const T *h, T *dh, T *xdrop, const Chunk *ch, uint64_t key, cudaStream_t stream) {
    int in = l->in[t], r = l->r, N = ch->B * ch->len;
    cudaCheck(cudaMemsetAsync(dh, 0, (size_t)N * r * sizeof(T), stream));
    matmul_backward(dh, lora_B(l, g, layer, t), dout, h, lora_B(l, w, layer, t), N, r, l->out[t], l->scale, stream);
    uint64_t dkey = lora_dropout_key(key, layer, t);
    if (l->dropout == 0.0f) {
        matmul_backward(dinp, lora_A(l, g, layer, t), dh, inp, lora_A(l, w, layer, t), N, in, r, 1.0f, stream);
        return;
    }
    // with dropout the input gradient passes through the same mask: dx_drop, masked, then added
    cudaCheck(cudaMemsetAsync(xdrop, 0, (size_t)N * in * sizeof(T), stream));
    matmul_backward(xdrop, NULL, dh, NULL, lora_A(l, w, layer, t), N, in, r, 1.0f, stream);
    lora_dropout(l, xdrop, xdrop, in, ch, dkey, stream);
    accumulate(dinp, xdrop, (size_t)N * in, stream);
    // dA += dh^T @ dropout(x): the dropped input regenerated (xdrop held dx until now)
    lora_dropout(l, xdrop, inp, in, ch, dkey, stream);
    matmul_backward(NULL, lora_A(l, g, layer, t), dh, xdrop, NULL, N, in, r, 1.0f, stream);
}

// ----------------------------------------------------------------------------
// DoRA (lora.h's top says the maths): the twins of dora_norm, dora_scale,
// dora_magnitude_backward, dora_forward and dora_backward. The magnitudes are read
// from (and their gradients written to) the fp32 buffers, params and g; the rest
// of the adapter from w in the compute type, as LoRA's.

constexpr int DORA_NORM_WARPS = 8; // rows per block
// one warp per row o: norm[o] = ||W[o] + scale (B A)[o]||, each (B A)[o, i] summed over r in order
template <typename T>
__global__ void dora_norm_kernel(float *norm, const T *w, const T *A, const T *B, int O, int in, int r, float scale) {
    int o = blockIdx.x * DORA_NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (o >= O) return;
    float ss = 0.0f;
    for (int i = lane; i < in; i += 32) {
        float ba = 0.0f;
        for (int k = 0; k < r; k++) ba += to_float(B[(size_t)o * r + k]) * to_float(A[(size_t)k * in + i]);
        float v = to_float(w[(size_t)o * in + i]) + scale * ba;
        ss += v * v;
    }
    ss = warp_sum(ss);
    if (lane == 0) norm[o] = sqrtf(ss);
}
// norm (out) of module t of a layer, base weight wb (out, in); the first time (mag_unset) m = norm
template <typename T>
void dora_norm(LoRA *l, const T *w, float *params, int layer, int t, float *norm, const T *wb, cudaStream_t stream) {
    int O = l->out[t];
    dora_norm_kernel<<<ceil_div(O, DORA_NORM_WARPS), DORA_NORM_WARPS * 32, 0, stream>>>(
        norm, wb, lora_A(l, w, layer, t), lora_B(l, w, layer, t), O, l->in[t], l->r, l->scale);
    cudaLaunchCheck();
    if (l->mag_unset[layer * LORA_N_TARGETS + t]) {
        cudaCheck(cudaMemcpyAsync(lora_mag(l, params, layer, t), norm, O * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        l->mag_unset[layer * LORA_N_TARGETS + t] = 0;
    }
}

template <typename T>
__global__ void dora_scale_kernel(T *out, const T *inp, const float *mag, const float *norm, int N, int O, float shift,
                                  int accumulate) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * O) return;
    int o = (int)(i % O);
    float v = (mag[o] / (norm ? norm[o] : 1.0f) + shift) * to_float(inp[i]);
    out[i] = from_float<T>(accumulate ? to_float(out[i]) + v : v);
}
// out (N, O) = (accumulate ? out : 0) + (m / norm + shift) * inp (N, O), per column; norm NULL
// counts as 1 (IA3's m * inp); out may be inp
template <typename T>
void dora_scale(T *out, const T *inp, const float *mag, const float *norm, int N, int O, float shift, int accumulate,
                cudaStream_t stream) {
    size_t n = (size_t)N * O;
    dora_scale_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(out, inp, mag, norm, N, O,
                                                                                           shift, accumulate);
    cudaLaunchCheck();
}

// one thread per column o, its rows summed in order
template <typename T>
__global__ void dora_magnitude_backward_kernel(float *dmag, const T *dout, const T *pre, const float *norm, int N, int O) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= O) return;
    float sum = 0.0f;
    for (int n = 0; n < N; n++) sum += to_float(dout[(size_t)n * O + o]) * to_float(pre[(size_t)n * O + o]);
    dmag[o] += norm ? sum / norm[o] : sum;
}
// dmag (O) += sum over rows of dout (N, O) * pre (N, O) / norm (norm NULL: 1, IA3's vector's gradient)
template <typename T>
void dora_magnitude_backward(float *dmag, const T *dout, const T *pre, const float *norm, int N, int O, cudaStream_t stream) {
    dora_magnitude_backward_kernel<<<ceil_div(O, 128), 128, 0, stream>>>(dmag, dout, pre, norm, N, O);
    cudaLaunchCheck();
}

// out (N, O) holds W x: adds (s - 1) W xd + s scale B A xd. wb: W (O, in); h (N, r) kept
// for the backward; xdrop (N, in) and pre (N, O) scratch
template <typename T>
void dora_forward(const LoRA *l, const T *w, float *params, int layer, int t, T *out, const T *inp, const T *wb,
                  T *h, T *xdrop, T *pre, const float *norm, const Chunk *ch, uint64_t key, cudaStream_t stream) {
    int in = l->in[t], O = l->out[t], N = ch->B * ch->len;
    const T *x = inp;
    const float *mag = lora_mag(l, params, layer, t);
    if (l->training && l->dropout > 0.0f) { // peft recomputes the base product on the dropped input
        lora_dropout(l, xdrop, inp, in, ch, lora_dropout_key(key, layer, t), stream);
        x = xdrop;
        matmul_forward(pre, x, wb, N, in, O, 1.0f, 0, stream);
    } else cudaCheck(cudaMemcpyAsync(pre, out, (size_t)N * O * sizeof(T), cudaMemcpyDeviceToDevice, stream));
    dora_scale(out, pre, mag, norm, N, O, -1.0f, 1, stream);
    matmul_forward(h, x, lora_A(l, w, layer, t), N, in, l->r, 1.0f, 0, stream);
    matmul_forward(pre, h, lora_B(l, w, layer, t), N, l->r, O, l->scale, 0, stream);
    dora_scale(out, pre, mag, norm, N, O, 0.0f, 1, stream);
}

// given dout (N, O), with dinp (N, in) already holding dout W: g's dm, dA, dB and the rest
// of dinp, dropout'((s - 1) dout W) and the LoRA path's for s dout
template <typename T>
void dora_backward(const LoRA *l, const T *w, float *params, float *g, int layer, int t, T *dinp, const T *dout,
                   const T *inp, const T *wb, const T *h, T *dh, T *xdrop, T *pre, const float *norm, const Chunk *ch,
                   uint64_t key, cudaStream_t stream) {
    int in = l->in[t], O = l->out[t], N = ch->B * ch->len, dropping = l->dropout > 0.0f;
    const T *x = inp;
    const float *mag = lora_mag(l, params, layer, t);
    uint64_t dkey = lora_dropout_key(key, layer, t);
    // dm += sum dout (W xd + scale B A xd) / norm, the forward's products recomputed
    if (dropping) { lora_dropout(l, xdrop, inp, in, ch, dkey, stream); x = xdrop; }
    matmul_forward(pre, x, wb, N, in, O, 1.0f, 0, stream);
    matmul_forward(pre, h, lora_B(l, w, layer, t), N, l->r, O, l->scale, 1, stream);
    dora_magnitude_backward(lora_mag(l, g, layer, t), dout, pre, norm, N, O, stream);
    // the base path's (s - 1) W xd: dinp += dropout'((s - 1) dout W)
    dora_scale(pre, dout, mag, norm, N, O, -1.0f, 0, stream);
    cudaCheck(cudaMemsetAsync(xdrop, 0, (size_t)N * in * sizeof(T), stream));
    matmul_backward(xdrop, NULL, pre, NULL, wb, N, in, O, 1.0f, stream);
    if (dropping) lora_dropout(l, xdrop, xdrop, in, ch, dkey, stream);
    accumulate(dinp, xdrop, (size_t)N * in, stream);
    // the LoRA path, s scale B A xd: LoRA's backward of s dout
    dora_scale(pre, dout, mag, norm, N, O, 0.0f, 0, stream);
    lora_backward(l, w, g, layer, t, dinp, pre, inp, h, dh, xdrop, ch, key, stream);
}
