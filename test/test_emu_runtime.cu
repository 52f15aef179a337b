// The host side of the execution layer (dev/emu/runtime.h) against the CUDA
// runtime's documented semantics: copies of every kind, 2D copies and memsets
// against plain loops; fresh allocations as 0xFF bytes; stream order, events and
// the legacy default stream's implicit synchronization; what the lazy mode defers,
// and that shuffled and eager orders give a correct program the same results;
// pageable and pinned staging; event timing; the errors bad arguments get, with
// their messages; the device's properties. In child processes: host code touching
// device memory, a kernel running off an allocation and a second host thread stop
// the program with a report that names what happened.
// Built by rewrite.pl like any CUDA source, with ASan and UBSan (build-emu/) and
// with ThreadSanitizer (build-emu-tsan/, which is also the build without ASan:
// there the guard pages alone catch an overrun). Everything but the child
// processes runs in the default lazy mode, where an operation runs only when
// the host forces it, so each check below sees exactly what the host forced.
#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>
#include "test_common.h"

typedef std::vector<unsigned char> Bytes;

static bool has(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// n bytes that are never 0xFF (a fresh allocation's bytes), different for each seed
static Bytes pattern(size_t n, int seed) {
    Bytes b(n);
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)((i * 7 + seed * 31) % 255);
    return b;
}

// what the device holds at d: a copy to pageable memory, complete on return
// (on the legacy stream: after the blocking streams' work, not the non-blocking ones')
static Bytes device_bytes(const void *d, size_t n) {
    Bytes h(n);
    cudaError_t err = cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) printf("FAIL device_bytes: cudaMemcpy: %s\n", cudaGetErrorString(err));
    return h;
}

// a device buffer holding `bytes`, written before anything that follows runs
static void *device_with(const Bytes &bytes) {
    void *d;
    cudaMalloc(&d, bytes.size());
    cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize(); // cudaMemcpy from pageable memory may return before the device has it
    return d;
}

// the first index where got and want differ, as a message ("" if none)
static std::string first_difference(const Bytes &got, const Bytes &want) {
    if (got.size() != want.size()) return "sizes differ";
    for (size_t i = 0; i < got.size(); i++)
        if (got[i] != want[i])
            return "byte " + std::to_string(i) + " is " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
    return "";
}
#define CHECK_BYTES(got, want, what)                                                                                   \
    do {                                                                                                               \
        std::string diff_ = first_difference(got, want);                                                               \
        CHECK(diff_.empty(), what, "%s", diff_.c_str());                                                               \
    } while (0)

// runs f with stderr going to a file; returns what it wrote (the runtime's messages)
template <typename F> static std::string stderr_of(F f) {
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    f();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string s;
    rewind(tmp);
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, tmp)) > 0;) s.append(buf, n);
    fclose(tmp);
    return s;
}

// how a child process ended, and what it wrote to stderr
struct Ending {
    int signal, status; // the signal that ended it (0: none), its exit status (-1: none)
    std::string err;
    bool died() const { return signal != 0 || status != 0; }
    std::string how() const {
        return (signal ? "signal " + std::to_string(signal) : "status " + std::to_string(status)) + ", stderr: " + err;
    }
};
static std::string read_all(int fd) {
    std::string s;
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) s.append(buf, (size_t)n);
    return s;
}
static Ending ending_of(pid_t pid, int err_fd) {
    Ending e{0, -1, read_all(err_fd)};
    close(err_fd);
    int st;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st)) e.signal = WTERMSIG(st);
    if (WIFEXITED(st)) e.status = WEXITSTATUS(st);
    return e;
}
// runs f in a forked child (a copy of this process, device memory included)
template <typename F> static Ending in_child(F f) {
    fflush(stdout);
    fflush(stderr);
    int fd[2];
    if (pipe(fd) != 0) return Ending{0, -1, "pipe failed"};
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        f();
        _exit(0);
    }
    close(fd[1]);
    return ending_of(pid, fd[0]);
}

// this program run anew as `EMU_STREAMS=<mode> test_emu_runtime <what>`: its stdout
static std::string self_path;
static std::string run_self(const char *mode, const char *what, Ending *ending = nullptr) {
    fflush(stdout);
    fflush(stderr);
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) return "";
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]), close(err[0]), close(out[1]), close(err[1]);
        setenv("EMU_STREAMS", mode, 1);
        const char *tsan = getenv("TSAN_OPTIONS"); // (its build would wait a second at each child's exit)
        setenv("TSAN_OPTIONS", (std::string("atexit_sleep_ms=0:") + (tsan ? tsan : "")).c_str(), 1);
        execl(self_path.c_str(), self_path.c_str(), what, (char *)nullptr);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    std::string s = read_all(out[0]); // (small: the pipes do not fill)
    close(out[0]);
    Ending e = ending_of(pid, err[0]);
    if (ending) *ending = e;
    return s;
}

// ----------------------------------------------------------------------------
// kernels: one thread an element

__global__ void fill_kernel(int *x, int k, int n) { // x[i] = k * i
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = k * i;
}
__global__ void add_kernel(int *y, const int *x, int c, int n) { // y[i] = x[i] + c
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + c;
}
__global__ void scale_kernel(int *x, int k, int n) { // x[i] *= k
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= k;
}
__global__ void accumulate_kernel(int *z, const int *x, int n) { // z[i] += x[i]
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] += x[i];
}
__global__ void poke_kernel(char *p, size_t at) { p[at] = 1; } // one thread: writes byte `at`

