// dev/emu/device.h: the device side of the execution layer. A kernel launch
// becomes a grid of blocks run on the CPU with CUDA's semantics:
//   - every thread of a block runs in its own context (fiber.h) until it waits at
//     __syncthreads, at a warp collective, or returns; then the next one runs;
//   - __syncthreads is a real barrier, the __shfl_*_sync family and __syncwarp wait
//     for every lane of their mask; nvcuda::wmma (mma.h) builds on the same waits;
//   - __shared__ memory is per block and starts as NaN (every byte 0xFF), so a read
//     of what no thread wrote shows; dynamic shared memory is a heap block of
//     exactly the launch's bytes, so AddressSanitizer catches an overflow past it;
//   - launches are checked as sm_90 checks them, and fail with the kernel's name.
// Blocks run one after another in grid order, in a shuffled order with
// EMU_SHUFFLE=<seed> (a block that reads what another block of the launch writes
// then sees a different value), and on several OS threads with EMU_THREADS=<n>.
//
// Checks, each a report that names the kernel, the block, the threads and the
// source lines, then abort() (through emu::fail):
//   - threads of a block waiting at different __syncthreads, part of a block
//     exiting while the rest waits at one, lanes of a warp at different collectives
//     or with different masks (all found when no thread of the block can go on);
//   - a mask that leaves out the calling lane or names lanes the block lacks;
//   - built with -fsanitize=thread, a data race (shared or global memory) between
//     threads of a launch that no barrier or warp collective orders: every
//     thread is a ThreadSanitizer fiber and every barrier, warp collective and
//     launch is a happens-before edge, so TSan reports the two racing lines.
//
// The rewrite step (rewrite.pl) turns `k<<<grid, block, smem, stream>>>(args)`
// into emu::launch(...)(args) and __shared__ declarations into the calls below.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>
#include <cxxabi.h>
#include <deque>
#include <dlfcn.h>
#include <pthread.h>
#include "types.h"
#include "fiber.h"

// ----------------------------------------------------------------------------
// CUDA's qualifiers: everything is host code here

#define __global__
#define __device__
#define __host__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
// __restrict__ is GCC's own spelling too

struct alignas(16) uint4 { unsigned int x, y, z, w; };
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }

// CUDA's min and max for device code (std::min's, in the global namespace)
template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>> inline T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>> inline T max(T a, T b) {
    return a < b ? b : a;
}

constexpr int warpSize = emu::WARP_SIZE;

// fp32 operations rounded one at a time, never fused into a multiply-add (volatile:
// whatever -ffp-contract says)
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }

namespace emu {

// ----------------------------------------------------------------------------
// happens-before edges for ThreadSanitizer (nothing in other builds)

inline void sync_release(void *token) {
#ifdef EMU_TSAN
    __tsan_release(token);
#else
    (void)token;
#endif
}
inline void sync_acquire(void *token) {
#ifdef EMU_TSAN
    __tsan_acquire(token);
#else
    (void)token;
#endif
}
// ----------------------------------------------------------------------------
// kernels: their names and function attributes

struct KernelInfo {
    std::string name, what;                               // "rmsnorm_forward_kernel<float>", "kernel " + name
    size_t max_dynamic_smem = DEFAULT_MAX_DYNAMIC_SMEM;   // cudaFuncSetAttribute raises it
    size_t static_smem = 0; // the __shared__ bytes its blocks allocated (known once a block ran)
};

// the kernel's name: its symbol (dladdr, the program linked with -rdynamic),
// demangled, without return and parameter types; else the launch's source text
inline std::string kernel_name(const void *fn, const char *text) {
    Dl_info info;
    if (!dladdr(fn, &info) || !info.dli_sname || info.dli_saddr != fn) return text;
    int status = 0;
    char *d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    if (status != 0 || !d) return info.dli_sname;
    std::string s = d;
    free(d);
    // "void name<T, 4>(float*, int)": the parameters are after the last top-level '('
    int depth = 0;
    size_t open = std::string::npos;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '<') depth++;
        else if (s[i] == '>') depth--;
        else if (s[i] == '(' && depth == 0) open = i;
    }
    if (open != std::string::npos) s.resize(open);
    if (s.compare(0, 5, "void ") == 0) s.erase(0, 5);
    return s;
}

inline std::mutex kernels_mutex;
// a kernel's entry, by its pointer (null: by the launch site's text)
inline KernelInfo &kernel_info(const void *fn, const char *text) {
    static std::map<const void *, KernelInfo> *kernels = new std::map<const void *, KernelInfo>; // never freed
    std::lock_guard<std::mutex> lock(kernels_mutex);
    KernelInfo &k = (*kernels)[fn ? fn : text];
    if (k.name.empty()) {
        k.name = fn ? kernel_name(fn, text) : text;
        k.what = "kernel " + k.name;
    }
    return k;
}

