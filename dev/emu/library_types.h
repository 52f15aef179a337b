// dev/emu/library_types.h: CUDA's data type enumeration (cudaDataType_t), which
// cuBLAS and cuBLASLt take to say what a matrix holds. The values are CUDA's;
// only the types the execution layer knows are named (blas.h says which it
// computes with).
#pragma once

typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_8I = 3,
    CUDA_R_32I = 10,
    CUDA_R_16BF = 14,
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;
