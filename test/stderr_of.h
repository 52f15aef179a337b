// What a piece of a C++ test printed on stderr: the execution layer's tests check
// the wording of its messages (dev/emu/). A temporary file stands in for fd 2
// while f runs.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <unistd.h>

inline std::string stderr_of(const std::function<void()> &f) {
    char path[] = "/tmp/llama2tune_stderr_XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    fflush(stderr);
    dup2(fd, 2);
    f();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string out;
    char buf[512];
    ssize_t n;
    lseek(fd, 0, SEEK_SET);
    while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, (size_t)n);
    close(fd);
    unlink(path);
    return out;
}
