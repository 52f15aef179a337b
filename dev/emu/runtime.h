// dev/emu/runtime.h: the host side of the execution layer. The CUDA runtime
// calls llama2.tune makes, with the semantics a GPU gives them:
//   - device memory is not host memory: every cudaMalloc is its own mapping,
//     filled with 0xFF bytes (NaN as floats, so an element nothing wrote shows),
//     and closed (PROT_NONE) whenever host code runs; it opens only while
//     enqueued work (a kernel, a copy, a cuBLAS or NCCL call) runs. A host read or
//     write of a device pointer stops the program with the allocation named. Past
//     each allocation's end lies poisoned slack (AddressSanitizer) and a guard
//     page, so a kernel that runs off the end is stopped at its line;
//   - work on one stream runs in order; work on different streams is ordered only
//     by events, the legacy default stream's implicit synchronization and the
//     host's synchronizing calls. EMU_STREAMS says when work runs:
//       lazy (the default)  each operation as late as the host allows: when it
//                           synchronizes a stream, an event or the device, or
//                           makes a copy that CUDA completes before returning
//                           (copy_2d says which); other streams' work only
//                           when what was forced depends on it (an event wait)
//       shuffle[:seed]      lazy, and the forced operations of different streams
//                           interleaved in a random order
//       eager               each operation when it is enqueued (easiest to debug)
//     So a missing cudaStreamWaitEvent, or a host read before the stream that
//     writes it was synchronized, gives a wrong (stale, or NaN) result;
//   - the device is an sm_90 with EMU_DEVICE_MEMORY GiB (default 80) of memory;
//     EMU_DEVICE_COUNT devices (default 1);
//   - calls come from one host thread (host_call).
// Calls that get bad arguments print "emu: <call>: <problem>" and return CUDA's
// error code, which the sources' cudaCheck turns into a stop at their line.
#pragma once
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include "types.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaHostRegisterDefault = 0 };
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };

// the fields of CUDA's cudaDeviceProp that a program here may read
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor;
    int warpSize, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3], multiProcessorCount, major, minor;
    int regsPerBlock, l2CacheSize, memoryBusWidth;
};