constexpr int N = 256, THREADS = 64; // elements of the kernels' buffers, threads a block
static std::vector<int> ints(const void *d) {
    Bytes b = device_bytes(d, N * sizeof(int));
    std::vector<int> v(N);
    memcpy(v.data(), b.data(), b.size());
    return v;
}
// index of the first element that is not want(i), or -1
template <typename F> static int first_bad(const std::vector<int> &v, F want) {
    for (int i = 0; i < (int)v.size(); i++)
        if (v[i] != want(i)) return i;
    return -1;
}
// as first_bad, for N ints in pinned host memory
template <typename F> static int first_bad(const int *p, F want) { return first_bad(std::vector<int>(p, p + N), want); }
static int element(const int *p, int i) { return i < 0 ? 0 : p[i]; } // (for messages: -1 is none)
static const int NAN_BYTES = (int)0xFFFFFFFF; // an int of a fresh allocation's bytes

// ----------------------------------------------------------------------------
// memory and copies, against plain loops

static void test_allocation_limit() {
    setenv("EMU_DEVICE_MEMORY", "0.001", 1); // GiB: 1073741 bytes
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    CHECK(total == 1073741 && free_b == total, "cudaMemGetInfo reports EMU_DEVICE_MEMORY (0.001 GiB), all free",
          "free %zu of %zu", free_b, total);
    void *p = (void *)1, *q = nullptr;
    cudaError_t err;
    std::string msg = stderr_of([&] { err = cudaMalloc(&p, total + 1); });
    CHECK(err == cudaErrorMemoryAllocation && p == nullptr && cudaGetLastError() == cudaErrorMemoryAllocation &&
              cudaGetLastError() == cudaSuccess,
          "cudaMalloc beyond EMU_DEVICE_MEMORY: cudaErrorMemoryAllocation, NULL, the last error once", "error %d", err);
    CHECK(has(msg, "emu: cudaMalloc(1073742 bytes): out of memory (0 of 1073741 bytes in use; EMU_DEVICE_MEMORY"),
          "cudaMalloc beyond EMU_DEVICE_MEMORY: the message names the size and the variable", "%s", msg.c_str());
    err = cudaMalloc(&q, total);
    cudaMemGetInfo(&free_b, &total);
    CHECK(err == cudaSuccess && q && free_b == 0, "cudaMalloc of all EMU_DEVICE_MEMORY succeeds, leaving 0 free",
          "error %d, %zu free", err, free_b);
    cudaFree(q);
    cudaMemGetInfo(&free_b, &total);
    CHECK(free_b == total, "cudaFree gives the memory back", "%zu free of %zu", free_b, total);
    unsetenv("EMU_DEVICE_MEMORY");
}

static void test_fresh_allocation() {
    void *d;
    cudaMalloc(&d, 1000);
    CHECK_BYTES(device_bytes(d, 1000), Bytes(1000, 0xFF), "a fresh allocation reads back as 0xFF bytes (NaN)");
    cudaFree(d);
}

// every kind, synchronous and on a stream, partial ranges at odd offsets
static void test_copies() {
    const size_t n = 600;
    Bytes h1 = pattern(n, 1), h2 = pattern(n, 2);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int async = 0; async < 2; async++)
        for (int inferred = 0; inferred < 2; inferred++) {
            auto copy = [&](void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
                if (inferred) kind = cudaMemcpyDefault;
                if (!async) return cudaMemcpy(dst, src, bytes, kind);
                cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, s);
                cudaStreamSynchronize(s);
                return err;
            };
            std::string how = std::string(async ? "cudaMemcpyAsync" : "cudaMemcpy") + (inferred ? " (Default)" : "");
            void *d1, *d2;
            cudaMalloc(&d1, n);
            cudaMalloc(&d2, n);
            // HostToDevice: h1[7, 207) to d1[100, 300)
            cudaError_t err = copy((char *)d1 + 100, h1.data() + 7, 200, cudaMemcpyHostToDevice);
            Bytes want(n, 0xFF);
            for (size_t i = 0; i < 200; i++) want[100 + i] = h1[7 + i];
            CHECK_BYTES(device_bytes(d1, n), want, (how + " HostToDevice").c_str());
            // DeviceToDevice: d1[150, 300) to d2[30, 180)
            err = err ? err : copy((char *)d2 + 30, (char *)d1 + 150, 150, cudaMemcpyDeviceToDevice);
            Bytes want2(n, 0xFF);
            for (size_t i = 0; i < 150; i++) want2[30 + i] = want[150 + i];
            CHECK_BYTES(device_bytes(d2, n), want2, (how + " DeviceToDevice").c_str());
            // DeviceToHost: d2[20, 120) to h[10, 110)
            Bytes h = h2;
            err = err ? err : copy(h.data() + 10, (char *)d2 + 20, 100, cudaMemcpyDeviceToHost);
            Bytes want3 = h2;
            for (size_t i = 0; i < 100; i++) want3[10 + i] = want2[20 + i];
            CHECK_BYTES(h, want3, (how + " DeviceToHost").c_str());
            // HostToHost: h1[7, 57) to h[5, 55)
            err = err ? err : copy(h.data() + 5, h1.data() + 7, 50, cudaMemcpyHostToHost);
            for (size_t i = 0; i < 50; i++) want3[5 + i] = h1[7 + i];
            CHECK_BYTES(h, want3, (how + " HostToHost").c_str());
            CHECK(err == cudaSuccess, (how + ": every copy returns cudaSuccess").c_str(), "error %d", err);
            cudaFree(d1);
            cudaFree(d2);
        }
    cudaStreamDestroy(s);
}

