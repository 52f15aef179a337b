// dev/emu/fiber.h: execution contexts for the emulated GPU threads (device.h runs
// every thread of a block in one of these), and what the sanitizers need to know
// about them.
//
// A context is a stack and a saved stack pointer. On x86-64 a switch is 13
// instructions (push the callee-saved registers, swap stack pointers, pop), a
// few nanoseconds; elsewhere (or with -DEMU_UCONTEXT) it is swapcontext, which
// also saves the signal mask with a system call and costs ~50x more. The
// floating-point control words (MXCSR, x87) are not switched: kernels never
// change rounding modes.
//
// Sanitizers: AddressSanitizer must be told which stack is live
// (__sanitizer_start/finish_switch_fiber), or it reports the switch itself as a
// stack overflow; ThreadSanitizer keeps a separate history per fiber
// (__tsan_switch_to_fiber), and device.h adds the happens-before edges of
// barriers and warp collectives explicitly (no_sync switches, so that running
// the threads one after another does not itself order them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <pthread.h>
#include <sys/mman.h>

#ifndef __has_feature // GCC says __SANITIZE_*__, clang __has_feature(*_sanitizer)
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#define EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
#define EMU_TSAN 1
#include <sanitizer/tsan_interface.h>
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace emu {
// The scheduler's bookkeeping (lanes, queues, shared-memory tables, and the
// std::vector and malloc calls that touch them) is written by every fiber with no
// happens-before between them, which is the point of no_sync switches: under
// ThreadSanitizer a function that writes it starts with EMU_BOOKKEEPING, so that
// TSan ignores its memory accesses (not its happens-before edges) until it returns,
// and EMU_CHECKED turns checking back on for the kernel's own accesses made there
// (a wmma load or store). Shared memory is allocated and freed there too: TSan
// starts such memory with no history. Elsewhere both macros are nothing.
#ifdef EMU_TSAN
struct IgnoreAccesses {
    IgnoreAccesses() { __tsan_ignore_thread_begin(); }
    ~IgnoreAccesses() { __tsan_ignore_thread_end(); }
};
struct CheckAccesses {
    CheckAccesses() { __tsan_ignore_thread_end(); }
    ~CheckAccesses() { __tsan_ignore_thread_begin(); }
};
#define EMU_BOOKKEEPING ::emu::IgnoreAccesses emu_ignore_accesses
#define EMU_CHECKED ::emu::CheckAccesses emu_check_accesses
#else
#define EMU_BOOKKEEPING
#define EMU_CHECKED
#endif
} // namespace emu

#if !defined(__x86_64__) && !defined(EMU_UCONTEXT)
#define EMU_UCONTEXT 1
#endif
#ifdef EMU_UCONTEXT
#include <ucontext.h>
#endif

namespace emu {

// Kernel threads keep fragments and tiles in local arrays (attention's tensor-core
// kernels hold ~24 KiB), and ASan pads every frame: 256 KiB a stack, of which only
// the touched pages are ever backed by memory; 64 KiB under TSan, which pays for
// every byte when a stack is reused (below). A guard page below catches overflow.
#ifdef EMU_TSAN
constexpr size_t STACK_BYTES = 64 * 1024;
#else
constexpr size_t STACK_BYTES = 256 * 1024;
#endif
constexpr size_t GUARD_BYTES = 4096;

struct Stack {
    char *base = nullptr; // lowest usable address (the guard page is below it)
    size_t size = 0;
};

inline Stack stack_alloc() {
    void *p = mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED || mprotect(p, GUARD_BYTES, PROT_NONE) != 0) {
        fprintf(stderr, "emu: cannot map a %zu KiB stack for an emulated GPU thread\n", STACK_BYTES / 1024);
        abort();
    }
    return Stack{(char *)p + GUARD_BYTES, STACK_BYTES};
}

// A stack that a finished thread used is clean for ASan (every frame returned or,
// for the few outermost ones of the scheduler, holds no poisoned locals), but
// ThreadSanitizer would take the next thread's accesses for races with the old
// one's: under TSan the pages are mapped anew, which makes it forget them
// (its AnnotateNewMemory does not, in GCC 12's runtime).
inline void stack_reuse(const Stack &s) {
#ifdef EMU_TSAN
    if (munmap(s.base, s.size) != 0 || mmap(s.base, s.size, PROT_READ | PROT_WRITE,
                                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) != s.base) {
        fprintf(stderr, "emu: cannot map a stack for an emulated GPU thread anew\n");
        abort();
    }
#else
    (void)s;
#endif
}

struct Context {
#ifdef EMU_UCONTEXT
    ucontext_t uc;
#else
    void *sp = nullptr; // saved stack pointer; the callee-saved registers are on that stack
#endif
    const void *stack_bottom = nullptr; // for ASan: the stack this context runs on
    size_t stack_size = 0;
    void *asan_fake_stack = nullptr;
    void *tsan_fiber = nullptr;
};

#ifndef EMU_UCONTEXT
// emu_stack_switch(&from_sp, to_sp): pushes rbp, rbx, r12-r15, stores rsp in
// from_sp, loads to_sp, pops the six registers saved there and returns into that
// context. A COMDAT section, so every translation unit may carry it.
extern "C" void emu_stack_switch(void **from_sp, void *to_sp);
asm(R"(
    .pushsection .text.emu_stack_switch,"axG",@progbits,emu_stack_switch,comdat
    .weak emu_stack_switch
    .type emu_stack_switch, @function
emu_stack_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_stack_switch, .-emu_stack_switch
    .popsection
)");
#endif

// Prepares c to start in entry() (which must never return) on stack s.
inline void context_init(Context *c, const Stack &s, void (*entry)()) {
    c->stack_bottom = s.base;
    c->stack_size = s.size;
    c->asan_fake_stack = nullptr;
#ifdef EMU_UCONTEXT
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = s.base;
    c->uc.uc_stack.ss_size = s.size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
#else
    // what emu_stack_switch pops: r15 r14 r13 r12 rbx rbp (0: the end of the frame
    // chain), then entry as the return address; above it a null return address for
    // entry, which thus starts with rsp = 8 mod 16, as after a call
    uintptr_t top = ((uintptr_t)s.base + s.size) & ~(uintptr_t)15;
    void **sp = (void **)top - 8;
    for (int i = 0; i < 6; i++) sp[i] = nullptr;
    sp[6] = (void *)entry;
    sp[7] = nullptr;
    c->sp = sp;
#endif
}

// Runs `to` until it switches back. `from_ends`: from never runs again (ASan frees
// its fake stack).
inline void context_switch(Context *from, Context *to, bool from_ends) {
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(from_ends ? nullptr : &from->asan_fake_stack, to->stack_bottom, to->stack_size);
#else
    (void)from_ends;
#endif
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(to->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef EMU_UCONTEXT
    swapcontext(&from->uc, &to->uc);
#else
    emu_stack_switch(&from->sp, to->sp);
#endif
    // back in `from`, switched to by some context
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(from->asan_fake_stack, nullptr, nullptr);
#endif
}

// The first thing a new context does.
inline void context_started() {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
}

// c becomes the calling OS thread's own context (its stack, for ASan).
inline void context_of_this_thread(Context *c) {
    pthread_attr_t attr;
    void *bottom = nullptr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        pthread_attr_getstack(&attr, &bottom, &size);
        pthread_attr_destroy(&attr);
    }
    c->stack_bottom = bottom;
    c->stack_size = size;
}

} // namespace emu
