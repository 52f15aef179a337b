// peft/prefix.cuh: prefix tuning's place in the KV carry on the GPU, the twins of peft/prefix.h's
// prefix_to_carry and prefix_backward (which says the layout), with the same names and
// arguments and a stream (dev/cuda/prefix.cu checks them against peft/prefix.h). The prompt is
// read in the carry's type T (the bf16 copy of the masters, or the masters), its gradient
// goes to the fp32 masters' gradients.
#pragma once
#include "../layers.cuh" // ELEMENTWISE_THREADS

// the prefix's keys and values into rows 0 .. P - 1 of every row's carry, every layer: one
// strided copy of P rows per (layer, row, key or value)
template <typename T>
void prefix_to_carry(T *k, T *v, const T *prompt, int L, int B, int P, int T_, size_t KV, cudaStream_t stream) {
    size_t row = (size_t)L * 2 * KV, layer = (size_t)B * (P + T_) * KV, w = KV * sizeof(T);
    for (int l = 0; l < L; l++)
        for (int b = 0; b < B; b++)
            for (int s = 0; s < 2; s++) // the key, then the value
                cudaCheck(cudaMemcpy2DAsync((s ? v : k) + l * layer + (size_t)b * (P + T_) * KV, w,
                                            prompt + (size_t)l * 2 * KV + s * KV, row * sizeof(T), w, P,
                                            cudaMemcpyDeviceToDevice, stream));
}

// one thread per element of dprompt (P, L * 2 * KV): its B rows in row order, as the CPU adds them
template <typename T>
__global__ void prefix_backward_kernel(float *dprompt, const T *dk, const T *dv, int L, int B, int P, int T_, size_t KV) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, row = (size_t)L * 2 * KV;
    if (i >= (size_t)P * row) return;
    size_t j = i / row, c = i % row, l = c / (2 * KV), e = c % (2 * KV);
    const T *src = e < KV ? dk : dv;
    size_t at = l * B * (P + T_) * KV + j * KV + e % KV; // row 0's
    float g = dprompt[i];
    for (int b = 0; b < B; b++) g += to_float(src[at + (size_t)b * (P + T_) * KV]);
    dprompt[i] = g;
}
// dprompt (P, L * 2 * KV) += the dKV carry's rows 0 .. P - 1, each element's B rows added in row order
template <typename T>
void prefix_backward(float *dprompt, const T *dk, const T *dv, int L, int B, int P, int T_, size_t KV, cudaStream_t stream) {
    size_t n = (size_t)P * L * 2 * KV;
    prefix_backward_kernel<<<ceil_div(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream>>>(dprompt, dk, dv, L, B, P, T_, KV);
    cudaLaunchCheck();
}
