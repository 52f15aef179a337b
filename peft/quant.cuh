// QLoRA on the GPU: 4-bit weights (peft/quant.h's layout, packed by quant_tensor on the
// host) dequantized into the compute type, with the name and the arithmetic of
// peft/quant.h's dequant_tensor: each absmax of double quantization is
// code8 * absmax2 + offset, the product and the sum each rounded to fp32 (never
// one fused multiply-add, as the CPU rounds them), then w = code4 * absmax. So the
// fp32 output is the CPU's bit for bit and the bf16 one its round-to-nearest
// (dev/cuda/dequant.cu checks both).
#pragma once
#include <string.h>
#include "quant.h"
#include "../support/cuda_common.cuh"

constexpr int DEQUANT_THREADS = 256;

// bitsandbytes' tables, peft/quant.h's values, handed to the kernel by value
struct QuantCodes {
    float code4[16];  // NF4 or FP4
    float code8[256]; // the signed 8-bit dynamic code (double quantization)
};

// One thread per byte of codes: its two weights (the first in the high nibble) share
// a block of 64, whose absmax it reads (or, double quantized, works out: a warp's 32
// bytes are one block, so its lanes read the same 8-bit code). code4 is read at a
// different index by each lane, so it sits in shared memory; code8 at one index per warp.
template <typename T>
__global__ void dequant_kernel(T *out, const QuantTensor q, const __grid_constant__ QuantCodes codes) {
    __shared__ float code4[16];
    if (threadIdx.x < 16) code4[threadIdx.x] = codes.code4[threadIdx.x];
    __syncthreads();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; // the byte of weights 2i and 2i + 1
    if (i >= (q.numel + 1) / 2) return;
    size_t b = i / (QUANT_BLOCK / 2);
    float absmax = q.double_quant
        ? __fadd_rn(__fmul_rn(codes.code8[q.qabsmax[b]], q.absmax2[b / QUANT_BLOCK2]), *q.offset)
        : q.absmax[b];
    uint8_t byte = q.codes[i];
    out[2 * i] = from_float<T>(__fmul_rn(code4[byte >> 4], absmax));
    if (2 * i + 1 < q.numel) out[2 * i + 1] = from_float<T>(__fmul_rn(code4[byte & 15], absmax)); // (an odd count's pad: no weight)
}

// out (q.numel) = the weights of q, whose pointers (quant_layout over a device buffer)
// are the device's
template <typename T> void dequant_tensor(const QuantTensor &q, T *out, cudaStream_t stream) {
    QuantCodes codes;
    memcpy(codes.code4, quant_table(q.type), sizeof codes.code4);
    memcpy(codes.code8, quant_dynamic, sizeof codes.code8);
    dequant_kernel<<<ceil_div((q.numel + 1) / 2, DEQUANT_THREADS), DEQUANT_THREADS, 0, stream>>>(out, q, codes);
    cudaLaunchCheck();
}
