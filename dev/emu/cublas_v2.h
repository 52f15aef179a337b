// dev/emu/cublas_v2.h: <cublas_v2.h> for the emulated build: the CUDA runtime's
// names (as the real header brings them) and the execution layer's cuBLAS (blas.h)
#pragma once
#include "cuda_runtime.h"
#include "blas.h"