namespace emu {

// ----------------------------------------------------------------------------
// reports and the last error

// "emu: <message>" on stderr, after whatever the program has printed so far
inline void report(const char *fmt, va_list ap) {
    fflush(stdout);
    fprintf(stderr, "emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
}
[[noreturn]] inline void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(fmt, ap);
    va_end(ap);
    abort();
}

inline thread_local cudaError_t last_error = cudaSuccess; // CUDA keeps one per host thread
inline void set_last_error(cudaError_t err) { last_error = err; }

// a call's failure: the message, the error for cudaGetLastError, the code to return
inline cudaError_t error(cudaError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
inline cudaError_t error(cudaError_t err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(fmt, ap);
    va_end(ap);
    set_last_error(err);
    return err;
}

inline double env_number(const char *name, double fallback) {
    const char *s = getenv(name);
    if (!s || !*s) return fallback;
    char *end;
    double v = strtod(s, &end);
    if (*end || !(v >= 0)) fail("%s=%s: expected a non-negative number", name, s);
    return v;
}

// ----------------------------------------------------------------------------
// device memory: a mapping per allocation, open only while device work runs

struct Allocation {
    char *base;
    size_t bytes, mapped; // mapped: bytes up to a whole page, then one guard page
};

inline std::map<uintptr_t, Allocation> allocations; // by base address
inline size_t device_used = 0;
inline bool device_open = false; // device work is running: the allocations are readable
inline size_t page_size() { static size_t p = (size_t)sysconf(_SC_PAGESIZE); return p; }
inline size_t device_total() { return (size_t)(env_number("EMU_DEVICE_MEMORY", 80) * (1ull << 30)); }

// the allocation whose mapping (guard page included) holds p, or NULL
inline const Allocation *allocation_at(const void *p) {
    auto it = allocations.upper_bound((uintptr_t)p);
    if (it == allocations.begin()) return nullptr;
    --it;
    const Allocation &a = it->second;
    return (const char *)p < a.base + a.mapped ? &a : nullptr;
}
// whether [p, p + n) lies inside one allocation's bytes
inline bool is_device_range(const void *p, size_t n) {
    const Allocation *a = allocation_at(p);
    return a && (size_t)((const char *)p - a->base) + n <= a->bytes;
}

inline void protect(const Allocation &a, int prot) {
    if (mprotect(a.base, a.mapped - page_size(), prot) != 0) fail("mprotect: %s", strerror(errno));
}
inline void open_device() {
    for (auto &kv : allocations) protect(kv.second, PROT_READ | PROT_WRITE);
    device_open = true;
}
inline void close_device() {
    for (auto &kv : allocations) protect(kv.second, PROT_NONE);
    device_open = false;
}

// SIGSEGV on an allocation: host code touched device memory, or device work ran
// past an allocation's end into its guard page; the report names the allocation
// (and the operation running). Then, as for any other fault, the handler that was
// there before takes it: the faulting access repeats under it. AddressSanitizer's
// prints the stack of the access (its source line); the default ends the program.
inline struct sigaction previous_segv;
inline const char *running_what = nullptr; // the operation running ("kernel k", "cudaMemcpyAsync"), or NULL
inline void on_segv(int, siginfo_t *info, void *) {
    const Allocation *a = allocation_at(info->si_addr);
    if (a) {
        size_t at = (size_t)((char *)info->si_addr - a->base);
        char msg[512];
        int n = at >= a->bytes
            ? snprintf(msg, sizeof msg, "emu: %s ran past the end of a device allocation of %zu bytes at %p (byte %zu)\n",
                       running_what ? running_what : "host code", a->bytes, (void *)a->base, at)
            : snprintf(msg, sizeof msg, "emu: host code touched device memory: byte %zu of the allocation of %zu bytes at "
                       "%p (a device pointer used outside a kernel or a copy)\n", at, a->bytes, (void *)a->base);
        if (write(2, msg, (size_t)std::min(n, (int)sizeof msg - 1)) < 0) {}
    }
    sigaction(SIGSEGV, &previous_segv, nullptr);
}
inline void install_segv_handler() {
    static bool installed = false;
    if (installed) return;
    installed = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
}

// pinned host memory (cudaMallocHost): its address ranges, since a copy from or to
// it runs when the stream gets to it, where one from pageable memory does not
inline std::map<uintptr_t, size_t> pinned;
inline bool is_pinned(const void *p, size_t n) {
    auto it = pinned.upper_bound((uintptr_t)p);
    if (it == pinned.begin()) return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

// ----------------------------------------------------------------------------
// streams and events

struct Op {
    uint64_t seq; // its place in its stream, from 1
    std::string what;
    std::function<void()> run;
    std::vector<std::pair<Stream *, uint64_t>> after; // other streams' operations it waits for
};

} // namespace emu

struct emu::Stream {
    Stream(int id_, bool blocking_) : id(id_), blocking(blocking_) {}
    int id;
    bool blocking, destroyed = false;
    std::deque<Op> queue;
    uint64_t enqueued = 0, done = 0; // seq of the last operation enqueued, and run
};
struct emu::Event {
    Stream *stream = nullptr;
    uint64_t seq = 0;
    bool timing;
    std::shared_ptr<double> ran_at; // when the recorded point ran (seconds), < 0 before
};

namespace emu {

enum StreamMode { LAZY, SHUFFLE, EAGER };
struct Streams {
    StreamMode mode = LAZY;
    std::mt19937_64 rng;
    std::vector<std::unique_ptr<Stream>> all; // every stream ever created; all[0] is the legacy default stream
    bool running = false;      // an operation is running (it may not enqueue or synchronize)
    Streams() {
        const char *s = getenv("EMU_STREAMS");
        std::string m = s && *s ? s : "lazy";
        if (m == "lazy") mode = LAZY;
        else if (m == "eager") mode = EAGER;
        else if (m.rfind("shuffle", 0) == 0 && (m.size() == 7 || m[7] == ':')) {
            mode = SHUFFLE;
            rng.seed(m.size() > 8 ? strtoull(m.c_str() + 8, nullptr, 10) : 1);
        } else
            fail("EMU_STREAMS=%s: expected lazy, shuffle[:seed] or eager", s);
        all.emplace_back(new Stream(0, true));
    }
};
inline Streams &streams() { static Streams s; return s; }
inline Stream *legacy_stream() { return streams().all[0].get(); }

// Checks the calling context of a runtime call. Its state (allocations, streams)
// has no locks: CUDA takes calls from any host thread, llama2.tune's programs make
// them from one, and a call from a second thread stops the program instead of
// racing. Operations (kernels, copies, cuBLAS) run inside a call and make none.
inline void host_call(const char *call) {
    static const pthread_t first = pthread_self();
    if (!pthread_equal(first, pthread_self()))
        fail("%s called from a second host thread: the emulated runtime takes calls from one", call);
    if (streams().running) fail("%s called from inside a stream's operation", call);
}
inline Stream *stream_of(cudaStream_t s, const char *call) {
    host_call(call);
    Stream *st = s ? s : legacy_stream();
    if (st->destroyed) fail("%s: stream %d was destroyed", call, st->id);
    return st;
}

// Run every operation up to (stream, seq) and whatever it waits for, as late as
// that: nothing else. An operation is ready when everything before it in its
// stream and everything it waits for has run; of the ready ones, lazy runs the
// lowest stream first, shuffle a random one.
inline void run_until(Stream *target, uint64_t seq) {
    Streams &ss = streams();
    std::vector<uint64_t> need(ss.all.size(), 0);
    need[target->id] = seq;
    for (bool grew = true; grew;) { // what the needed operations wait for is needed too
        grew = false;
        for (auto &st : ss.all)
            for (const Op &op : st->queue) {
                if (op.seq > need[st->id]) break;
                for (auto &w : op.after)
                    if (w.second > need[w.first->id]) need[w.first->id] = w.second, grew = true;
            }
    }
    bool opened = false;
    for (;;) {
        std::vector<Stream *> ready;
        for (auto &owned : ss.all) {
            Stream *st = owned.get();
            if (st->queue.empty() || st->queue.front().seq > need[st->id]) continue;
            bool ok = true;
            for (auto &w : st->queue.front().after) ok = ok && w.first->done >= w.second;
            if (ok) ready.push_back(st);
        }
        if (ready.empty()) break;
        Stream *st = ss.mode == SHUFFLE ? ready[ss.rng() % ready.size()] : ready[0];
        if (!opened) open_device(), opened = true;
        Op op = std::move(st->queue.front());
        st->queue.pop_front();
        ss.running = true;
        running_what = op.what.c_str();
        op.run();
        running_what = nullptr;
        ss.running = false;
        st->done = op.seq;
    }
    if (opened) close_device();
    if (target->done < seq) fail("stream %d cannot reach its operation %llu: it waits for work that never comes",
                                 target->id, (unsigned long long)seq);
}
inline void synchronize_all() {
    for (auto &st : streams().all) run_until(st.get(), st->enqueued);
}

// Queue an operation on a stream; returns its seq. The legacy default stream
// waits for all earlier work of the blocking streams (destroyed ones too, whose
// work still runs), and they for its.
inline uint64_t enqueue_after(Stream *st, const char *what, std::function<void()> run,
                              std::vector<std::pair<Stream *, uint64_t>> after) {
    Streams &ss = streams();
    for (auto &owned : ss.all) {
        Stream *other = owned.get();
        if (other == st || other->done == other->enqueued || !other->blocking || !st->blocking) continue;
        if (st == legacy_stream() || other == legacy_stream()) after.push_back({other, other->enqueued});
    }
    st->queue.push_back(Op{++st->enqueued, what, std::move(run), std::move(after)});
    if (ss.mode == EAGER) run_until(st, st->enqueued);
    return st->enqueued;
}
inline void enqueue(cudaStream_t s, const char *what, std::function<void()> op) {
    enqueue_after(stream_of(s, what), what, std::move(op), {});
}

} // namespace emu

// ----------------------------------------------------------------------------
// errors

inline cudaError_t cudaGetLastError() {
    cudaError_t err = emu::last_error;
    emu::last_error = cudaSuccess;
    return err;
}
inline cudaError_t cudaPeekAtLastError() { return emu::last_error; }

inline const char *cudaGetErrorName(cudaError_t err) {
    switch (err) {
#define EMU_NAME(e) case e: return #e;
    EMU_NAME(cudaSuccess) EMU_NAME(cudaErrorInvalidValue) EMU_NAME(cudaErrorMemoryAllocation)
    EMU_NAME(cudaErrorInitializationError) EMU_NAME(cudaErrorLaunchFailure) EMU_NAME(cudaErrorInvalidConfiguration)
    EMU_NAME(cudaErrorInvalidDevicePointer) EMU_NAME(cudaErrorInvalidMemcpyDirection)
    EMU_NAME(cudaErrorInsufficientDriver) EMU_NAME(cudaErrorNoDevice) EMU_NAME(cudaErrorInvalidDevice)
    EMU_NAME(cudaErrorNoKernelImageForDevice) EMU_NAME(cudaErrorUnsupportedPtxVersion)
    EMU_NAME(cudaErrorInvalidResourceHandle) EMU_NAME(cudaErrorNotReady) EMU_NAME(cudaErrorIllegalAddress)
    EMU_NAME(cudaErrorLaunchOutOfResources) EMU_NAME(cudaErrorMisalignedAddress)
#undef EMU_NAME
    }
    return "cudaErrorUnknown";
}
// the CUDA runtime's own wording
inline const char *cudaGetErrorString(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    case cudaErrorUnsupportedPtxVersion: return "the provided PTX was compiled with an unsupported toolchain.";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorMisalignedAddress: return "misaligned address";
    }
    return "unknown error";
}

// ----------------------------------------------------------------------------
// the device

inline int emu_device_count() { return (int)emu::env_number("EMU_DEVICE_COUNT", 1); }
inline thread_local int emu_current_device = 0;

inline cudaError_t cudaGetDeviceCount(int *count) {
    *count = emu_device_count();
    return *count ? cudaSuccess : emu::error(cudaErrorNoDevice, "cudaGetDeviceCount: EMU_DEVICE_COUNT=0");
}
inline cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= emu_device_count())
        return emu::error(cudaErrorInvalidDevice, "cudaSetDevice(%d): there are %d devices", device, emu_device_count());
    emu_current_device = device;
    return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int *device) { *device = emu_current_device; return cudaSuccess; }