// cudaMemcpy2DAsync: rows of `width` bytes between pitched buffers, other bytes untouched
static void test_copy_2d() {
    const size_t width = 24, height = 5, hp = 40, dp1 = 64, dp2 = 48, hp2 = 30;
    Bytes src = pattern(hp * height, 3);
    void *d1, *d2;
    cudaMalloc(&d1, dp1 * height);
    cudaMalloc(&d2, dp2 * height);
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaMemcpy2DAsync(d1, dp1, src.data(), hp, width, height, cudaMemcpyHostToDevice, s);
    cudaMemcpy2DAsync(d2, dp2, d1, dp1, width, height, cudaMemcpyDeviceToDevice, s);
    Bytes out(hp2 * height, 0);
    cudaMemcpy2DAsync(out.data(), hp2, d2, dp2, width, height, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    Bytes want1(dp1 * height, 0xFF), want2(dp2 * height, 0xFF), want3(hp2 * height, 0);
    for (size_t r = 0; r < height; r++)
        for (size_t c = 0; c < width; c++) {
            want1[r * dp1 + c] = src[r * hp + c];
            want2[r * dp2 + c] = src[r * hp + c];
            want3[r * hp2 + c] = src[r * hp + c];
        }
    CHECK_BYTES(device_bytes(d1, dp1 * height), want1, "cudaMemcpy2DAsync HostToDevice (pitch 40 -> 64, width 24)");
    CHECK_BYTES(device_bytes(d2, dp2 * height), want2, "cudaMemcpy2DAsync DeviceToDevice (pitch 64 -> 48)");
    CHECK_BYTES(out, want3, "cudaMemcpy2DAsync DeviceToHost (pitch 48 -> 30)");
    cudaFree(d1);
    cudaFree(d2);
    cudaStreamDestroy(s);
}

static void test_memset() {
    const size_t n = 300;
    void *d;
    cudaMalloc(&d, n);
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaMemset((char *)d + 3, 0xAB, 77);
    cudaMemsetAsync((char *)d + 200, 0x5C, 10, s);
    cudaStreamSynchronize(s);
    Bytes want(n, 0xFF);
    for (size_t i = 3; i < 80; i++) want[i] = 0xAB;
    for (size_t i = 200; i < 210; i++) want[i] = 0x5C;
    CHECK_BYTES(device_bytes(d, n), want, "cudaMemset and cudaMemsetAsync set their ranges and no other byte");
    cudaFree(d);
    cudaStreamDestroy(s);
}

// ----------------------------------------------------------------------------
// streams, events and the legacy default stream

// one stream's operations in the order enqueued: the same operations applied by
// plain loops in that order give the result, any other order would not
static void test_stream_order() {
    const size_t n = 64;
    int *pinned;
    cudaMallocHost((void **)&pinned, 16);
    Bytes src = pattern(16, 4);
    memcpy(pinned, src.data(), 16);
    void *d;
    cudaMalloc(&d, n);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMemsetAsync(d, 0x11, n, s);                                               // 1. all 0x11
    cudaMemcpyAsync((char *)d + 8, pinned, 16, cudaMemcpyHostToDevice, s);        // 2. [8, 24) the pattern
    cudaMemcpyAsync((char *)d + 40, (char *)d + 4, 12, cudaMemcpyDeviceToDevice, s); // 3. [40, 52) = [4, 16)
    cudaMemsetAsync((char *)d + 6, 0x22, 4, s);                                   // 4. [6, 10) 0x22
    cudaStreamSynchronize(s);
    Bytes want(n);
    for (size_t i = 0; i < n; i++) want[i] = 0x11;
    for (size_t i = 0; i < 16; i++) want[8 + i] = src[i];
    for (size_t i = 0; i < 12; i++) want[40 + i] = want[4 + i];
    for (size_t i = 6; i < 10; i++) want[i] = 0x22;
    CHECK_BYTES(device_bytes(d, n), want, "a stream runs its operations in the order enqueued");
    cudaFree(d);
    cudaFreeHost(pinned);
    cudaStreamDestroy(s);
}

// a producer on stream a, a consumer on stream b: the event orders them, and
// without it (lazy mode) the consumer reads what was there before
static void test_event_wait() {
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    int *x, *pinned;
    cudaMalloc(&x, N * sizeof(int));
    cudaMallocHost((void **)&pinned, N * sizeof(int));
    for (int wait = 1; wait >= 0; wait--) {
        cudaMemset(x, 0xFF, N * sizeof(int));
        cudaDeviceSynchronize();
        fill_kernel<<<N / THREADS, THREADS, 0, a>>>(x, 3, N);
        cudaEventRecord(e, a);
        if (wait) cudaStreamWaitEvent(b, e, 0);
        cudaMemcpyAsync(pinned, x, N * sizeof(int), cudaMemcpyDeviceToHost, b);
        cudaStreamSynchronize(b); // not a: only b's wait makes a's kernel run first
        int bad = wait ? first_bad(pinned, [](int i) { return 3 * i; }) : first_bad(pinned, [](int) { return NAN_BYTES; });
        CHECK(bad < 0,
              wait ? "an event recorded on stream a and waited on by b orders b's copy after a's kernel"
                   : "without the event wait (lazy mode), b's copy runs before a's kernel and reads the old bytes",
              "element %d is %d", bad, element(pinned, bad));
        cudaDeviceSynchronize();
    }
    cudaFree(x);
    cudaFreeHost(pinned);
    cudaEventDestroy(e);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}

// The legacy default stream (0) waits for the earlier work of every blocking
// stream, and they for its; non-blocking streams are not ordered against it.
static void test_legacy_stream() {
    cudaStream_t blocking, nonblocking;
    cudaStreamCreate(&blocking);
    cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking);
    int *x[4], *p[4];
    for (int i = 0; i < 4; i++) {
        cudaMalloc(&x[i], N * sizeof(int));
        cudaMallocHost((void **)&p[i], N * sizeof(int));
    }
    // a kernel on a stream, then a copy on the legacy stream
    fill_kernel<<<N / THREADS, THREADS, 0, blocking>>>(x[0], 3, N);
    cudaMemcpyAsync(p[0], x[0], N * sizeof(int), cudaMemcpyDeviceToHost, 0);
    fill_kernel<<<N / THREADS, THREADS, 0, nonblocking>>>(x[1], 3, N);
    cudaMemcpyAsync(p[1], x[1], N * sizeof(int), cudaMemcpyDeviceToHost, 0);
    cudaStreamSynchronize(0);
    int bad = first_bad(p[0], [](int i) { return 3 * i; });
    CHECK(bad < 0, "the legacy default stream waits for a blocking stream's earlier kernel", "element %d is %d", bad,
          element(p[0], bad));
    bad = first_bad(p[1], [](int) { return NAN_BYTES; });
    CHECK(bad < 0, "the legacy default stream does not wait for a non-blocking stream's kernel (lazy: not run yet)",
          "element %d is %d", bad, element(p[1], bad));
    cudaDeviceSynchronize();
    // a memset on the legacy stream, then a copy on a stream
    cudaMemsetAsync(x[2], 0x01, N * sizeof(int), 0);
    cudaMemcpyAsync(p[2], x[2], N * sizeof(int), cudaMemcpyDeviceToHost, blocking);
    cudaMemsetAsync(x[3], 0x01, N * sizeof(int), 0);
    cudaMemcpyAsync(p[3], x[3], N * sizeof(int), cudaMemcpyDeviceToHost, nonblocking);
    cudaStreamSynchronize(blocking);
    cudaStreamSynchronize(nonblocking);
    bad = first_bad(p[2], [](int) { return 0x01010101; });
    CHECK(bad < 0, "a blocking stream waits for the legacy default stream's earlier memset", "element %d is %d", bad,
          element(p[2], bad));
    bad = first_bad(p[3], [](int) { return NAN_BYTES; });
    CHECK(bad < 0, "a non-blocking stream does not wait for the legacy default stream", "element %d is %d", bad,
          element(p[3], bad));
    cudaDeviceSynchronize();
    for (int i = 0; i < 4; i++) cudaFree(x[i]), cudaFreeHost(p[i]);
    cudaStreamDestroy(blocking);
    cudaStreamDestroy(nonblocking);
}

