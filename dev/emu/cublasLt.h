// dev/emu/cublasLt.h: <cublasLt.h> for the emulated build: the CUDA runtime's
// names (as the real header brings them) and the execution layer's cuBLASLt (blas.h)
#pragma once
#include "cuda_runtime.h"
#include "blas.h"