// ----------------------------------------------------------------------------
// a launch, and the threads of a block

struct Grid {
    KernelInfo *kernel;
    const char *file; // the launch site
    int line;
    dim3 grid, block;
    size_t smem;                      // dynamic shared memory bytes
    void (*thunk)(const void *args); // calls the kernel with its bound arguments
    const void *args;
    char start_token, end_token;      // TSan: the launch before its threads, its threads before what follows
};

// One thread's part in a warp collective: what every lane of the mask must agree
// on, its own operands, and its result. The last lane of the mask to arrive checks
// that they agree and runs `complete` once for all of them.
struct Lane;
struct Collective {
    const char *name;       // "__shfl_xor_sync", "wmma::mma_sync", ...
    const char *file;       // where this lane called it
    int line;
    unsigned mask;
    void (*complete)(Lane *warp, unsigned mask);
    const void *ptr;        // wmma: the matrix in memory
    unsigned ldm;
    int layout, width, kind;
    int arg;                // per lane: shfl's source lane, delta or lane mask; vote's predicate
    uint64_t value, result; // per lane: the bits shfl moves (up to 8 bytes), a vote's result
    const void *in[3];      // per lane: wmma's fragments
    void *out;
};

struct Lane {
    enum State : unsigned char { UNSTARTED, RUNNING, RUNNABLE, AT_BARRIER, AT_WARP, DONE };
    Context ctx;
    Stack stack;
    uint3 thread_idx;
    unsigned id;            // linear thread index in the block
    State state;
    Collective op;          // at a barrier: name, file and line only
    unsigned ring_slot;     // TSan: the token of the collective it waited at
    char token;             // TSan: released when it arrives at a collective
};

[[noreturn]] inline void fail_outside_kernel(const char *what) {
    fail("%s used outside a kernel (host code has no GPU thread)", what);
}

struct Block;
inline thread_local Block *cur_block;
inline thread_local Lane *cur_lane;

// Runs the blocks of launches, one at a time, on one OS thread; reused (its
// lanes, stacks and queues) from block to block.
struct Block {
    const Grid *g = nullptr;
    uint3 block_idx;
    unsigned n = 0;                         // threads
    std::vector<Lane> lanes;
    unsigned started = 0, done = 0;
    std::vector<unsigned> queue;            // runnable lanes, a ring of n
    unsigned q_head = 0, q_len = 0;
    std::vector<unsigned> warp_arrived;     // per warp: lanes waiting at a collective
    std::vector<unsigned> warp_completions; // per warp: collectives completed (TSan ring slots)
    std::vector<char> warp_ring;            // TSan: 32 tokens per warp, one per recent collective
    // __syncthreads: how many wait, and whether all at the same one
    unsigned at_barrier = 0;
    bool barrier_same = true;
    const char *barrier_file = nullptr;
    int barrier_line = 0;
    char barrier_arrive_token, barrier_done_token;
    // shared memory: static __shared__ variables (found by their declaration's key), dynamic
    struct StaticVar { const void *key; void *ptr; size_t bytes; };
    std::vector<StaticVar> static_vars;
    size_t static_bytes = 0;
    void *dynamic = nullptr;
    std::vector<Stack> free_stacks;
    Context main; // the OS thread's own context: runs the scheduler between blocks
#ifdef EMU_TSAN
    static constexpr size_t TSAN_KEPT_FIBERS = 1024;
    std::deque<void *> kept_fibers;
#endif

    void run(const Grid &grid, uint3 idx);
    Context *pass_on(Lane *from, bool from_ends);
    void switch_from(Lane *from, bool from_ends);
    Lane *next_lane();
    void make_runnable(Lane *l);
    void *static_shared(const void *key, size_t bytes, size_t align);
    [[noreturn]] void report_stuck();
    std::string where() const;
};

inline Block &this_os_thread_block() {
    thread_local Block *b = new Block; // never freed: the threads of a block may still be referenced at exit
    return *b;
}

inline std::string Block::where() const {
    char s[512];
    snprintf(s, sizeof s, "kernel %s (launched at %s:%d), block (%u,%u,%u) of grid (%u,%u,%u), %u threads",
             g->kernel->name.c_str(), g->file, g->line, block_idx.x, block_idx.y, block_idx.z, g->grid.x, g->grid.y,
             g->grid.z, n);
    return s;
}

inline void lane_entry() {
    context_started();
    Block *b = cur_block;
    Lane *l = cur_lane;
    sync_acquire((void *)&b->g->start_token);
    b->g->thunk(b->g->args);
    Context *next;
    {
        EMU_BOOKKEEPING; // ends before the last switch: TSan wants no ignore left on a finished fiber
        sync_release((void *)&b->g->end_token);
        l->state = Lane::DONE;
        b->done++;
        next = b->pass_on(l, true);
    }
    context_switch(&l->ctx, next, true);
    __builtin_unreachable();
}