// lazy: an operation runs only when the host forces it (here, a device synchronize)
static void test_lazy_defers() {
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    Bytes src = pattern(N, 5);
    void *d = device_with(src), *other;
    cudaMalloc(&other, N);
    unsigned char *pinned;
    cudaMallocHost((void **)&pinned, N);
    memset(pinned, 0, N);
    cudaMemcpyAsync(pinned, d, N, cudaMemcpyDeviceToHost, b); // nothing waits for it
    cudaMemsetAsync(other, 0, N, a);
    cudaStreamSynchronize(a);
    CHECK_BYTES(Bytes(pinned, pinned + N), Bytes(N, 0), "lazy: synchronizing stream a leaves stream b's copy unrun");
    cudaDeviceSynchronize();
    CHECK_BYTES(Bytes(pinned, pinned + N), src, "lazy: cudaDeviceSynchronize runs it");
    // cudaMemcpy between device buffers and cudaMemset return before they run
    // (CUDA's "API synchronization behavior"): non-blocking streams may not see them
    cudaMemcpy(other, d, N, cudaMemcpyDeviceToDevice); // other: zeros -> src, on the legacy stream
    cudaMemcpyAsync(pinned, other, N, cudaMemcpyDeviceToHost, b);
    cudaStreamSynchronize(b);
    CHECK_BYTES(Bytes(pinned, pinned + N), Bytes(N, 0), "lazy: cudaMemcpy DeviceToDevice has not run when it returns");
    cudaDeviceSynchronize();
    cudaMemset(d, 0, N); // d: src -> zeros, on the legacy stream
    cudaMemcpyAsync(pinned, d, N, cudaMemcpyDeviceToHost, b);
    cudaStreamSynchronize(b);
    CHECK_BYTES(Bytes(pinned, pinned + N), src, "lazy: cudaMemset has not run when it returns");
    cudaDeviceSynchronize();
    cudaFree(d);
    cudaFree(other);
    cudaFreeHost(pinned);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}

