// IA3 on the GPU (lora.h's top says the maths): the twins of peft/ia3.h's ia3_forward and
// ia3_backward, on DoRA's elementwise kernels with norm NULL. The vectors are read from
// (and their gradients written to) the fp32 buffers params and g.
#pragma once
#include "../lora.cuh"

// out (N, O) = W (l * inp) for a feedforward module, else l * (W inp); wb: W (O, in); xs (N, in) scratch
template <typename T>
void ia3_forward(const LoRA *l, float *params, int layer, int t, T *out, const T *inp, const T *wb, T *xs, int N,
                 cudaStream_t stream) {
    int in = l->in[t], O = l->out[t];
    const float *vec = ia3_vector(l, params, layer, t);
    if (ia3_feedforward(l, t)) {
        dora_scale(xs, inp, vec, (const float *)NULL, N, in, 0.0f, 0, stream);
        matmul_forward(out, (const T *)xs, wb, N, in, O, 1.0f, 0, stream);
    } else {
        matmul_forward(out, inp, wb, N, in, O, 1.0f, 0, stream);
        dora_scale(out, (const T *)out, vec, (const float *)NULL, N, O, 0.0f, 0, stream);
    }
}

// given dout (N, O): g's vector gradient, and dinp (N, in) += the input's (NULL: not needed);
// xs (N, in), pre (N, O) scratch
template <typename T>
void ia3_backward(const LoRA *l, float *params, float *g, int layer, int t, T *dinp, const T *dout, const T *inp,
                  const T *wb, T *xs, T *pre, int N, cudaStream_t stream) {
    int in = l->in[t], O = l->out[t];
    const float *vec = ia3_vector(l, params, layer, t);
    float *dvec = ia3_vector(l, g, layer, t);
    if (ia3_feedforward(l, t)) { // dx = dout W; dl += sum x dx; dinp += l dx
        cudaCheck(cudaMemsetAsync(xs, 0, (size_t)N * in * sizeof(T), stream));
        matmul_backward(xs, (float *)NULL, dout, (const T *)NULL, wb, N, in, O, 1.0f, stream);
        dora_magnitude_backward(dvec, (const T *)xs, inp, (const float *)NULL, N, in, stream);
        if (dinp) dora_scale(dinp, (const T *)xs, vec, (const float *)NULL, N, in, 0.0f, 1, stream);
        return;
    }
    // dl += sum dout (W x), the product recomputed; dinp += (l dout) W
    matmul_forward(pre, inp, wb, N, in, O, 1.0f, 0, stream);
    dora_magnitude_backward(dvec, dout, (const T *)pre, (const float *)NULL, N, O, stream);
    if (!dinp) return;
    dora_scale(pre, dout, vec, (const float *)NULL, N, O, 0.0f, 0, stream);
    matmul_backward(dinp, (float *)NULL, (const T *)pre, (const T *)NULL, wb, N, in, O, 1.0f, stream);
}
