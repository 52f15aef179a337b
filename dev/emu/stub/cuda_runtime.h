// dev/emu/stub/cuda_runtime.h: the device side's tests without the host side.
// Force-included (-include) by test/test_emu_device.cu and the planted-bug
// programs in place of dev/emu/cuda_runtime.h: types.h's three host functions
// in their simplest form (a launch runs at once, on the calling thread), the
// device side, and declarations of the runtime calls support/cuda_common.cuh
// names (the tests call none of them; the real ones are runtime.h's).
#pragma once
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include "../types.h"

namespace emu {
inline cudaError_t stub_last_error = cudaSuccess;
inline void enqueue(cudaStream_t, const char *, std::function<void()> op) { op(); }
inline void set_last_error(cudaError_t err) { stub_last_error = err; }
[[noreturn]] inline void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}
} // namespace emu

#include "../device.h"

inline cudaError_t cudaGetLastError() {
    cudaError_t err = emu::stub_last_error;
    emu::stub_last_error = cudaSuccess;
    return err;
}
inline const char *cudaGetErrorName(cudaError_t err) {
    return err == cudaSuccess ? "cudaSuccess" : err == cudaErrorInvalidConfiguration ? "cudaErrorInvalidConfiguration"
         : err == cudaErrorInvalidValue ? "cudaErrorInvalidValue" : "(an error the stub does not name)";
}
inline const char *cudaGetErrorString(cudaError_t err) { return cudaGetErrorName(err); }
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