// A pageable source is read at the call (staged); pinned memory when the stream
// gets there. A copy into pageable memory is complete when the call returns; into
// pinned memory, when the stream is synchronized.
static void test_staging() {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    void *d1, *d2;
    cudaMalloc(&d1, N);
    cudaMalloc(&d2, N);
    Bytes old_v = pattern(N, 6), new_v = pattern(N, 7);
    Bytes pageable = old_v;
    unsigned char *pinned;
    cudaMallocHost((void **)&pinned, N);
    memcpy(pinned, old_v.data(), N);
    cudaMemcpyAsync(d1, pageable.data(), N, cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(d2, pinned, N, cudaMemcpyHostToDevice, s);
    pageable = new_v;
    memcpy(pinned, new_v.data(), N);
    cudaStreamSynchronize(s);
    CHECK_BYTES(device_bytes(d1, N), old_v, "HostToDevice from pageable memory: the source is read at the call");
    CHECK_BYTES(device_bytes(d2, N), new_v, "HostToDevice from pinned memory: the source is read when the stream runs");
    Bytes into(N, 0);
    cudaMemcpyAsync(into.data(), d2, N, cudaMemcpyDeviceToHost, s);
    CHECK_BYTES(into, new_v, "DeviceToHost into pageable memory is complete when cudaMemcpyAsync returns");
    memset(pinned, 0, N);
    cudaMemcpyAsync(pinned, d1, N, cudaMemcpyDeviceToHost, s);
    CHECK_BYTES(Bytes(pinned, pinned + N), Bytes(N, 0), "DeviceToHost into pinned memory: not done before a synchronize");
    cudaStreamSynchronize(s);
    CHECK_BYTES(Bytes(pinned, pinned + N), old_v, "DeviceToHost into pinned memory: done after cudaStreamSynchronize");
    cudaFree(d1);
    cudaFree(d2);
    cudaFreeHost(pinned);
    cudaStreamDestroy(s);
}

// cudaStreamDestroy returns at once and the stream's work still runs, also for a
// stream that another one waits on; an event recorded on it can still be synchronized
static void test_stream_destroy() {
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    int *x, *pa, *pb;
    cudaMalloc(&x, N * sizeof(int));
    cudaMallocHost((void **)&pa, N * sizeof(int));
    cudaMallocHost((void **)&pb, N * sizeof(int));
    memset(pa, 0, N * sizeof(int));
    memset(pb, 0, N * sizeof(int));
    fill_kernel<<<N / THREADS, THREADS, 0, a>>>(x, 5, N);
    cudaMemcpyAsync(pa, x, N * sizeof(int), cudaMemcpyDeviceToHost, a);
    cudaEventRecord(e, a);
    cudaStreamWaitEvent(b, e, 0);
    cudaMemcpyAsync(pb, x, N * sizeof(int), cudaMemcpyDeviceToHost, b);
    cudaError_t err = cudaStreamDestroy(a);
    int bad = first_bad(pa, [](int) { return 0; });
    CHECK(err == cudaSuccess && bad < 0, "cudaStreamDestroy returns before the stream's work ran (lazy)",
          "error %d, element %d is %d", err, bad, element(pa, bad));
    cudaStreamSynchronize(b);
    bad = std::max(first_bad(pa, [](int i) { return 5 * i; }), first_bad(pb, [](int i) { return 5 * i; }));
    CHECK(bad < 0, "a stream waiting on a destroyed stream's event: the destroyed stream's work runs first",
          "element %d", bad);
    err = cudaEventSynchronize(e);
    CHECK(err == cudaSuccess, "cudaEventSynchronize of an event recorded on a destroyed stream", "error %d", err);
    cudaFree(x);
    cudaFreeHost(pa);
    cudaFreeHost(pb);
    cudaEventDestroy(e);
    cudaStreamDestroy(b);
}

static void test_event_timing() {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEvent_t start, end, untimed, unrecorded;
    cudaEventCreate(&start);
    cudaEventCreate(&end);
    cudaEventCreate(&unrecorded);
    cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming);
    int *x;
    cudaMalloc(&x, N * sizeof(int));
    cudaEventRecord(start, s);
    fill_kernel<<<N / THREADS, THREADS, 0, s>>>(x, 1, N);
    cudaEventRecord(end, s);
    float ms = -1;
    cudaError_t before = cudaEventElapsedTime(&ms, start, end);
    CHECK(before == cudaErrorNotReady, "cudaEventElapsedTime before the events ran: cudaErrorNotReady", "error %d",
          before);
    cudaEventSynchronize(end);
    cudaError_t after = cudaEventElapsedTime(&ms, start, end);
    CHECK(after == cudaSuccess && ms >= 0 && ms < 60e3, "cudaEventElapsedTime after cudaEventSynchronize",
          "error %d, %g ms", after, ms);
    cudaEventRecord(untimed, s);
    cudaStreamSynchronize(s);
    cudaError_t err;
    std::string msg = stderr_of([&] { err = cudaEventElapsedTime(&ms, start, untimed); });
    CHECK(err == cudaErrorInvalidResourceHandle && has(msg, "cudaEventDisableTiming"),
          "cudaEventElapsedTime refuses an event created with cudaEventDisableTiming", "error %d, %s", err, msg.c_str());
    cudaGetLastError();
    msg = stderr_of([&] { err = cudaEventElapsedTime(&ms, start, unrecorded); });
    CHECK(err == cudaErrorInvalidResourceHandle && has(msg, "never recorded"),
          "cudaEventElapsedTime refuses an event that was never recorded", "error %d, %s", err, msg.c_str());
    cudaGetLastError();
    cudaFree(x);
    for (cudaEvent_t e : {start, end, untimed, unrecorded}) cudaEventDestroy(e);
    cudaStreamDestroy(s);
}

// ----------------------------------------------------------------------------
// the stream modes: a correct program gives the same results in each

