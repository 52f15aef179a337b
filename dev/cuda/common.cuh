// What every dev/cuda kernel check shares: random inputs, typed device copies,
// outputs poisoned with NaN before a kernel runs (an element it fails to write
// stays NaN and fails), the comparison against the CPU twin, and timing.
//
// Every check prints one line, first word ok or FAIL:
//   ok   <kernel> <variant> <output> err <max |gpu - cpu| / max |cpu|> tol <tolerance> <shape>
// and every timing one line, first word time:
//   time <kernel> <variant> <median ms> ms <rate> <GB/s or TFLOP/s> <shape>
// dev/gpu_check.sh builds its summary table from these lines. A program exits 1
// when any check failed. With --quick it checks only the small shapes and does
// not time (for compute-sanitizer, which makes kernels very slow).
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>
#include <type_traits>
#include "../../support/cuda_common.cuh"
#include "cpu_ref.h"

// ----------------------------------------------------------------------------
// inputs: a fixed seed per program, so a failure reproduces

inline uint64_t rng_state = 0x853c49e6748fea9bull;
inline uint32_t rng_u32() { // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}
inline std::vector<float> random_vector(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> x(n);
    for (float &v : x) v = lo + (hi - lo) * (rng_u32() >> 8) / 16777216.0f;
    return x;
}
inline std::vector<int> random_ints(size_t n, int lo, int hi) { // in [lo, hi)
    std::vector<int> x(n);
    for (int &v : x) v = lo + (int)(rng_u32() % (uint32_t)(hi - lo));
    return x;
}

// ----------------------------------------------------------------------------
// storage types

template <typename T> const char *type_name();
template <> inline const char *type_name<float>() { return "fp32"; }
template <> inline const char *type_name<__nv_bfloat16>() { return "bf16"; }
template <> inline const char *type_name<__half>() { return "fp16"; }

// the tolerance for T: fp32, bf16 or fp16 (relative to the output's largest magnitude)
template <typename T> double tol(double fp32, double bf16) { return std::is_same<T, float>::value ? fp32 : bf16; }
template <typename T> double tol(double fp32, double bf16, double fp16) {
    return std::is_same<T, __half>::value ? fp16 : tol<T>(fp32, bf16);
}

// rounds x to what T holds, so the CPU twin sees exactly the GPU's inputs
template <typename T> std::vector<float> rounded(std::vector<float> x) {
    for (float &v : x) v = to_float(from_float<T>(v));
    return x;
}

// every device buffer of a check, freed together by free_device()
inline std::vector<void *> device_buffers;
template <typename T> T *device_alloc(size_t n) {
    T *d = (T *)cudaMallocCheck(n * sizeof(T) + 1); // + 1: a valid pointer also for n = 0
    device_buffers.push_back(d);
    return d;
}
inline void free_device() {
    for (void *p : device_buffers) cudaCheck(cudaFree(p));
    device_buffers.clear();
}

// a device copy of x in type T (float -> T), or of ints as they are
template <typename T> T *to_device(const std::vector<float> &x) {
    std::vector<T> h(x.size());
    for (size_t i = 0; i < x.size(); i++) h[i] = from_float<T>(x[i]);
    T *d = device_alloc<T>(x.size());
    cudaCheck(cudaMemcpy(d, h.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
inline int *to_device(const std::vector<int> &x) {
    int *d = device_alloc<int>(x.size());
    cudaCheck(cudaMemcpy(d, x.data(), x.size() * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}
// n elements of T, every byte 0xFF: NaN in float, bf16 and double
template <typename T> T *device_poisoned(size_t n) {
    T *d = device_alloc<T>(n);
    cudaCheck(cudaMemset(d, 0xFF, n * sizeof(T)));
    return d;
}
template <typename T> std::vector<float> to_host(const T *d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaDeviceSynchronize()); // a kernel's fault surfaces here, before the copy
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = to_float(h[i]);
    return x;
}

// ----------------------------------------------------------------------------
// comparing with the CPU twin

inline int failures = 0;

// max |gpu - ref| / max |ref| (1 when sizes differ; any NaN or Inf in gpu fails)
inline bool check(const char *kernel, const char *variant, const char *output, const char *shape,
                  const std::vector<float> &gpu, const std::vector<float> &ref, double tolerance) {
    double max_ref = 0.0, max_err = gpu.size() == ref.size() ? 0.0 : 1.0;
    size_t bad = 0, worst = 0;
    for (size_t i = 0; i < ref.size() && i < gpu.size(); i++) {
        max_ref = std::max(max_ref, (double)fabsf(ref[i]));
        double err = fabs((double)gpu[i] - ref[i]);
        if (!std::isfinite(gpu[i])) bad++;
        else if (err > max_err) { max_err = err; worst = i; }
    }
    double rel = max_err / (max_ref > 0.0 ? max_ref : 1.0);
    bool ok = bad == 0 && rel <= tolerance;
    printf("%-4s %-30s %-10s %-6s err %.2e tol %.0e %s", ok ? "ok" : "FAIL", kernel, variant, output, rel, tolerance,
           shape);
    if (bad) printf(" (%zu elements NaN or Inf, e.g. unwritten)", bad);
    else if (!ok) printf(" (worst at %zu: gpu %.7g cpu %.7g)", worst, gpu[worst], ref[worst]);
    printf("\n");
    failures += !ok;
    return ok;
}

// outputs that must be the CPU twin's bit for bit (tolerance: none), in their own storage
// type: the line as check's, err the fraction of elements whose bits differ
template <typename T> std::vector<T> to_host_raw(const T *d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
template <typename T> T *to_device_raw(const std::vector<T> &h) {
    T *d = device_alloc<T>(h.size());
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <typename T>
inline bool check_bits(const char *kernel, const char *variant, const char *output, const char *shape,
                       const std::vector<T> &gpu, const std::vector<T> &ref) {
    size_t bad = gpu.size() == ref.size() ? 0 : 1, first = 0;
    for (size_t i = 0; i < ref.size() && i < gpu.size(); i++)
        if (memcmp(&gpu[i], &ref[i], sizeof(T)) != 0 && bad++ == 0) first = i;
    bool ok = bad == 0;
    printf("%-4s %-30s %-10s %-6s err %.2e tol 0e+00 %s", ok ? "ok" : "FAIL", kernel, variant, output,
           ref.empty() ? 0.0 : (double)bad / ref.size(), shape);
    if (!ok) printf(" (%zu elements differ in their bits, the first at %zu)", bad, first);
    printf("\n");
    failures += !ok;
    return ok;
}

// ----------------------------------------------------------------------------
// timing

// median time of f over reps runs, each timed alone with events, after warmup runs
template <typename F> float time_ms(F f, int reps = 20, int warmup = 3) {
    for (int i = 0; i < warmup; i++) f();
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) {
        cudaCheck(cudaEventRecord(start));
        f();
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[i], start, stop));
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

// prints a timing line; bytes moved (GB/s) or, with flops > 0, floating-point operations (TFLOP/s)
inline void report_time(const char *kernel, const char *variant, const char *shape, float ms, double bytes,
                        double flops = 0.0) {
    if (flops > 0) printf("time %-30s %-10s %9.4f ms %8.1f TFLOP/s %s\n", kernel, variant, ms, flops / ms / 1e9, shape);
    else printf("time %-30s %-10s %9.4f ms %8.1f GB/s %s\n", kernel, variant, ms, bytes / ms / 1e6, shape);
}

// ----------------------------------------------------------------------------
// a check program: parse --quick, print the device, end with the count

inline bool quick_mode(int argc, char **argv) {
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    cudaDeviceProp prop;
    int dev;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    printf("# %s on %s (sm_%d%d, %d SMs)%s\n", argv[0], prop.name, prop.major, prop.minor, prop.multiProcessorCount,
           quick ? ", quick: small shapes, no timing" : "");
    return quick;
}
inline int finish(const char *program) {
    printf("# %s: %d check%s failed\n", program, failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