// an H100's limits (sm_90), the memory EMU_DEVICE_MEMORY says
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
    if (device < 0 || device >= emu_device_count())
        return emu::error(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d): there are %d devices", device,
                          emu_device_count());
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "emulated sm_90 (CPU)");
    p->totalGlobalMem = emu::device_total();
    p->sharedMemPerBlock = emu::DEFAULT_MAX_DYNAMIC_SMEM;
    p->sharedMemPerBlockOptin = emu::MAX_SMEM_PER_BLOCK_OPTIN;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->warpSize = emu::WARP_SIZE;
    p->maxThreadsPerBlock = emu::MAX_THREADS_PER_BLOCK;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = (int)emu::MAX_GRID_X, p->maxGridSize[1] = p->maxGridSize[2] = (int)emu::MAX_GRID_YZ;
    p->multiProcessorCount = 132;
    p->major = 9, p->minor = 0;
    p->regsPerBlock = 65536, p->l2CacheSize = 50 << 20, p->memoryBusWidth = 5120;
    return cudaSuccess;
}

inline cudaError_t cudaDeviceSynchronize() {
    emu::host_call("cudaDeviceSynchronize");
    emu::synchronize_all();
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// memory

inline cudaError_t cudaMalloc(void **p, size_t bytes) {
    emu::host_call("cudaMalloc");
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    if (bytes > emu::device_total() - emu::device_used)
        return emu::error(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes): out of memory (%zu of %zu bytes in use; "
                          "EMU_DEVICE_MEMORY sets the size in GiB)", bytes, emu::device_used, emu::device_total());
    size_t page = emu::page_size(), mapped = (bytes + page - 1) / page * page + page;
    void *base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return emu::error(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes): mmap: %s", bytes, strerror(errno));
    emu::install_segv_handler();
    memset(base, 0xFF, bytes); // NaN as floats (and bf16): an element nothing writes shows
    emu::Allocation a = {(char *)base, bytes, mapped};
#ifdef EMU_ASAN
    ASAN_POISON_MEMORY_REGION(a.base + bytes, mapped - bytes); // a read past the end, reported where it is
#endif
    if (mprotect(a.base + mapped - page, page, PROT_NONE) != 0) emu::fail("mprotect: %s", strerror(errno));
    if (!emu::device_open) emu::protect(a, PROT_NONE);
    emu::allocations[(uintptr_t)base] = a;
    emu::device_used += bytes;
    *p = base;
    return cudaSuccess;
}

inline cudaError_t cudaFree(void *p) {
    emu::host_call("cudaFree");
    if (!p) return cudaSuccess;
    auto it = emu::allocations.find((uintptr_t)p);
    if (it == emu::allocations.end())
        return emu::error(cudaErrorInvalidValue, "cudaFree(%p): not the start of a device allocation", p);
    cudaDeviceSynchronize(); // as CUDA's cudaFree does: work still queued may use it
    emu::Allocation a = it->second;
#ifdef EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(a.base, a.mapped); // the addresses may be mapped again
#endif
    munmap(a.base, a.mapped);
    emu::device_used -= a.bytes;
    emu::allocations.erase(it);
    return cudaSuccess;
}

// CUDA's C++ overloads for typed pointers
template <typename T> inline cudaError_t cudaMalloc(T **p, size_t bytes) { return cudaMalloc((void **)p, bytes); }

inline cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    *total_bytes = emu::device_total();
    *free_bytes = *total_bytes - emu::device_used;
    return cudaSuccess;
}

