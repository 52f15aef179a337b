// What every CUDA file of llama2.tune shares: checked CUDA and cuBLAS calls that
// stop with the file, line and a hint, the storage types (float, bf16 and fp16,
// always computed in fp32), and the warp and block reductions the kernels use.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublasLt.h>

// ----------------------------------------------------------------------------
// checked calls

// what to try for the errors people actually meet
inline const char *cuda_error_hint(cudaError_t err) {
    switch (err) {
    case cudaErrorMemoryAllocation:
        return "out of GPU memory: try a smaller --batch_size, --chunk_size with --chunk_memory recompute, "
               "--activation_checkpointing, or sharding over more GPUs";
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return "no usable GPU: check nvidia-smi, and that the driver is as new as this CUDA toolkit";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return "this binary has no code for this GPU: rebuild with its architecture in CUDA_ARCHS (Makefile)";
    case cudaErrorIllegalAddress:
    case cudaErrorMisalignedAddress:
    case cudaErrorLaunchFailure:
        return "a kernel faulted (reported at the next checked call, not where it happened): "
               "run under compute-sanitizer to find it";
    case cudaErrorInvalidConfiguration:
        return "a launch asked for more blocks, threads or shared memory than this GPU has";
    default:
        return NULL;
    }
}

inline void cuda_check(cudaError_t err, const char *file, int line) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "[CUDA ERROR] at %s:%d: %s (%s)\n", file, line, cudaGetErrorString(err), cudaGetErrorName(err));
    if (cuda_error_hint(err)) fprintf(stderr, "  hint: %s\n", cuda_error_hint(err));
    exit(EXIT_FAILURE);
}
#define cudaCheck(err) cuda_check((err), __FILE__, __LINE__)
// after every kernel launch: catches bad launch configurations at the launch itself
#define cudaLaunchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

inline void cublas_check(cublasStatus_t status, const char *file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "[cuBLAS ERROR] at %s:%d: %s\n", file, line, cublasLtGetStatusString(status));
    const char *hint = status == CUBLAS_STATUS_ALLOC_FAILED ? cuda_error_hint(cudaErrorMemoryAllocation)
                     : status == CUBLAS_STATUS_NOT_SUPPORTED ? "this shape, type or alignment has no cuBLASLt kernel"
                     : status == CUBLAS_STATUS_NOT_INITIALIZED ? "cuBLAS could not start: is there a GPU (nvidia-smi)?"
                     : status == CUBLAS_STATUS_ARCH_MISMATCH ? "this GPU lacks a feature the call needs"
                     : NULL;
    if (hint) fprintf(stderr, "  hint: %s\n", hint);
    exit(EXIT_FAILURE);
}
#define cublasCheck(status) cublas_check((status), __FILE__, __LINE__)

// cudaMalloc that, when the memory runs out, says how much it asked for and how much was free
inline void *cuda_malloc_check(size_t bytes, const char *file, int line) {
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaGetLastError(); // clear it, so the query below can run
        fprintf(stderr, "[CUDA ERROR] at %s:%d: out of GPU memory allocating %.1f MiB", file, line, bytes / 1048576.0);
        if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
            fprintf(stderr, " (%.1f of %.1f MiB free)", free_bytes / 1048576.0, total_bytes / 1048576.0);
        fprintf(stderr, "\n");
        fprintf(stderr, "  hint: %s\n", cuda_error_hint(err));
        exit(EXIT_FAILURE);
    }
    cuda_check(err, file, line);
    return p;
}
#define cudaMallocCheck(bytes) cuda_malloc_check((bytes), __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// storage types: tensors are float, __nv_bfloat16 or __half; arithmetic is always fp32

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }
template <typename T> __host__ __device__ inline T from_float(float x);
template <> __host__ __device__ inline float from_float<float>(float x) { return x; }
template <> __host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16(x); // round to nearest even
}
template <> __host__ __device__ inline __half from_float<__half>(float x) {
    return __float2half_rn(x); // round to nearest even; above 65504 (halfway to 2^16): infinity
}

inline int ceil_div(size_t a, size_t b) { return (int)((a + b - 1) / b); }

// ----------------------------------------------------------------------------
// reductions, in a fixed order (a butterfly), so results do not vary between runs

template <typename T> __device__ inline T warp_sum(T x) {
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
    return x;
}
__device__ inline float warp_max(float x) {
    for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
    return x;
}

// sum over a 1-D block (a multiple of 32 threads, at most 1024); every thread gets it
template <typename T> __device__ T block_sum(T x) {
    __shared__ T warp_sums[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    x = warp_sum(x);
    __syncthreads(); // a previous call's readers are done with warp_sums
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    x = lane < n_warps ? warp_sums[lane] : (T)0;
    return warp_sum(x);
}
// max over a 1-D block (a multiple of 32 threads, at most 1024); every thread gets it
__device__ inline float block_max(float x) {
    __shared__ float warp_maxes[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    x = warp_max(x);
    __syncthreads(); // a previous call's readers are done with warp_maxes
    if (lane == 0) warp_maxes[warp] = x;
    __syncthreads();
    x = lane < n_warps ? warp_maxes[lane] : -INFINITY;
    return warp_max(x);
}
