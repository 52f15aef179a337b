// dev/emu/nccl.h, the emulated build's NCCL, on its own: the error strings
// are NCCL's (as libnccl 2.28's ncclGetErrorString returns them); a
// communicator of one rank works and one of several is refused, pointing to
// --collectives host; each collective is a copy enqueued on the caller's
// stream (not done at the call: NCCL's kernels run in stream order), of
// exactly count elements of the type's size; an unknown type, reduction or
// root is refused by its value. The stream runtime is a stand-in here that
// holds what is enqueued until the test runs it, so nothing of dev/emu's
// runtime is needed (or tested).
#include "nccl.h"
#include "test_common.h"
#include "stderr_of.h"
#include <functional>
#include <string>
#include <vector>
#include <unistd.h>

// the stand-in for runtime.h's emu::enqueue: the queue, in order
struct Queued { cudaStream_t stream; std::string what; std::function<void()> op; };
static std::vector<Queued> queued;
void emu::enqueue(cudaStream_t s, const char *what, std::function<void()> op) { queued.push_back({s, what, op}); }
static void run_queued() {
    for (auto &q : queued) q.op();
    queued.clear();
}

int main() {
    const char *want[] = {"no error",
                          "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
                          "unhandled system error (run with NCCL_DEBUG=INFO for details)",
                          "internal error - please report this issue to the NCCL developers",
                          "invalid argument (run with NCCL_DEBUG=WARN for details)",
                          "invalid usage (run with NCCL_DEBUG=WARN for details)",
                          "remote process exited or there was a network error",
                          "NCCL operation in progress",
                          "unknown result code"};
    int bad = 0;
    for (int r = 0; r <= ncclNumResults; r++) bad += strcmp(ncclGetErrorString((ncclResult_t)r), want[r]) != 0;
    CHECK(bad == 0, "emu nccl: ncclGetErrorString gives NCCL's strings", "%d of %d differ", bad, ncclNumResults + 1);

    ncclUniqueId id;
    ncclComm_t comm = NULL, two = NULL;
    ncclResult_t r2 = ncclSuccess;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess && ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess && comm,
          "emu nccl: a communicator of one rank", "comm %p", (void *)comm);
    std::string msg = stderr_of([&] { r2 = ncclCommInitRank(&two, 2, id, 1); });
    CHECK(r2 == ncclInvalidUsage && !two && msg.find("--collectives host") != std::string::npos,
          "emu nccl: a communicator of two ranks is refused, pointing to --collectives host", "result %d, message '%s'", r2,
          msg.c_str());

    // each collective: enqueued on the stream, nothing moved at the call; then exactly its bytes
    cudaStream_t stream = (cudaStream_t)0x5; // any handle: the stand-in only records it
    float send[6] = {1, 2, 3, 4, 5, 6}, recv[6];
    struct { const char *name; size_t count; std::function<ncclResult_t()> call; } calls[] = {
        {"ncclAllGather", 4, [&] { return ncclAllGather(send, recv, 4, ncclFloat, comm, stream); }},
        {"ncclReduceScatter", 3, [&] { return ncclReduceScatter(send, recv, 3, ncclFloat, ncclSum, comm, stream); }},
        {"ncclAllReduce", 5, [&] { return ncclAllReduce(send, recv, 5, ncclFloat, ncclAvg, comm, stream); }},
        {"ncclBroadcast", 6, [&] { return ncclBroadcast(send, recv, 6, ncclFloat, 0, comm, stream); }},
    };
    for (auto &c : calls) {
        for (float &x : recv) x = -1;
        ncclResult_t r = c.call();
        int untouched = 1, copied = 1;
        for (float x : recv) untouched &= x == -1;
        int one = queued.size() == 1 && queued[0].stream == stream && queued[0].what == c.name;
        run_queued();
        for (size_t i = 0; i < 6; i++) copied &= recv[i] == (i < c.count ? send[i] : -1);
        CHECK(r == ncclSuccess && untouched && one && copied,
              (std::string("emu nccl: ") + c.name + " of one rank: a copy of its elements, enqueued on the stream").c_str(),
              "result %d, untouched at the call %d, one op on the stream %d, copied exactly %d", r, untouched, one, copied);
    }
    // bf16: 2 bytes an element, moved as they are
    uint16_t hs[4] = {0x3f80, 0xbf80, 0x7fc1, 0x0001}, hr[4] = {0, 0, 0, 0xffff};
    ncclResult_t r = ncclAllGather(hs, hr, 3, ncclBfloat16, comm, stream);
    run_queued();
    CHECK(r == ncclSuccess && hr[0] == 0x3f80 && hr[1] == 0xbf80 && hr[2] == 0x7fc1 && hr[3] == 0xffff,
          "emu nccl: a bf16 all-gather moves 2 bytes an element, bit for bit", "result %d, %04x %04x %04x %04x", r, hr[0], hr[1],
          hr[2], hr[3]);

    // refused, by their values, and nothing enqueued
    struct { const char *what, *says; std::function<ncclResult_t()> call; } refused[] = {
        {"a data type NCCL does not define", "data type 12", [&] { return ncclAllReduce(send, recv, 1, (ncclDataType_t)12, ncclSum, comm, stream); }},
        {"a reduction NCCL does not define", "reduction 5", [&] { return ncclAllReduce(send, recv, 1, ncclFloat, (ncclRedOp_t)5, comm, stream); }},
        {"a root other than rank 0", "root 1", [&] { return ncclBroadcast(send, recv, 1, ncclFloat, 1, comm, stream); }},
    };
    for (auto &c : refused) {
        ncclResult_t got = ncclSuccess;
        std::string said = stderr_of([&] { got = c.call(); });
        int none = queued.empty();
        queued.clear();
        CHECK(got == ncclInvalidArgument && none && said.find(c.says) != std::string::npos,
              (std::string("emu nccl: ") + c.what + " is refused, naming it").c_str(), "result %d, enqueued %d, message '%s'",
              got, !none, said.c_str());
    }
    ncclCommDestroy(comm);
    return test_summary();
}
