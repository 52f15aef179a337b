// dev/emu/nccl.h: NCCL for the emulated build, what code that includes <nccl.h>
// calls (fsdp.h under -DFSDP_NCCL, dev/cuda/fsdp_nccl.cu), for a communicator
// of one rank.
//
// One rank. NCCL's collectives over one rank are copies (the sum, product,
// maximum, minimum or average of one value is that value), and this runs them
// as NCCL does: enqueued on the caller's stream (emu::enqueue), so they take
// their place in stream order and the layer's checks see them. A communicator
// of several ranks is refused (ncclInvalidUsage, with a message saying what to
// do): several emulated ranks run their device collectives with --collectives
// host, fsdp.h's staged backend, which moves the buffers through host memory
// and the host side's MPI or TCP collectives. That is the path ranks sharing a
// real GPU take too, so it is checked here as it runs there; NCCL's own
// algorithms are not something an emulation could show anyway.
//
// The types, values and error strings are NCCL 2.x's (nccl.h, ncclGetErrorString).
// A data type or reduction NCCL does not define is refused, naming the call
// and the value (ncclInvalidArgument).
#pragma once
#include "types.h"
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0, ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2, ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

struct ncclComm { int nranks, rank; };
typedef struct ncclComm *ncclComm_t;

inline const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

namespace emu {
namespace nccl {

// prints "emu: NCCL: <call>: <problem>" (real NCCL says why under NCCL_DEBUG=WARN;
// here always) and returns err
inline ncclResult_t refuse(ncclResult_t err, const char *call, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
inline ncclResult_t refuse(ncclResult_t err, const char *call, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "emu: NCCL: %s: ", call);
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    return err;
}

// bytes of one element of type t; 0 if NCCL defines no such type
inline size_t type_size(ncclDataType_t t) {
    static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return (int)t >= 0 && t < ncclNumTypes ? sizes[t] : 0;
}

// Checks a collective's arguments as NCCL does and enqueues the copy of bytes
// from send to recv on stream (in place, send == recv: nothing to move).
inline ncclResult_t copy(const char *call, const void *send, void *recv, size_t count, ncclDataType_t type,
                         ncclComm_t comm, cudaStream_t stream) {
    size_t es = type_size(type);
    if (!es) return refuse(ncclInvalidArgument, call, "data type %d is not one of NCCL's (0 .. %d)", (int)type, ncclNumTypes - 1);
    if (!comm) return refuse(ncclInvalidArgument, call, "the communicator is NULL");
    if (count && (!send || !recv)) return refuse(ncclInvalidArgument, call, "a NULL buffer for %zu elements", count);
    size_t bytes = count * es;
    if (bytes && send != recv) enqueue(stream, call, [=] { std::memmove(recv, send, bytes); });
    return ncclSuccess;
}

inline ncclResult_t check_op(const char *call, ncclRedOp_t op) {
    if ((int)op >= 0 && op < ncclNumOps) return ncclSuccess;
    return refuse(ncclInvalidArgument, call, "reduction %d is not one of ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg "
                  "(the emulated NCCL has no ncclRedOpCreatePreMulSum)", (int)op);
}

} // namespace nccl
} // namespace emu

inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return emu::nccl::refuse(ncclInvalidArgument, "ncclGetUniqueId", "id is NULL");
    std::memset(id, 0, sizeof *id);
    std::memcpy(id->internal, "emu nccl", 8); // one rank meets no other: any id will do
    return ncclSuccess;
}

inline ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    if (!comm) return emu::nccl::refuse(ncclInvalidArgument, "ncclCommInitRank", "comm is NULL");
    if (nranks > 1)
        return emu::nccl::refuse(ncclInvalidUsage, "ncclCommInitRank", "a communicator of %d ranks: the emulated build runs "
                                 "NCCL for one rank only; run several ranks with --collectives host (device buffers "
                                 "through host memory and MPI or TCP, fsdp.h's staged backend)", nranks);
    if (nranks < 1 || rank != 0)
        return emu::nccl::refuse(ncclInvalidArgument, "ncclCommInitRank", "rank %d of %d ranks", rank, nranks);
    *comm = new ncclComm{1, 0};
    return ncclSuccess;
}

// the copies enqueued so far capture no part of the communicator: it can go at once
inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    delete comm;
    return ncclSuccess;
}
inline ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

// one rank: recvbuff (1 x sendcount) = sendbuff
inline ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream) {
    return emu::nccl::copy("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

// one rank: recvbuff (recvcount) = its own block of sendbuff, the first
inline ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = emu::nccl::check_op("ncclReduceScatter", op);
    return r != ncclSuccess ? r : emu::nccl::copy("ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, comm, stream);
}

inline ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = emu::nccl::check_op("ncclAllReduce", op);
    return r != ncclSuccess ? r : emu::nccl::copy("ncclAllReduce", sendbuff, recvbuff, count, datatype, comm, stream);
}

inline ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
    if (root != 0) return emu::nccl::refuse(ncclInvalidArgument, "ncclBroadcast", "root %d of a communicator of 1 rank", root);
    return emu::nccl::copy("ncclBroadcast", sendbuff, recvbuff, count, datatype, comm, stream);
}