// A program on three streams and the legacy one, ordered by events where it must
// be: plain loops give x = 6i, y = 3i + 1, z = 9i + 1. It also says whether its
// last copy, into pinned memory, had run when the call returned.
struct ProgramResult {
    long long x, y, z; // sum over i of (i + 1) * v[i]
    int at_once;
};
static long long weighted_sum(const std::vector<int> &v) {
    long long s = 0;
    for (size_t i = 0; i < v.size(); i++) s += (long long)(i + 1) * v[i];
    return s;
}
static ProgramResult stream_program() {
    cudaStream_t a, b, c;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaStreamCreate(&c); // blocking: ordered after the legacy stream's work
    cudaEvent_t filled, read, scaled;
    for (cudaEvent_t *e : {&filled, &read, &scaled}) cudaEventCreateWithFlags(e, cudaEventDisableTiming);
    int *x, *y, *z, *pinned;
    cudaMalloc(&x, N * sizeof(int));
    cudaMalloc(&y, N * sizeof(int));
    cudaMalloc(&z, N * sizeof(int));
    cudaMallocHost((void **)&pinned, N * sizeof(int));
    memset(pinned, 0, N * sizeof(int));
    const int blocks = N / THREADS;
    fill_kernel<<<blocks, THREADS, 0, a>>>(x, 3, N);   // a: x = 3i
    cudaEventRecord(filled, a);
    cudaStreamWaitEvent(b, filled, 0);
    add_kernel<<<blocks, THREADS, 0, b>>>(y, x, 1, N); // b: y = x + 1 = 3i + 1
    cudaEventRecord(read, b);
    cudaStreamWaitEvent(a, read, 0);                   // a writes x only after b has read it
    scale_kernel<<<blocks, THREADS, 0, a>>>(x, 2, N);  // a: x = 6i
    cudaEventRecord(scaled, a);
    cudaStreamWaitEvent(0, read, 0);                   // legacy: z = y = 3i + 1
    cudaMemcpyAsync(z, y, N * sizeof(int), cudaMemcpyDeviceToDevice, 0);
    cudaStreamWaitEvent(c, scaled, 0);                 // c, after the legacy copy: z += x = 9i + 1
    accumulate_kernel<<<blocks, THREADS, 0, c>>>(z, x, N);
    cudaMemcpyAsync(pinned, z, N * sizeof(int), cudaMemcpyDeviceToHost, c);
    ProgramResult r;
    r.at_once = pinned[1] != 0; // z[1] = 10 once the copy ran
    cudaStreamSynchronize(c);
    r.z = weighted_sum(std::vector<int>(pinned, pinned + N));
    r.x = weighted_sum(ints(x)), r.y = weighted_sum(ints(y));
    cudaDeviceSynchronize();
    for (int *p : {x, y, z}) cudaFree(p);
    cudaFreeHost(pinned);
    for (cudaEvent_t e : {filled, read, scaled}) cudaEventDestroy(e);
    for (cudaStream_t s : {a, b, c}) cudaStreamDestroy(s);
    return r;
}

static void test_stream_modes() {
    long long x = 0, y = 0, z = 0;
    for (long long i = 0; i < N; i++) x += (i + 1) * 6 * i, y += (i + 1) * (3 * i + 1), z += (i + 1) * (9 * i + 1);
    ProgramResult lazy = stream_program();
    CHECK(lazy.x == x && lazy.y == y && lazy.z == z && !lazy.at_once,
          "lazy: a program on three streams ordered by events gives the loops' results", "x %lld (want %lld), y %lld "
          "(%lld), z %lld (%lld), the last copy ran at once: %d", lazy.x, x, lazy.y, y, lazy.z, z, lazy.at_once);
    for (const char *mode : {"shuffle", "shuffle:2", "shuffle:3", "shuffle:4", "eager"}) {
        Ending e;
        std::string out = run_self(mode, "program", &e);
        ProgramResult r = {0, 0, 0, -1};
        sscanf(out.c_str(), "%lld %lld %lld %d", &r.x, &r.y, &r.z, &r.at_once);
        bool eager = !strcmp(mode, "eager");
        std::string what = std::string("EMU_STREAMS=") + mode + ": the same program gives the same results" +
                           (eager ? ", each operation run when enqueued" : ", deferred");
        CHECK(!e.died() && r.x == x && r.y == y && r.z == z && r.at_once == eager, what.c_str(),
              "it printed \"%s\" (want %lld %lld %lld %d), %s", out.c_str(), x, y, z, eager, e.how().c_str());
    }
    Ending e;
    run_self("sometimes", "program", &e);
    CHECK(e.died() && has(e.err, "emu: EMU_STREAMS=sometimes: expected lazy, shuffle[:seed] or eager"),
          "EMU_STREAMS with an unknown mode stops the program with the modes it takes", "%s", e.how().c_str());
}

// ----------------------------------------------------------------------------
// errors: CUDA's codes, the last error, and messages that name the problem

