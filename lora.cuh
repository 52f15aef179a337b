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