// the next lane to run: a runnable one, else one not started yet (in thread
// order), else none (the block is done, or stuck)
inline Lane *Block::next_lane() {
    if (q_len) {
        Lane *l = &lanes[queue[q_head]];
        q_head = (q_head + 1) % n;
        q_len--;
        return l;
    }
    if (started == n) return nullptr;
    Lane *l = &lanes[started++];
    if (free_stacks.empty()) {
        l->stack = stack_alloc();
    } else {
        l->stack = free_stacks.back();
        free_stacks.pop_back();
        stack_reuse(l->stack);
    }
    context_init(&l->ctx, l->stack, lane_entry);
    return l;
}

inline void Block::make_runnable(Lane *l) {
    l->state = Lane::RUNNABLE;
    queue[(q_head + q_len++) % n] = l->id;
}

// `from` (a lane, or null: the scheduler) gives the CPU to the next lane, or back
// to the scheduler when none can run. A lane that ends gives its stack back only
// after the next lane took one, as it is still running on it.
inline Context *Block::pass_on(Lane *from, bool from_ends) {
    Lane *to = next_lane();
    if (from_ends) free_stacks.push_back(from->stack);
    cur_lane = to;
    if (!to) return &main;
    to->state = Lane::RUNNING;
    return &to->ctx;
}
inline void Block::switch_from(Lane *from, bool from_ends) {
    Context *to = pass_on(from, from_ends);
    context_switch(from ? &from->ctx : &main, to, from_ends);
}

inline void Block::run(const Grid &grid, uint3 idx) {
    EMU_BOOKKEEPING;
    g = &grid;
    block_idx = idx;
    n = grid.block.x * grid.block.y * grid.block.z;
    unsigned warps = (n + WARP_SIZE - 1) / WARP_SIZE;
    if (lanes.size() < n) lanes.resize(n);
    queue.assign(n, 0);
    warp_arrived.assign(warps, 0);
    warp_completions.assign(warps, 0);
    warp_ring.resize((size_t)warps * WARP_SIZE);
    started = done = q_head = q_len = at_barrier = 0;
    for (unsigned i = 0; i < n; i++) {
        Lane &l = lanes[i];
        l.id = i;
        l.state = Lane::UNSTARTED;
        l.thread_idx = uint3{i % grid.block.x, i / grid.block.x % grid.block.y, i / (grid.block.x * grid.block.y)};
#ifdef EMU_TSAN
        l.ctx.tsan_fiber = __tsan_create_fiber(0); // fresh: no history shared with another block's threads
        char name[256];                            // what TSan's reports call it
        snprintf(name, sizeof name, "%s block (%u,%u,%u) thread (%u,%u,%u)", grid.kernel->name.c_str(), idx.x, idx.y,
                 idx.z, l.thread_idx.x, l.thread_idx.y, l.thread_idx.z);
        __tsan_set_fiber_name(l.ctx.tsan_fiber, name);
#endif
    }
    // dynamic shared memory: exactly the launch's bytes, NaN until written
    if (posix_memalign(&dynamic, 128, grid.smem ? grid.smem : 1) != 0) fail("out of memory for shared memory");
    memset(dynamic, 0xFF, grid.smem);
    static_bytes = 0;
#ifdef EMU_TSAN
    main.tsan_fiber = __tsan_get_current_fiber();
#endif
    if (!main.stack_bottom) context_of_this_thread(&main);
    cur_block = this;
    switch_from(nullptr, false); // runs the block's threads until none can go on
    cur_block = nullptr;
    if (done != n) report_stuck();
    free(dynamic);
    for (StaticVar &v : static_vars) free(v.ptr);
    static_vars.clear();
    {
        std::lock_guard<std::mutex> lock(kernels_mutex);
        grid.kernel->static_smem = std::max(grid.kernel->static_smem, static_bytes);
    }
#ifdef EMU_TSAN
    // A race report shows the stack of the earlier access only while its fiber
    // exists: the last TSAN_KEPT_FIBERS threads' fibers are kept (a destroyed
    // fiber's history is gone; TSan allows ~8000 at once).
    for (unsigned i = 0; i < n; i++) kept_fibers.push_back(lanes[i].ctx.tsan_fiber);
    for (; kept_fibers.size() > TSAN_KEPT_FIBERS; kept_fibers.pop_front()) __tsan_destroy_fiber(kept_fibers.front());
#endif
}

