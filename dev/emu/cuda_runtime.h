// dev/emu/cuda_runtime.h: what an emulated program includes in place of CUDA's
// <cuda_runtime.h>; the build also force-includes it (-include), as nvcc does the
// real one. The contract between the halves (types.h), the device side
// (device.h: kernels, launches, shared memory, warps) and the host side
// (runtime.h: device memory, copies, streams, events, the device's properties).
// With MPI and ASan, LeakSanitizer's defaults for MPI's own allocations (mpi_leaks.h).
#pragma once
#include "types.h"
#include "device.h"
#include "runtime.h"
#include "mpi_leaks.h"