inline cudaError_t cudaMallocHost(void **p, size_t bytes) {
    emu::host_call("cudaMallocHost");
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    if (!*p) return emu::error(cudaErrorMemoryAllocation, "cudaMallocHost(%zu bytes): out of host memory", bytes);
    emu::pinned[(uintptr_t)*p] = bytes;
    return cudaSuccess;
}
template <typename T> inline cudaError_t cudaMallocHost(T **p, size_t bytes) { return cudaMallocHost((void **)p, bytes); }
inline cudaError_t cudaFreeHost(void *p) {
    emu::host_call("cudaFreeHost");
    if (!p) return cudaSuccess;
    auto it = emu::pinned.find((uintptr_t)p);
    if (it == emu::pinned.end()) return emu::error(cudaErrorInvalidValue, "cudaFreeHost(%p): not from cudaMallocHost", p);
    cudaDeviceSynchronize(); // a copy still queued may read or write it
    emu::pinned.erase(it);
    free(p);
    return cudaSuccess;
}

// host memory of the caller's made pinned (cudaHostRegister: --cpu_offload's QLoRA runs, which
// the host model holds already) and back; its copies then run in stream order, as cudaMallocHost's
inline cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned int flags) {
    emu::host_call("cudaHostRegister");
    (void)flags;
    if (!p || !bytes) return emu::error(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu bytes): nothing to register", p, bytes);
    if (emu::is_pinned(p, 1)) return emu::error(cudaErrorInvalidValue, "cudaHostRegister(%p): already pinned", p);
    emu::pinned[(uintptr_t)p] = bytes;
    return cudaSuccess;
}
inline cudaError_t cudaHostUnregister(void *p) {
    emu::host_call("cudaHostUnregister");
    auto it = emu::pinned.find((uintptr_t)p);
    if (it == emu::pinned.end()) return emu::error(cudaErrorInvalidValue, "cudaHostUnregister(%p): not registered", p);
    cudaDeviceSynchronize(); // a copy still queued may read it
    emu::pinned.erase(it);
    return cudaSuccess;
}