// No thread of the block can go on: say who waits where.
[[noreturn]] inline void Block::report_stuck() {
    auto state_of = [&](const Lane &l) {
        char s[300];
        if (l.state == Lane::DONE) snprintf(s, sizeof s, "exited");
        else if (l.state == Lane::AT_BARRIER) snprintf(s, sizeof s, "at __syncthreads (%s:%d)", l.op.file, l.op.line);
        else snprintf(s, sizeof s, "at %s with mask 0x%08x (%s:%d)", l.op.name, l.op.mask, l.op.file, l.op.line);
        return std::string(s);
    };
    std::string list;
    bool all_at_barriers = true;
    unsigned groups = 0;
    for (unsigned i = 0; i < n;) { // runs of threads in the same state, the first 16 of them
        std::string s = state_of(lanes[i]);
        unsigned j = i + 1;
        while (j < n && state_of(lanes[j]) == s) j++;
        char range[64];
        snprintf(range, sizeof range, j - i > 1 ? "\n  threads %u-%u: " : "\n  thread %u: ", i, j - 1);
        if (++groups <= 16) list += range + s;
        for (unsigned k = i; k < j; k++) all_at_barriers &= lanes[k].state != Lane::AT_WARP;
        i = j;
    }
    if (groups > 16) list += "\n  ... (" + std::to_string(groups - 16) + " more runs of threads)";
    const char *what = !all_at_barriers ? "warp collectives that cannot complete (lanes of one warp at different "
                                          "collectives, with different masks, or a lane of the mask exited)"
                     : !barrier_same ? "threads of the block wait at different __syncthreads"
                                     : "part of the block exited while the rest waits at __syncthreads";
    fail("%s: %s:%s", where().c_str(), what, list.c_str());
}

inline Lane *this_lane(const char *what) {
    if (!cur_lane) fail_outside_kernel(what);
    return cur_lane;
}

// ----------------------------------------------------------------------------
// the built-in variables

inline uint3 thread_idx() { return this_lane("threadIdx")->thread_idx; }
inline uint3 block_idx() {
    this_lane("blockIdx");
    return cur_block->block_idx;
}
inline dim3 block_dim() {
    this_lane("blockDim");
    return cur_block->g->block;
}
inline dim3 grid_dim() {
    this_lane("gridDim");
    return cur_block->g->grid;
}

// ----------------------------------------------------------------------------
// __syncthreads

inline void barrier(const char *file, int line) {
    EMU_BOOKKEEPING;
    Lane *l = this_lane("__syncthreads");
    Block *b = cur_block;
    sync_release(&b->barrier_arrive_token);
    l->state = Lane::AT_BARRIER;
    l->op.file = file;
    l->op.line = line;
    if (b->at_barrier++ == 0) {
        b->barrier_file = file;
        b->barrier_line = line;
        b->barrier_same = true;
    } else if (line != b->barrier_line || (file != b->barrier_file && strcmp(file, b->barrier_file) != 0)) {
        b->barrier_same = false;
    }
    if (b->at_barrier == b->n && b->barrier_same) { // the last one: release them all, go on first
        sync_acquire(&b->barrier_arrive_token);
        sync_release(&b->barrier_done_token);
        b->at_barrier = 0;
        for (unsigned i = 0; i < b->n; i++)
            if (i != l->id) b->make_runnable(&b->lanes[i]);
        l->state = Lane::RUNNING;
    } else {
        b->switch_from(l, false);
    }
    sync_acquire(&b->barrier_done_token);
}

// ----------------------------------------------------------------------------
// warp collectives

inline bool same_collective(const Collective &a, const Collective &b) {
    return (a.name == b.name || strcmp(a.name, b.name) == 0) && a.line == b.line && a.mask == b.mask && a.ptr == b.ptr && a.ldm == b.ldm &&
           a.layout == b.layout && a.width == b.width && (a.file == b.file || strcmp(a.file, b.file) == 0);
}

