// dev/emu/stub/cublasLt.h: the cuBLAS names support/cuda_common.cuh uses, for the
// device side's tests (the real ones are the execution layer's blas.h)
#pragma once
enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
const char *cublasLtGetStatusString(cublasStatus_t status);
