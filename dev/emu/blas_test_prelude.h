// dev/emu/blas_test_prelude.h: types.h's three host functions in a form that
// test/test_emu_blas.cu can watch, force-included (-include) in place of the
// execution layer's runtime, which that test does not need: emu::enqueue runs an
// operation at once, or holds it while emu_test::hold is set until the test runs
// it, and remembers the stream and the name of the last one; emu::fail throws,
// so that the test sees a check fire (the runtime's prints and aborts).
#pragma once
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>
#include "types.h"

namespace emu_test {
inline bool hold = false;
inline std::vector<std::function<void()>> held;
inline cudaStream_t last_stream = NULL;
inline std::string last_what;
inline void run_held() {
    for (auto &op : held) op();
    held.clear();
}
} // namespace emu_test

namespace emu {
inline void enqueue(cudaStream_t s, const char *what, std::function<void()> op) {
    emu_test::last_stream = s;
    emu_test::last_what = what;
    if (emu_test::hold) emu_test::held.push_back(op);
    else op();
}
inline void set_last_error(cudaError_t) {}
[[noreturn]] inline void fail(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "emu: %s\n", msg);
    throw std::runtime_error(msg);
}
} // namespace emu