// The calling lane (its op filled in) waits until every lane of op.mask waits at
// the same collective; the last to arrive runs op.complete for them all.
inline void warp_collective() {
    Lane *l = cur_lane;
    Block *b = cur_block;
    unsigned warp = l->id / WARP_SIZE, lane = l->id % WARP_SIZE, mask = l->op.mask;
    unsigned lanes_in_warp = std::min<unsigned>(WARP_SIZE, b->n - warp * WARP_SIZE);
    if (!(mask >> lane & 1))
        fail("%s: thread %u (lane %u of warp %u) calls %s at %s:%d with mask 0x%08x, which leaves out its own lane",
             b->where().c_str(), l->id, lane, warp, l->op.name, l->op.file, l->op.line, mask);
    if (lanes_in_warp < WARP_SIZE && mask >> lanes_in_warp)
        fail("%s: %s at %s:%d with mask 0x%08x names lanes that warp %u lacks (it has %u)", b->where().c_str(),
             l->op.name, l->op.file, l->op.line, mask, warp, lanes_in_warp);
    sync_release(&l->token);
    l->state = Lane::AT_WARP;
    unsigned &arrived = b->warp_arrived[warp];
    arrived |= 1u << lane;
    Lane *w = &b->lanes[warp * WARP_SIZE];
    bool complete = (arrived & mask) == mask;
    for (unsigned j = 0; complete && j < WARP_SIZE; j++)
        complete = !(mask >> j & 1) || same_collective(w[j].op, l->op);
    if (!complete) {
        b->switch_from(l, false);
    } else {
        for (unsigned j = 0; j < WARP_SIZE; j++)
            if (mask >> j & 1) sync_acquire(&w[j].token);
        l->op.complete(w, mask);
        // 32 tokens a warp: a lane takes its token before it can arrive at another
        // collective, so a token is reused only after it was taken (full masks)
        unsigned slot = b->warp_completions[warp]++ % WARP_SIZE;
        sync_release(&b->warp_ring[warp * WARP_SIZE + slot]);
        arrived &= ~mask;
        for (unsigned j = 0; j < WARP_SIZE; j++) {
            if (!(mask >> j & 1)) continue;
            w[j].ring_slot = slot;
            if (j != lane) b->make_runnable(&w[j]);
        }
        l->state = Lane::RUNNING;
    }
    sync_acquire(&b->warp_ring[warp * WARP_SIZE + l->ring_slot]);
}

// the calling lane's op, ready to fill in
inline Collective &collective(const char *name, unsigned mask, const char *file, int line,
                              void (*complete)(Lane *, unsigned)) {
    Lane *l = this_lane(name);
    Collective &op = l->op;
    op.name = name;
    op.file = file;
    op.line = line;
    op.mask = mask;
    op.complete = complete;
    op.ptr = nullptr;
    op.ldm = 0;
    op.layout = op.width = op.kind = 0;
    return op;
}

enum ShflKind { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR, VOTE_BALLOT, VOTE_ANY, VOTE_ALL, SYNCWARP };

// the lane whose value lane j reads; itself where CUDA returns the caller's own value
inline unsigned shfl_source(int kind, unsigned j, int arg, int width) {
    unsigned first = j / width * width, last = first + width - 1; // j's segment of `width` lanes
    switch (kind) {
    case SHFL_IDX: return first + ((unsigned)arg & (width - 1));
    case SHFL_UP: return j - first >= (unsigned)arg ? j - arg : j;
    case SHFL_DOWN: return j + arg <= last ? j + arg : j;
    default: { // SHFL_XOR: lanes of earlier segments may be read, later ones not
        unsigned src = j ^ (unsigned)arg;
        return src <= last ? src : j;
    }
    }
}

inline void shfl_complete(Lane *w, unsigned mask) {
    for (unsigned j = 0; j < WARP_SIZE; j++) {
        if (!(mask >> j & 1)) continue;
        Collective &op = w[j].op;
        unsigned src = shfl_source(op.kind, j, op.arg, op.width);
        // reading a lane outside the mask is undefined; here it gives NaN
        op.result = src < WARP_SIZE && (mask >> src & 1) ? w[src].op.value : ~0ull;
    }
}

inline void vote_complete(Lane *w, unsigned mask) {
    unsigned ballot = 0;
    for (unsigned j = 0; j < WARP_SIZE; j++)
        if ((mask >> j & 1) && w[j].op.arg) ballot |= 1u << j;
    for (unsigned j = 0; j < WARP_SIZE; j++) {
        if (!(mask >> j & 1)) continue;
        Collective &op = w[j].op;
        op.result = op.kind == VOTE_BALLOT ? ballot : op.kind == VOTE_ANY ? ballot != 0 : ballot == mask;
    }
}

inline uint64_t shfl_bits(const char *name, int kind, unsigned mask, uint64_t bits, int arg, int width,
                                      const char *file, int line) {
    EMU_BOOKKEEPING;
    if (width < 1 || width > WARP_SIZE || (width & (width - 1)))
        fail("%s at %s:%d: width %d is not a power of 2 from 1 to 32", name, file, line, width);
    Collective &op = collective(name, mask, file, line, shfl_complete);
    op.kind = kind;
    op.width = width;
    op.arg = arg;
    op.value = bits;
    warp_collective();
    return cur_lane->op.result;
}
template <typename T> T shfl(const char *name, int kind, unsigned mask, T var, int arg, int width, const char *file,
                             int line) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "__shfl_*_sync moves up to 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof(T));
    bits = shfl_bits(name, kind, mask, bits, arg, width, file, line);
    T r;
    memcpy(&r, &bits, sizeof(T));
    return r;
}