namespace emu {
inline const char *kind_name(cudaMemcpyKind k) {
    static const char *names[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};
    return (unsigned)k <= 4 ? names[k] : "an unknown kind";
}
// checks one side of a copy: on the device (the whole range in one allocation),
// or on the host (no byte of it in an allocation)
inline cudaError_t check_side(const char *call, cudaMemcpyKind kind, const char *side, const void *p, size_t n,
                              bool device) {
    if (device ? is_device_range(p, n) : !allocation_at(p) && !allocation_at((const char *)p + n - 1)) return cudaSuccess;
    return error(cudaErrorInvalidValue, "%s(%s): the %s %p (%zu bytes) is %s", call, kind_name(kind), side, p, n,
                 device ? "not inside one device allocation" : "device memory, where the kind says host");
}
// a copy of a (height x width bytes) region between pitched rows, as an operation on a stream
inline cudaError_t copy_2d(const char *call, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool sync) {
    if (width == 0 || height == 0) return cudaSuccess;
    if (width > dpitch || width > spitch)
        return error(cudaErrorInvalidValue, "%s: width %zu is wider than a pitch (%zu, %zu)", call, width, dpitch, spitch);
    if ((unsigned)kind > 4) return error(cudaErrorInvalidMemcpyDirection, "%s: kind %d", call, (int)kind);
    size_t dn = dpitch * (height - 1) + width, sn = spitch * (height - 1) + width;
    if (kind == cudaMemcpyDefault)
        kind = (cudaMemcpyKind)((allocation_at(src) ? 2 : 0) + (allocation_at(dst) ? 1 : 0));
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    cudaError_t err = check_side(call, kind, "destination", dst, dn, dst_dev);
    if (err == cudaSuccess) err = check_side(call, kind, "source", src, sn, src_dev);
    if (err != cudaSuccess) return err;
    // Pageable host memory is staged as CUDA stages it: the source is read now.
    // Pinned memory is read and written when the stream gets there.
    bool pinned_src = !src_dev && is_pinned(src, sn), pinned_dst = !dst_dev && is_pinned(dst, dn);
    std::shared_ptr<std::vector<char>> staged;
    if (!src_dev && !pinned_src) {
        staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + sn);
        src = staged->data();
    }
    Stream *st = stream_of(stream, call);
    uint64_t seq = enqueue_after(st, call, [=]() {
        for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
        (void)staged;
    }, {});
    // Which copies are done when the call returns (CUDA's "API synchronization
    // behavior"): into pageable host memory or between host buffers, always;
    // cudaMemcpy into the host, or from pinned memory to the device. cudaMemcpy
    // between device buffers, or from pageable memory (staged), returns before the
    // device has the bytes: only its stream's order, or a synchronize, sees them.
    if (dst_dev ? sync && pinned_src : !src_dev || sync || !pinned_dst) run_until(st, seq);
    return cudaSuccess;
}
// cudaMemset too returns before it runs (on device memory, CUDA's memsets all do)
inline cudaError_t memset_on(const char *call, void *p, int value, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    if (!is_device_range(p, n))
        return error(cudaErrorInvalidValue, "%s(%p, %zu bytes): not inside one device allocation", call, p, n);
    enqueue_after(stream_of(stream, call), call, [=]() { memset(p, value, n); }, {});
    return cudaSuccess;
}
} // namespace emu

inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s = 0) {
    return emu::copy_2d("cudaMemcpyAsync", dst, n, src, n, n, 1, kind, s, false);
}
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    return emu::copy_2d("cudaMemcpy", dst, n, src, n, n, 1, kind, nullptr, true);
}
inline cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                     size_t height, cudaMemcpyKind kind, cudaStream_t s = 0) {
    return emu::copy_2d("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, s, false);
}
inline cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s = 0) {
    return emu::memset_on("cudaMemsetAsync", p, value, n, s);
}
inline cudaError_t cudaMemset(void *p, int value, size_t n) {
    return emu::memset_on("cudaMemset", p, value, n, nullptr);
}

// ----------------------------------------------------------------------------
// streams and events

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    if (flags & ~1u) return emu::error(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: flags %u", flags);
    emu::Streams &ss = emu::streams();
    *s = new emu::Stream((int)ss.all.size(), !(flags & cudaStreamNonBlocking));
    ss.all.emplace_back(*s);
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    emu::Stream *st = emu::stream_of(s, "cudaStreamSynchronize");
    emu::run_until(st, st->enqueued);
    return cudaSuccess;
}
// It returns at once and its work still runs (CUDA lets it finish), when another
// stream's work or a synchronize needs it; the stream object stays, marked, so that
// a later use is reported instead of reading freed memory.
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return emu::error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: the default stream");
    emu::stream_of(s, "cudaStreamDestroy")->destroyed = true;
    return cudaSuccess;
}

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    if (flags & ~3u) return emu::error(cudaErrorInvalidValue, "cudaEventCreateWithFlags: flags %u", flags);
    *e = new emu::Event{nullptr, 0, !(flags & cudaEventDisableTiming), nullptr};
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
// the event marks the stream's work so far; the mark notes when it ran
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0) {
    emu::Stream *st = emu::stream_of(s, "cudaEventRecord");
    auto ran_at = std::make_shared<double>(-1.0);
    e->stream = st;
    e->ran_at = ran_at;
    e->seq = emu::enqueue_after(st, "cudaEventRecord", [ran_at]() {
        *ran_at = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }, {});
    return cudaSuccess;
}
// (its stream may have been destroyed since the record)
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    emu::host_call("cudaEventSynchronize");
    if (e->stream) emu::run_until(e->stream, e->seq);
    return cudaSuccess;
}
// the stream's later work waits for the event's mark (none if never recorded)
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0) {
    emu::Stream *st = emu::stream_of(s, "cudaStreamWaitEvent");
    if (flags) return emu::error(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags %u", flags);
    if (e->stream && e->stream != st) emu::enqueue_after(st, "cudaStreamWaitEvent", []() {}, {{e->stream, e->seq}});
    return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start->timing || !end->timing)
        return emu::error(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event created with cudaEventDisableTiming");
    if (!start->ran_at || !end->ran_at)
        return emu::error(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event never recorded");
    if (*start->ran_at < 0 || *end->ran_at < 0) return cudaErrorNotReady; // recorded, not yet run
    *ms = (float)((*end->ran_at - *start->ran_at) * 1e3);
    return cudaSuccess;
}
