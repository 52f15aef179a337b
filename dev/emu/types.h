// dev/emu/types.h: what the two halves of the execution layer share.
//
// The execution layer runs the CUDA sources of llama2.tune on the CPU (see
// dev/emu/README.md). It has two halves that meet only here:
//   - the device side (device.h, cuda_bf16.h, mma.h): a grid of blocks, every
//     thread of a block in its own fiber, barriers, warp exchanges, shared
//     memory, WMMA, launch checks. emu::launch(...) checks a launch like the
//     device does and hands the grid to the host side as one operation.
//   - the host side (runtime.h behind cuda_runtime.h): device memory, copies,
//     streams and events, and when each stream's operations run.
// cuBLAS/cuBLASLt (blas.h) and NCCL (nccl.h) enqueue their work the same way.
#pragma once
#include <cstddef>
#include <functional>

// ----------------------------------------------------------------------------
// the CUDA types both halves name

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorLaunchFailure = 719,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorUnsupportedPtxVersion = 222,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorMisalignedAddress = 716,
};

namespace emu { struct Stream; struct Event; }
typedef emu::Stream *cudaStream_t; // NULL: the legacy default stream
typedef emu::Event *cudaEvent_t;

namespace emu {

// ----------------------------------------------------------------------------
// the host side provides (runtime.h)

// Queue op on stream s (NULL: the legacy default stream). It runs later, in
// stream order, when the stream-ordering mode says (eager: at once), with
// device memory accessible; `what` names it in reports ("kernel rmsnorm_forward_kernel",
// "cudaMemcpyAsync", "cublasLtMatmul", ...).
void enqueue(cudaStream_t s, const char *what, std::function<void()> op);

// the error cudaGetLastError / cudaPeekAtLastError return next (launch checks set it)
void set_last_error(cudaError_t err);

// Stop the program with a report that names what was running: every checker
// of the layer ends here (prints "emu: <message>", then abort()).
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// ----------------------------------------------------------------------------
// the device side provides (device.h)

// the limits the launch checks use and cudaGetDeviceProperties reports (sm_90's)
constexpr int MAX_THREADS_PER_BLOCK = 1024;
constexpr unsigned MAX_GRID_X = 2147483647u, MAX_GRID_YZ = 65535u;
constexpr size_t DEFAULT_MAX_DYNAMIC_SMEM = 48 * 1024;   // without cudaFuncSetAttribute
constexpr size_t MAX_SMEM_PER_BLOCK_OPTIN = 227 * 1024; // sm_90's shared memory a block can opt into
constexpr int WARP_SIZE = 32;

} // namespace emu