inline unsigned vote(const char *name, int kind, unsigned mask, int predicate, const char *file, int line) {
    EMU_BOOKKEEPING;
    Collective &op = collective(name, mask, file, line, vote_complete);
    op.kind = kind;
    op.arg = predicate != 0;
    warp_collective();
    return (unsigned)cur_lane->op.result;
}

// ----------------------------------------------------------------------------
// shared memory (rewrite.pl turns the declarations into these calls)

// A static __shared__ variable of type T (an array type for arrays), one per block
// and declaration: `key` is a static variable of the declaring function, unique to
// the declaration (and to each instance of a template). The first thread of the
// block to reach the declaration allocates it.
inline void *Block::static_shared(const void *key, size_t bytes, size_t align) {
    EMU_BOOKKEEPING;
    for (StaticVar &v : static_vars)
        if (v.key == key) return v.ptr;
    static_bytes += bytes;
    if (static_bytes > DEFAULT_MAX_DYNAMIC_SMEM)
        fail("%s: %zu bytes of static __shared__ memory, more than the 48 KiB a kernel may declare",
             where().c_str(), static_bytes);
    if (static_bytes + g->smem > MAX_SMEM_PER_BLOCK_OPTIN)
        fail("%s: %zu bytes of static and %zu of dynamic shared memory, more than sm_90's %zu a block",
             where().c_str(), static_bytes, g->smem, MAX_SMEM_PER_BLOCK_OPTIN);
    void *p = nullptr;
    if (posix_memalign(&p, std::max(align, sizeof(void *)), bytes) != 0) fail("out of memory for shared memory");
    memset(p, 0xFF, bytes);
    static_vars.push_back(StaticVar{key, p, bytes});
    return p;
}
template <typename T> T &shared_variable(const void *key) {
    this_lane("__shared__");
    return *(T *)cur_block->static_shared(key, sizeof(T), alignof(T));
}
template <typename T> T *dynamic_shared() {
    this_lane("extern __shared__");
    return (T *)cur_block->dynamic;
}

// ----------------------------------------------------------------------------
// running a grid

inline unsigned env_unsigned(const char *name, unsigned dflt) {
    const char *s = getenv(name);
    return s && *s ? (unsigned)strtoul(s, nullptr, 10) : dflt;
}

// how grids run, from the environment (a test may change them between launches)
struct Settings {
    bool shuffle = getenv("EMU_SHUFFLE") && *getenv("EMU_SHUFFLE"); // EMU_SHUFFLE=<seed>: blocks in a shuffled order
    uint64_t seed = env_unsigned("EMU_SHUFFLE", 0);
    unsigned threads = std::max(1u, env_unsigned("EMU_THREADS", 1)); // OS threads that run blocks
};
inline Settings settings;