static void test_errors() {
    char *d;
    cudaMalloc((void **)&d, 100);
    std::vector<char> h(100);
    char *hp = h.data();
    cudaStream_t s;
    struct Case {
        const char *what;
        std::function<cudaError_t()> call;
        cudaError_t want;
        std::vector<std::string> message;
    } cases[] = {
        {"cudaFree of a host pointer", [&] { return cudaFree(hp); }, cudaErrorInvalidValue,
         {"cudaFree(", "): not the start of a device allocation"}},
        {"cudaFree inside an allocation", [&] { return cudaFree(d + 1); }, cudaErrorInvalidValue,
         {"not the start of a device allocation"}},
        {"cudaFreeHost of memory not from cudaMallocHost", [&] { return cudaFreeHost(hp); }, cudaErrorInvalidValue,
         {"cudaFreeHost(", "): not from cudaMallocHost"}},
        {"HostToDevice into host memory", [&] { return cudaMemcpy(hp, hp + 50, 10, cudaMemcpyHostToDevice); },
         cudaErrorInvalidValue, {"cudaMemcpy(HostToDevice): the destination", "(10 bytes) is not inside one device allocation"}},
        {"HostToDevice from device memory", [&] { return cudaMemcpy(d, d + 50, 10, cudaMemcpyHostToDevice); },
         cudaErrorInvalidValue, {"cudaMemcpy(HostToDevice): the source", "is device memory, where the kind says host"}},
        {"DeviceToHost past the allocation's end", [&] { return cudaMemcpy(hp, d, 101, cudaMemcpyDeviceToHost); },
         cudaErrorInvalidValue, {"cudaMemcpy(DeviceToHost): the source", "(101 bytes) is not inside one device allocation"}},
        {"DeviceToHost into device memory", [&] { return cudaMemcpyAsync(d, d + 50, 10, cudaMemcpyDeviceToHost, 0); },
         cudaErrorInvalidValue, {"cudaMemcpyAsync(DeviceToHost): the destination", "is device memory, where the kind says host"}},
        {"a copy of an unknown kind", [&] { return cudaMemcpy(d, d + 50, 10, (cudaMemcpyKind)7); },
         cudaErrorInvalidMemcpyDirection, {"cudaMemcpy: kind 7"}},
        {"cudaMemcpy2DAsync with a width beyond the pitch",
         [&] { return cudaMemcpy2DAsync(d, 10, hp, 10, 20, 2, cudaMemcpyHostToDevice, 0); }, cudaErrorInvalidValue,
         {"cudaMemcpy2DAsync: width 20 is wider than a pitch (10, 10)"}},
        {"cudaMemset past the allocation's end", [&] { return cudaMemset(d, 0, 101); }, cudaErrorInvalidValue,
         {"cudaMemset(", ", 101 bytes): not inside one device allocation"}},
        {"cudaStreamCreateWithFlags with unknown flags", [&] { return cudaStreamCreateWithFlags(&s, 4); },
         cudaErrorInvalidValue, {"cudaStreamCreateWithFlags: flags 4"}},
        {"cudaStreamDestroy of the legacy stream", [&] { return cudaStreamDestroy(0); }, cudaErrorInvalidResourceHandle,
         {"cudaStreamDestroy: the default stream"}},
        {"cudaSetDevice beyond EMU_DEVICE_COUNT", [&] { return cudaSetDevice(1); }, cudaErrorInvalidDevice,
         {"cudaSetDevice(1): there are 1 devices"}},
        {"cudaGetDeviceProperties beyond EMU_DEVICE_COUNT",
         [&] { cudaDeviceProp p; return cudaGetDeviceProperties(&p, 1); }, cudaErrorInvalidDevice,
         {"cudaGetDeviceProperties(1): there are 1 devices"}},
    };
    for (Case &c : cases) {
        cudaError_t err = cudaSuccess;
        std::string msg = stderr_of([&] { err = c.call(); });
        cudaError_t last = cudaGetLastError(), cleared = cudaGetLastError();
        bool named = has(msg, "emu: ");
        for (const std::string &part : c.message) named = named && has(msg, part);
        CHECK(err == c.want && last == c.want && cleared == cudaSuccess && named, c.what,
              "returned %s, cudaGetLastError %s then %s, message: %s", cudaGetErrorName(err), cudaGetErrorName(last),
              cudaGetErrorName(cleared), msg.c_str());
    }
    CHECK_BYTES(device_bytes(d, 100), Bytes(100, 0xFF), "the refused calls wrote nothing");
    cudaFree(d);
}