inline uint64_t mix64(uint64_t x) { // splitmix64's finalizer
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// EMU_THREADS > 1: OS threads that take blocks of a launch from a shared counter
struct BlockPool {
    std::mutex m;
    std::condition_variable wake, finished;
    const Grid *grid = nullptr;
    const std::vector<unsigned> *order = nullptr;
    std::atomic<size_t> next{0};
    unsigned generation = 0, busy = 0;

    void take_blocks(const Grid &g, const std::vector<unsigned> &ord) {
        for (size_t i; (i = next++) < ord.size();) {
            unsigned b = ord[i];
            this_os_thread_block().run(g, uint3{b % g.grid.x, b / g.grid.x % g.grid.y, b / (g.grid.x * g.grid.y)});
        }
    }
    explicit BlockPool(unsigned workers) {
        for (unsigned t = 0; t < workers; t++)
            std::thread([this] {
                unsigned seen = 0;
                for (;;) {
                    std::unique_lock<std::mutex> lock(m);
                    wake.wait(lock, [&] { return generation != seen; });
                    seen = generation;
                    const Grid *g = grid;
                    const std::vector<unsigned> *ord = order;
                    lock.unlock();
                    take_blocks(*g, *ord);
                    lock.lock();
                    if (--busy == 0) finished.notify_all();
                }
            }).detach();
    }
    void run(const Grid &g, const std::vector<unsigned> &ord, unsigned workers) {
        {
            std::lock_guard<std::mutex> lock(m);
            grid = &g;
            order = &ord;
            next = 0;
            busy = workers;
            generation++;
        }
        wake.notify_all();
        take_blocks(g, ord);
        std::unique_lock<std::mutex> lock(m);
        finished.wait(lock, [&] { return busy == 0; });
    }
};

inline void run_grid(Grid &g) {
    static std::atomic<uint64_t> launches{0};
    size_t n_blocks = (size_t)g.grid.x * g.grid.y * g.grid.z;
    std::vector<unsigned> order(n_blocks);
    for (size_t i = 0; i < n_blocks; i++) order[i] = (unsigned)i;
    if (settings.shuffle) { // Fisher-Yates, a different order every launch
        uint64_t state = mix64(settings.seed ^ mix64(launches++));
        for (size_t i = n_blocks; i > 1; i--) std::swap(order[i - 1], order[(state = mix64(state)) % i]);
    }
    sync_release(&g.start_token);
    unsigned threads = std::min<size_t>(settings.threads, n_blocks);
    if (threads <= 1) {
        for (unsigned b : order)
            this_os_thread_block().run(g, uint3{b % g.grid.x, b / g.grid.x % g.grid.y, b / (g.grid.x * g.grid.y)});
    } else {
        static std::mutex one_launch_at_a_time;
        std::lock_guard<std::mutex> lock(one_launch_at_a_time);
        static std::vector<BlockPool *> pools; // by size; they live as long as the program
        if (pools.size() < threads) pools.resize(threads);
        if (!pools[threads - 1]) pools[threads - 1] = new BlockPool(threads - 1);
        pools[threads - 1]->run(g, order, threads - 1);
    }
    sync_acquire(&g.end_token);
}

// ----------------------------------------------------------------------------
// launches

// Checks a launch as the device does; false (the error set, and a line printed
// that names the kernel and the limit) when it would fail.
inline bool launch_ok(const KernelInfo &k, const char *file, int line, dim3 grid, dim3 block, size_t smem) {
    char problem[256] = "";
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    size_t static_smem;
    {
        std::lock_guard<std::mutex> lock(kernels_mutex);
        static_smem = k.static_smem;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0)
        snprintf(problem, sizeof problem, "gridDim (%u, %u, %u) is empty", grid.x, grid.y, grid.z);
    else if (block.x == 0 || block.y == 0 || block.z == 0)
        snprintf(problem, sizeof problem, "blockDim (%u, %u, %u) is empty", block.x, block.y, block.z);
    else if (block.x > 1024 || block.y > 1024 || block.z > 64)
        snprintf(problem, sizeof problem, "blockDim (%u, %u, %u) exceeds the limits (1024, 1024, 64)", block.x, block.y,
                 block.z);
    else if (threads > (unsigned)MAX_THREADS_PER_BLOCK)
        snprintf(problem, sizeof problem, "blockDim (%u, %u, %u) has %llu threads, more than %d a block", block.x,
                 block.y, block.z, threads, MAX_THREADS_PER_BLOCK);
    else if (grid.x > MAX_GRID_X || grid.y > MAX_GRID_YZ || grid.z > MAX_GRID_YZ)
        snprintf(problem, sizeof problem, "gridDim (%u, %u, %u) exceeds the limits (%u, %u, %u)", grid.x, grid.y,
                 grid.z, MAX_GRID_X, MAX_GRID_YZ, MAX_GRID_YZ);
    else if (smem > k.max_dynamic_smem)
        snprintf(problem, sizeof problem,
                 "%zu bytes of dynamic shared memory, more than its limit of %zu (above 48 KiB it needs "
                 "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))",
                 smem, k.max_dynamic_smem);
    else if (smem + static_smem > MAX_SMEM_PER_BLOCK_OPTIN)
        snprintf(problem, sizeof problem,
                 "%zu bytes of dynamic and %zu of static shared memory, more than sm_90's %zu a block", smem,
                 static_smem, MAX_SMEM_PER_BLOCK_OPTIN);
    if (!*problem) return true;
    fprintf(stderr, "emu: launch of kernel %s at %s:%d fails: %s\n", k.name.c_str(), file, line, problem);
    set_last_error(cudaErrorInvalidConfiguration);
    return false;
}

// a kernel and the arguments of its launch: each thread calls f with its own
// copies, as from the parameter space
template <typename F, typename... A> struct BoundKernel {
    F f;
    std::tuple<A...> args;
    static void call(const void *self) {
        const BoundKernel *b = (const BoundKernel *)self;
        std::apply(b->f, b->args);
    }
};

// A checked launch: the arguments are kept by value until the grid runs, when
// its stream gets to it (emu::enqueue).
struct LaunchConfig {
    KernelInfo *info;
    const char *file;
    int line;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    bool ok;

    template <typename F, typename... A> void run(F f, A... args) const {
        if (!ok) return;
        auto bound = std::make_shared<BoundKernel<F, A...>>(BoundKernel<F, A...>{f, std::tuple<A...>(args...)});
        Grid g{info, file, line, grid, block, smem, BoundKernel<F, A...>::call, bound.get(), 0, 0};
        enqueue(stream, info->what.c_str(), [g, bound]() mutable { run_grid(g); });
    }
};
// a kernel named by a pointer: the arguments convert to its parameter types at the launch
template <typename... P> struct LaunchPointer : LaunchConfig {
    void (*kernel)(P...);
    void operator()(P... args) const { run(kernel, args...); }
};
// a kernel template whose arguments the launch deduces (as CUDA does, as for a
// call): the arguments are kept as given, and each thread's call converts them
template <typename Call> struct LaunchCall : LaunchConfig {
    Call call;
    template <typename... A> void operator()(A &&...args) const { run(call, std::decay_t<A>(args)...); }
};

template <typename T, typename... P> auto kernel_pointer(T, void (*kernel)(P...)) { return kernel; }
template <typename... P> LaunchPointer<P...> launch_pointer(void (*kernel)(P...), const LaunchConfig &c) {
    return LaunchPointer<P...>{c, kernel};
}

// What rewrite.pl makes of kernel<<<grid, block, smem, stream>>>(args):
//   emu::launch([=](auto t) -> decltype(emu::kernel_pointer(t, kernel)) { return emu::kernel_pointer(t, kernel); },
//               [=](const auto &...a) { kernel(a...); }, "kernel", __FILE__, __LINE__, grid, block, smem, stream)(args)
// The first lambda gives the kernel's pointer where `kernel` names one (a function,
// a template specialization, a variable): its symbol names it in reports and
// cudaFuncSetAttribute's limits apply. For a template whose arguments only the call
// deduces, it is not callable (the failed deduction is in its return type), and the
// second lambda, a call, is the kernel; reports name it by its source text.
template <typename Pointer, typename Call>
auto launch(Pointer pointer, Call call, const char *text, const char *file, int line, dim3 grid, dim3 block,
            size_t smem = 0, cudaStream_t stream = 0) {
    if constexpr (std::is_invocable<Pointer, int>::value) {
        auto kernel = pointer(0);
        KernelInfo &k = kernel_info((const void *)kernel, text);
        return launch_pointer(kernel, LaunchConfig{&k, file, line, grid, block, smem, stream,
                                                   launch_ok(k, file, line, grid, block, smem)});
    } else {
        KernelInfo &k = kernel_info(nullptr, text); // one per launch site
        return LaunchCall<Call>{{&k, file, line, grid, block, smem, stream, launch_ok(k, file, line, grid, block, smem)},
                                call};
    }
}

} // namespace emu

// ----------------------------------------------------------------------------
// CUDA's device functions

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())

inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::barrier(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::vote("__syncwarp", emu::SYNCWARP, mask, 0, file, line);
}
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, const char *file = __builtin_FILE(),
              int line = __builtin_LINE()) {
    return emu::shfl("__shfl_sync", emu::SHFL_IDX, mask, var, src_lane, width, file, line);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char *file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
    return emu::shfl("__shfl_up_sync", emu::SHFL_UP, mask, var, (int)delta, width, file, line);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char *file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
    return emu::shfl("__shfl_down_sync", emu::SHFL_DOWN, mask, var, (int)delta, width, file, line);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, const char *file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
    return emu::shfl("__shfl_xor_sync", emu::SHFL_XOR, mask, var, lane_mask, width, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    return emu::vote("__ballot_sync", emu::VOTE_BALLOT, mask, predicate, file, line);
}
inline int __any_sync(unsigned mask, int predicate, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return (int)emu::vote("__any_sync", emu::VOTE_ANY, mask, predicate, file, line);
}
inline int __all_sync(unsigned mask, int predicate, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return (int)emu::vote("__all_sync", emu::VOTE_ALL, mask, predicate, file, line);
}

// ----------------------------------------------------------------------------
// function attributes

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

// Only the dynamic shared memory limit is emulated; any other attribute refuses
// with its name rather than being ignored.
template <typename... P> cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
    emu::KernelInfo &k = emu::kernel_info((const void *)kernel, "(kernel)");
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
        fprintf(stderr, "emu: cudaFuncSetAttribute(%s, attribute %d): only cudaFuncAttributeMaxDynamicSharedMemorySize "
                        "is emulated\n", k.name.c_str(), (int)attr);
        emu::set_last_error(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    std::lock_guard<std::mutex> lock(emu::kernels_mutex);
    if (value < 0 || (size_t)value + k.static_smem > emu::MAX_SMEM_PER_BLOCK_OPTIN) {
        fprintf(stderr, "emu: cudaFuncSetAttribute(%s, cudaFuncAttributeMaxDynamicSharedMemorySize, %d): with its %zu "
                        "bytes of static shared memory, more than sm_90's %zu a block\n",
                k.name.c_str(), value, k.static_smem, emu::MAX_SMEM_PER_BLOCK_OPTIN);
        emu::set_last_error(cudaErrorInvalidValue);
        return cudaErrorInvalidValue;
    }
    k.max_dynamic_smem = (size_t)value;
    return cudaSuccess;
}