// the CUDA runtime's names and wording (cudaGetErrorName, cudaGetErrorString)
static void test_error_strings() {
    struct { cudaError_t err; const char *name, *text; } known[] = {
        {cudaSuccess, "cudaSuccess", "no error"},
        {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
        {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
        {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
        {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
        {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
        {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
        {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
        {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
        {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    };
    for (auto &k : known) {
        std::string what = std::string("cudaGetErrorName and cudaGetErrorString of ") + k.name;
        CHECK(!strcmp(cudaGetErrorName(k.err), k.name) && !strcmp(cudaGetErrorString(k.err), k.text), what.c_str(),
              "%s: \"%s\"", cudaGetErrorName(k.err), cudaGetErrorString(k.err));
    }
}

// an H100 SXM's (sm_90) limits, from NVIDIA's tables (compute capability 9.0)
static void test_device() {
    cudaDeviceProp p;
    cudaError_t err = cudaGetDeviceProperties(&p, 0);
    CHECK(err == cudaSuccess && p.major == 9 && p.minor == 0 && p.warpSize == 32 && p.maxThreadsPerBlock == 1024 &&
              p.maxThreadsDim[0] == 1024 && p.maxThreadsDim[1] == 1024 && p.maxThreadsDim[2] == 64 &&
              p.maxGridSize[0] == 2147483647 && p.maxGridSize[1] == 65535 && p.maxGridSize[2] == 65535 &&
              p.sharedMemPerBlock == 49152 && p.sharedMemPerBlockOptin == 232448 &&
              p.sharedMemPerMultiprocessor == 233472 && p.regsPerBlock == 65536 && p.multiProcessorCount == 132,
          "cudaGetDeviceProperties: sm_90's limits", "sm_%d%d, warp %d, %d threads, dims (%d, %d, %d), grid (%d, %d, %d), "
          "smem %zu / %zu optin / %zu an SM, %d registers, %d SMs", p.major, p.minor, p.warpSize, p.maxThreadsPerBlock,
          p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2], p.maxGridSize[0], p.maxGridSize[1],
          p.maxGridSize[2], p.sharedMemPerBlock, p.sharedMemPerBlockOptin, p.sharedMemPerMultiprocessor,
          p.regsPerBlock, p.multiProcessorCount);
    CHECK(p.totalGlobalMem == 80ull << 30, "cudaGetDeviceProperties: 80 GiB of memory unless EMU_DEVICE_MEMORY says",
          "%zu bytes", p.totalGlobalMem);
    setenv("EMU_DEVICE_COUNT", "2", 1);
    int count = 0, device = -1;
    cudaGetDeviceCount(&count);
    err = cudaSetDevice(1);
    cudaGetDevice(&device);
    CHECK(count == 2 && err == cudaSuccess && device == 1, "EMU_DEVICE_COUNT=2: two devices, the second can be set",
          "%d devices, cudaSetDevice(1): %s, current %d", count, cudaGetErrorName(err), device);
    cudaSetDevice(0);
    setenv("EMU_DEVICE_COUNT", "0", 1);
    std::string msg = stderr_of([&] { err = cudaGetDeviceCount(&count); });
    cudaGetLastError();
    CHECK(err == cudaErrorNoDevice && count == 0 && has(msg, "EMU_DEVICE_COUNT=0"),
          "EMU_DEVICE_COUNT=0: cudaGetDeviceCount gives cudaErrorNoDevice", "%s, %d", cudaGetErrorName(err), count);
    unsetenv("EMU_DEVICE_COUNT");
}

// ----------------------------------------------------------------------------
// what stops the program: each in a child process

static void test_protection() {
    // the handler a fault goes on to: the sanitizer's report (with the line), or
    // without one the default, which ends the program with SIGSEGV
#if defined(EMU_ASAN)
    const std::string sanitizer = "AddressSanitizer";
#elif defined(EMU_TSAN)
    const std::string sanitizer = "ThreadSanitizer";
#else
    const std::string sanitizer;
#endif
    auto went_on = [&](const Ending &e) {
        return sanitizer.empty() ? e.signal == SIGSEGV : e.died() && has(e.err, sanitizer + ": SEGV");
    };
    float *d;
    cudaMalloc(&d, 100 * sizeof(float));
    char want[256];
    // host code reading and writing device memory: the report names the allocation
    for (int write = 0; write < 2; write++) {
        Ending e = in_child([&] {
            if (write) d[99] = 1.0f;
            else { volatile float v = d[3]; (void)v; }
        });
        snprintf(want, sizeof want, "emu: host code touched device memory: byte %d of the allocation of 400 bytes at %p",
                 write ? 396 : 12, (void *)d);
        CHECK(has(e.err, want) && went_on(e),
              write ? "host code writing device memory stops with a report naming the allocation"
                    : "host code reading device memory stops with a report naming the allocation",
              "%s", e.how().c_str());
    }
    // a kernel writing the first byte past a 4096-byte allocation: ASan's poison
    // (every byte past the end) or, without ASan, the guard page after it
    char *p;
    cudaMalloc((void **)&p, 4096);
    Ending e = in_child([&] {
        poke_kernel<<<1, 1>>>(p, 4096);
        cudaDeviceSynchronize();
    });
    snprintf(want, sizeof want, "emu: kernel poke_kernel ran past the end of a device allocation of 4096 bytes at %p "
             "(byte 4096)", (void *)p);
    if (sanitizer == "AddressSanitizer") {
        CHECK(e.died() && has(e.err, "AddressSanitizer: use-after-poison") && has(e.err, "in poke_kernel"),
              "a kernel writing past an allocation is reported by ASan in the kernel", "%s", e.how().c_str());
        e = in_child([&] { // a byte that the page rounding leaves inside the mapping
            poke_kernel<<<1, 1>>>((char *)d, 400);
            cudaDeviceSynchronize();
        });
        CHECK(e.died() && has(e.err, "AddressSanitizer: use-after-poison") && has(e.err, "in poke_kernel"),
              "a kernel writing the first byte past a 400-byte allocation is reported by ASan", "%s", e.how().c_str());
    } else
        CHECK(has(e.err, want) && went_on(e),
              "a kernel writing past an allocation faults on its guard page, reported with the kernel", "%s",
              e.how().c_str());
    // a fault on no allocation goes on to the previous handler untouched
    static volatile uintptr_t nowhere = 16;
    e = in_child([] { *(volatile int *)nowhere = 1; });
    CHECK(!has(e.err, "emu:") && went_on(e), "a fault outside device memory goes on to the handler before the runtime's",
          "%s", e.how().c_str());
    // the runtime takes calls from one host thread (in a new process: ThreadSanitizer
    // does not start threads in a forked one)
    run_self("lazy", "second-thread", &e);
    CHECK(e.signal == SIGABRT && has(e.err, "emu: cudaStreamSynchronize called from a second host thread"),
          "a CUDA call from a second host thread stops the program", "%s", e.how().c_str());
    cudaFree(d);
    cudaFree(p);
}

int main(int argc, char **argv) {
    char path[4096];
    ssize_t len = readlink("/proc/self/exe", path, sizeof path - 1);
    self_path.assign(path, len > 0 ? (size_t)len : 0);
    if (argc == 2 && !strcmp(argv[1], "program")) { // a child of test_stream_modes, in its EMU_STREAMS mode
        ProgramResult r = stream_program();
        printf("%lld %lld %lld %d\n", r.x, r.y, r.z, r.at_once);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "second-thread")) { // a child of test_protection: must stop
        cudaStreamSynchronize(0);
        std::thread([] { cudaStreamSynchronize(0); }).join();
        return 0;
    }
    setenv("EMU_STREAMS", "lazy", 1); // what the checks below expect: each operation runs when the host forces it
    test_allocation_limit();
    test_fresh_allocation();
    test_copies();
    test_copy_2d();
    test_memset();
    test_stream_order();
    test_event_wait();
    test_legacy_stream();
    test_lazy_defers();
    test_staging();
    test_stream_destroy();
    test_event_timing();
    test_stream_modes();
    test_errors();
    test_error_strings();
    test_device();
    test_protection();
    return test_summary();
}
