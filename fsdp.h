// fsdp.h: sharded parameters, the collectives that move them, rank-local
// loading and sharded checkpoints (docs/sharding.md). C99 + POSIX, and C++ for
// the CUDA trainer. Processes become ranks in one of two ways: an MPI launcher
// (mpirun, srun; a build with -DUSE_MPI, mpicc), or the environment a launcher
// such as torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: the TCP
// backend, in every build, tcp.h). -DFSDP_DEVICE (a CUDA program) adds the
// staged backend for device buffers (through host memory and the host side's
// collectives); -DFSDP_NCCL (nvcc, -lnccl; implies FSDP_DEVICE) adds NCCL's
// for them too. A process started by neither is a world of one,
// where every collective is a copy, and never calls MPI: it runs where MPI is
// not set up.
//
// Units. A Llama model is cut into units: the embedding, one per decoder layer,
// and the head (the final norm and lm_head; with tied embeddings only the norm,
// and the output projection uses the embedding unit again). A unit's tensors
// lie one after another in a flat buffer, in a fixed order. With n shards, the
// rank of index r owns elements [r*S, (r+1)*S) of a unit, S = ceil(numel / n):
// the last shards are zero-padded, so any n works. A rank's shards of all units
// lie one after another in one flat buffer of units.shard_numel floats (unit u
// at units[u].shard_offset), which is what the optimizer, the gradient norm
// and the checkpoints work on. A frozen unit may instead be packed: kept as a run
// of bytes its model lays out (QLoRA's 4-bit layers), sharded the same way into a
// rank's byte shard buffer and gathered as bytes (fsdp_gather_packed).
//
// Collectives (FsdpComm): all-gather, reduce-scatter, all-reduce, broadcast,
// barrier, "any" (do all ranks agree nothing failed) and abort, with one
// backend per communicator: a single process, MPI or TCP (host buffers: the
// CPU twin, and the host side of every backend), or for device buffers NCCL
// or staged, each enqueued on the communicator's stream. Staged (the CUDA
// trainer's --collectives host: ranks that share a GPU, a build without NCCL,
// the emulated build) copies the device buffer into pinned host memory on the
// stream, waits for the stream, runs the host side's collective there and
// copies the result back on the stream: the same sums as MPI and TCP, in rank
// order, with the stream ordering NCCL's has. Sums are in fp32 (or fp64 where
// asked). Order, MPI and TCP backends: every element is summed in rank order,
// ((x_0 + x_1) + x_2) + ..., whatever algorithm MPI would pick, so a result is
// the same on every rank, in every run and with either backend; it differs from
// a single process only by where fp32 rounding falls. NCCL's order is its own
// (ring or tree): deterministic for a fixed NCCL version, topology and
// NCCL_ALGO, and the same on every rank. Which of the two a run uses:
// fsdp_device_backend; the CUDA trainer's device communicators, one a group: FsdpDeviceComms.
//
// Strategies are data (fsdp_strategies): which ranks share one copy of the
// parameters (the shard group, size G) and whether a unit gathered for its
// forward is freed until its backward. Every strategy is the same two steps:
// gather a unit over the shard group; reduce-scatter its gradients over the
// shard group, then all-reduce the shard over the replica group (the ranks with
// the same shard index in the other groups, size W / G). FULL_SHARD and
// SHARD_GRAD_OP: G = W; NO_SHARD: G = 1 (DDP: the "gather" is the shard
// itself); HYBRID_SHARD: G = --shard_group, or the ranks of one node.
//
// Faults: a library function that fails prints what failed (naming the file)
// and returns -1 without entering another collective; the caller then either
// agrees with every rank on the failure (fsdp_any) or calls fsdp_abort, which
// ends every rank (MPI_Abort; over TCP the ranks waiting on it see its
// connections close), so no rank waits forever in a collective. MPI's own
// errors are fatal by MPI's default error handler (it prints and aborts).
//
// In a trainer (u: the units; f: the Fsdp; p, g, m, v: the rank's flat shard
// buffers of parameters, gradients and AdamW moments, u.shard_numel each; buf,
// gbuf: room for one unit whole, shard.size * unit.shard floats). trainer.h,
// model.h and train_llama2.c (the CPU backend) do this:
//   load      fsdp_check_model, allocate p, fsdp_load_model(&u, &sm, f.shard.rank, p)
//   forward   per unit: w = fsdp_gather(&f, unit, p, buf), run it; keep w until the
//             unit's backward unless info->reshard_after_forward (then gather again)
//   backward  per unit, in reverse: its gradient into gbuf (zeroed, padding too),
//             then fsdp_reduce_grads(&f, unit, g, gbuf). Tied embeddings: the
//             embedding unit serves the output projection too; its gbuf collects
//             both uses and is reduced after the embedding's backward
//   optimizer AdamW on p, g, m, v as they are (each rank its own shard); the
//             gradient norm's sum of squares: fsdp_all_reduce over f.shard (replica
//             groups hold the same shards)
//   LoRA      base units frozen (gathered as above, no gradients); the adapters
//             whole on every rank, their gradients fsdp_all_reduce over f.world
//   loss      the label count of the whole global step as the gradients' 1/N (the
//             dataloader knows every rank's rows: dataloader_global_labels)
//   data      dataloader_init(&dl, &ds, shuffle, seed, fsdp_data_rank(&f), fsdp_data_size(&f)): the
//             world's rank and size, or with context parallelism its data-parallel groups'
//   stop      fsdp_any(&f.world, stop_requested) at each step, so all ranks stop together
//   save      rank 0 checkpoint_begin; fsdp_save into its .tmp with {"params", p},
//             {"exp_avg", m}, {"exp_avg_sq", v}; rank 0 checkpoint_commit;
//             fsdp_any on each step's failure. Resume: fsdp_load at any world size
#ifndef FSDP_H
#define FSDP_H
#include "support/weights.h" // first: safetensors.h sets the POSIX feature macros
#include <limits.h>
#include <stdint.h>
#include "support/json.h"
#include "support/utils.h"
#ifdef USE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only, also in C++
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif
#if defined(FSDP_NCCL) && !defined(FSDP_DEVICE)
#define FSDP_DEVICE 1
#endif
#ifdef FSDP_DEVICE
#include <cuda_runtime.h>
#endif
#ifdef FSDP_NCCL
#include <nccl.h>
#endif

// ----------------------------------------------------------------------------
// shard arithmetic

// S = ceil(numel / n) rounded up to a multiple of align: the elements of every rank's
// shard, padding included
static inline size_t fsdp_shard_size(size_t numel, int n, size_t align) {
    size_t S = numel / (size_t)n + (numel % (size_t)n != 0);
    return (S + align - 1) / align * align;
}

// the real (unpadded) elements of shard r of n: [*begin, *begin + count); count may be 0
static inline size_t fsdp_shard_range(size_t numel, int n, size_t align, int r, size_t *begin) {
    size_t S = fsdp_shard_size(numel, n, align), b = (size_t)r * S;
    if (b > numel) b = numel;
    *begin = b;
    return numel - b < S ? numel - b : S;
}

// ----------------------------------------------------------------------------
// units

#define FSDP_NAME_MAX 80
#define FSDP_UNIT_TENSORS_MAX 9 // a decoder layer

typedef struct {
    char name[FSDP_NAME_MAX]; // the Hugging Face name
    int ndim;                 // 1 (norm weights) or 2
    int64_t shape[2];
    size_t numel;
    size_t offset;            // first element in the unit's flat buffer
} FsdpTensor;

typedef struct {
    char name[24];            // "embed", "layers.<i>", "head"
    FsdpTensor tensors[FSDP_UNIT_TENSORS_MAX];
    int n_tensors;
    size_t numel;             // its tensors together
    size_t shard;             // S = ceil(numel / n_shards): one rank's shard, padding included (packed: 0)
    size_t shard_offset;      // where that shard starts in a rank's flat shard buffer
    size_t packed;            // > 0: a packed unit, kept as this many bytes in a form its model chooses
                              // (QLoRA's 4-bit decoder layers, model.h), not as numel floats
    size_t packed_shard;      // Sb = ceil(packed / n_shards), rounded up to 16: one rank's bytes of it
    size_t packed_offset;     // where those start in a rank's byte shard buffer
} FsdpUnit;

typedef struct {
    FsdpUnit *units;          // embed, layers.0 .. layers.<L-1>, head
    int n_units, n_layers;
    int tied;                 // no lm_head: the output projection uses the embedding unit
    int n_shards;             // what the shard sizes are for
    size_t align;             // every unpacked unit's shard a multiple of this many elements (1, or AdamW8bit's blocks: model.h)
    size_t numel;             // every parameter, once
    size_t shard_numel;       // one rank's flat shard buffer: every unit's shard, padding included
    size_t packed_shard_bytes; // one rank's byte shard buffer: every packed unit's shard
} FsdpUnits;

static inline int fsdp_layer_unit(int layer) { return 1 + layer; }
static inline int fsdp_head_unit(const FsdpUnits *u) { return u->n_layers + 1; }

static inline void fsdp__add_tensor(FsdpUnit *u, const char *name, int64_t rows, int64_t cols) {
    FsdpTensor *t = &u->tensors[u->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = rows ? 2 : 1; // rows = 0: a vector of cols
    t->shape[0] = rows ? rows : cols;
    t->shape[1] = rows ? cols : 0;
    t->numel = (size_t)(rows ? rows : 1) * (size_t)cols;
    t->offset = u->numel;
    u->numel += t->numel;
}

// the shard size and offset of every unit for n shards: a packed unit's in bytes, in the
// byte shard buffer (each rank's piece of it 16-byte aligned there), every other's in floats
static inline void fsdp_units_set_shards(FsdpUnits *u, int n) {
    u->n_shards = n;
    u->shard_numel = u->packed_shard_bytes = 0;
    for (int i = 0; i < u->n_units; i++) {
        FsdpUnit *un = &u->units[i];
        un->shard = un->packed ? 0 : fsdp_shard_size(un->numel, n, u->align);
        un->shard_offset = u->shard_numel;
        u->shard_numel += un->shard;
        un->packed_shard = un->packed ? (fsdp_shard_size(un->packed, n, 1) + 15) / 16 * 16 : 0;
        un->packed_offset = u->packed_shard_bytes;
        u->packed_shard_bytes += un->packed_shard;
    }
}

// The units of a Llama model (Hugging Face names; a layer's tensors in the order
// its forward uses them), sharded n ways. q_dim = NH * hd, kv_dim = NKV * hd.
static inline void fsdp_units_llama(FsdpUnits *u, int n_layers, int dim, int hidden_dim, int q_dim, int kv_dim, int vocab,
                             int tied, int n_shards) {
    memset(u, 0, sizeof *u);
    u->n_layers = n_layers;
    u->n_units = n_layers + 2;
    u->tied = tied;
    u->align = 1;
    u->units = (FsdpUnit *)callocCheck((size_t)u->n_units, sizeof(FsdpUnit));
    snprintf(u->units[0].name, sizeof u->units[0].name, "embed");
    fsdp__add_tensor(&u->units[0], "model.embed_tokens.weight", vocab, dim);
    const char *mods[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    int64_t rows[7] = {q_dim, kv_dim, kv_dim, dim, hidden_dim, hidden_dim, dim};
    int64_t cols[7] = {dim, dim, dim, q_dim, dim, dim, hidden_dim};
    char name[FSDP_NAME_MAX];
    for (int l = 0; l < n_layers; l++) {
        FsdpUnit *un = &u->units[fsdp_layer_unit(l)];
        snprintf(un->name, sizeof un->name, "layers.%d", l);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        fsdp__add_tensor(un, name, 0, dim);
        for (int m = 0; m < 7; m++) {
            if (m == 4) { // the MLP block starts with its norm
                snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
                fsdp__add_tensor(un, name, 0, dim);
            }
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, mods[m]);
            fsdp__add_tensor(un, name, rows[m], cols[m]);
        }
    }
    FsdpUnit *head = &u->units[fsdp_head_unit(u)];
    snprintf(head->name, sizeof head->name, "head");
    fsdp__add_tensor(head, "model.norm.weight", 0, dim);
    if (!tied) fsdp__add_tensor(head, "lm_head.weight", vocab, dim);
    for (int i = 0; i < u->n_units; i++) u->numel += u->units[i].numel;
    fsdp_units_set_shards(u, n_shards);
}

static inline void fsdp_units_free(FsdpUnits *u) {
    free(u->units);
    memset(u, 0, sizeof *u);
}

// the tensor called name, and its unit; NULL if no unit has it
static inline const FsdpTensor *fsdp_find_tensor(const FsdpUnits *u, const char *name, int *unit) {
    for (int i = 0; i < u->n_units; i++)
        for (int j = 0; j < u->units[i].n_tensors; j++)
            if (strcmp(u->units[i].tensors[j].name, name) == 0) {
                if (unit) *unit = i;
                return &u->units[i].tensors[j];
            }
    return NULL;
}

// A model's identity for its checkpoints (16 hex digits): every unit's name and
// every tensor's name and shape, and `extra` (what else must match, e.g. the base
// model's identity for LoRA; "" if nothing).
static inline void fsdp_fingerprint(const FsdpUnits *u, const char *extra, char out[17]) {
    uint64_t h = data_hash_bytes(0, extra, strlen(extra));
    for (int i = 0; i < u->n_units; i++) {
        h = data_hash_bytes(h, u->units[i].name, strlen(u->units[i].name));
        for (int j = 0; j < u->units[i].n_tensors; j++) {
            const FsdpTensor *t = &u->units[i].tensors[j];
            h = data_hash_bytes(h, t->name, strlen(t->name));
            h = data_hash_bytes(h, t->shape, sizeof t->shape);
        }
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

// ----------------------------------------------------------------------------
// collectives

typedef enum { FSDP_BACKEND_SINGLE, FSDP_BACKEND_MPI, FSDP_BACKEND_TCP, FSDP_BACKEND_NCCL, FSDP_BACKEND_STAGED } FsdpBackend;
typedef enum { FSDP_F32, FSDP_F64 } FsdpDtype;
static inline size_t fsdp_dtype_size(FsdpDtype t) { return t == FSDP_F64 ? 8 : 4; }

typedef struct {
    FsdpBackend backend;      // where the data collectives run
    FsdpBackend host;         // where the host side runs (any, barrier, the NCCL id): SINGLE, MPI or TCP
    int rank, size;           // this rank's index in the communicator, and its size
    int world_rank;           // for messages
    void *scratch;            // MPI and TCP: the ranks' contributions to a reduction (grown as needed)
    size_t scratch_bytes;
    int *fd;                  // TCP, (size): rank 0 holds a connection to every other rank r in fd[r];
    int *peer;                //   the others one to rank 0 in fd[0]; peer: the world rank at each end
#ifdef USE_MPI
    MPI_Comm mpi;             // the MPI host side
#endif
#ifdef FSDP_NCCL
    ncclComm_t nccl;          // the NCCL backend
#endif
#ifdef FSDP_DEVICE
    cudaStream_t stream;      // NCCL and staged: device buffers, enqueued on this stream
    void *staging;            // staged: pinned host memory the buffers pass through (grown as needed)
    size_t staging_bytes;
#endif
} FsdpComm;

#if defined(__GNUC__)
#define FSDP__ABORT_ATTRS __attribute__((noreturn, format(printf, 2, 3)))
#else
#define FSDP__ABORT_ATTRS
#endif

// Prints "error: rank R: <message>" and ends every rank of the job, so none is
// left waiting in a collective: MPI_Abort; over TCP this rank's exit closes its
// connections, and every rank waiting on it stops when it sees that; in a
// single process, exit(1).
static inline void fsdp_abort(const FsdpComm *c, const char *fmt, ...) FSDP__ABORT_ATTRS;
static inline void fsdp_abort(const FsdpComm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: rank %d: ", c ? c->world_rank : 0);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
#ifdef FSDP_NCCL
    if (c && c->backend == FSDP_BACKEND_NCCL) ncclCommAbort(c->nccl);
#endif
#ifdef USE_MPI
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    exit(1);
}

#ifdef FSDP_NCCL
#define fsdp_ncclCheck(c, call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) \
    fsdp_abort((c), "%s:%d: %s: %s (NCCL_DEBUG=INFO shows why)", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); } while (0)
#endif
#ifdef FSDP_DEVICE
#define fsdp_cudaCheck(c, call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) \
    fsdp_abort((c), "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); } while (0)
#endif

// the device backends' forms of a collective: the NCCL call on the communicator's
// stream; the staged one (fsdp__staged_*: through host memory)
#ifdef FSDP_NCCL
#define FSDP__NCCL(c, call) do { if ((c)->backend == FSDP_BACKEND_NCCL) { fsdp_ncclCheck((c), call); return; } } while (0)
#else
#define FSDP__NCCL(c, call) do { } while (0)
#endif
#ifdef FSDP_DEVICE
#define FSDP__STAGED(c, call) do { if ((c)->backend == FSDP_BACKEND_STAGED) { call; return; } } while (0)
#else
#define FSDP__STAGED(c, call) do { } while (0)
#endif

static inline void *fsdp__scratch(FsdpComm *c, size_t bytes) {
    if (bytes > c->scratch_bytes) {
        c->scratch = reallocCheck(c->scratch, bytes);
        c->scratch_bytes = bytes;
    }
    return c->scratch;
}

// acc (n) += x (n): called once per rank in rank order, it sums every element as
// ((x_0 + x_1) + x_2) + ..., the order both MPI and TCP promise
static inline void fsdp__add(void *acc, const void *x, size_t n, FsdpDtype t) {
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        if (t == FSDP_F64) ((double *)acc)[i] += ((const double *)x)[i];
        else ((float *)acc)[i] += ((const float *)x)[i];
    }
}

// ----------------------------------------------------------------------------
// the TCP backend: a launch without MPI
//
// A launcher such as torchrun starts the processes and gives each RANK,
// WORLD_SIZE, MASTER_ADDR and MASTER_PORT (and LOCAL_RANK, LOCAL_WORLD_SIZE).
// Rendezvous: rank 0 listens at MASTER_PORT, every other rank connects to
// MASTER_ADDR there and says who it is (a hello: the protocol, WORLD_SIZE, its
// RANK and the port of its own listener); rank 0 checks every hello and answers
// each rank with the table of where every rank listens, which the split
// communicators connect through. Under torchrun's agent store
// (TORCHELASTIC_USE_AGENT_STORE=True) the agent already holds MASTER_PORT, so
// rank 0 listens at MASTER_PORT + 1. LLAMA2TUNE_TIMEOUT (seconds, default 600)
// bounds the wait for every rank to arrive.
//
// Every communicator is a star around its rank 0. A reduction sends every
// rank's buffer to rank 0, which adds them in rank order (fsdp__add: the same
// bits as the MPI backend) and sends back each rank's part or the whole. Every
// message starts with a header naming the collective and its size, so ranks
// that disagree about what they are doing stop, naming both sides, instead of
// reading each other's data as something else. A rank that exits closes its
// connections; a rank waiting on it sees that and stops, naming it.

#include "support/tcp.h"
#define FSDP_TCP_MAGIC 0x4c32546eu // "L2Tn"
#define FSDP_TCP_VERSION 1u
#define FSDP_TCP_HOST 64           // a numeric IPv4 or IPv6 address fits
#define FSDP_TCP_HELLO_WAIT 10.0   // seconds a new connection has to say who it is
#define FSDP_MAX_RANKS 65536       // as many as a checkpoint may have shards

enum { FSDP__HELLO_WORLD = 1, FSDP__HELLO_SPLIT = 2 };
enum { FSDP__TCP_GATHER = 1, FSDP__TCP_REDUCE, FSDP__TCP_SCATTER, FSDP__TCP_RESULT, FSDP__TCP_BCAST_UP, FSDP__TCP_BARRIER };
static const char *const fsdp__tcp_ops[] = {"?", "an all-gather", "a reduction", "a reduce-scatter's result", "a result",
                                            "a broadcast", "a barrier"};

// the process's side of the launch: the world's connections, its listener and
// where every rank's is
typedef struct {
    int rank, size;                 // in the world
    int *fd, *peer;                 // the world's connections (FsdpComm's), lent to every world communicator
    int listen_fd;                  // this rank's listener, for split communicators (-1: none)
    int splits;                     // communicators split so far: the same count on every rank
    double timeout;                 // LLAMA2TUNE_TIMEOUT
    char master[256];               // MASTER_ADDR
    char (*host)[FSDP_TCP_HOST];    // (W) each rank's address as rank 0 saw it ("": rank 0's host, MASTER_ADDR)
    int *port;                      // (W) the port of each rank's listener
} FsdpTcp;
static FsdpTcp fsdp__tcp = {0, 0, NULL, NULL, -1, 0, 0, {0}, NULL, NULL};

// hellos and headers are 32-bit words in network byte order
static inline void fsdp__put(uint32_t *w, const uint32_t *v, int n) { for (int i = 0; i < n; i++) w[i] = htonl(v[i]); }
static inline void fsdp__get(uint32_t *v, const uint32_t *w, int n) { for (int i = 0; i < n; i++) v[i] = ntohl(w[i]); }

static inline void fsdp__tcp_send(FsdpComm *c, int r, uint32_t op, const void *buf, size_t bytes) {
    uint32_t h[4] = {FSDP_TCP_MAGIC, op, (uint32_t)((uint64_t)bytes >> 32), (uint32_t)bytes}, w[4];
    char err[256];
    fsdp__put(w, h, 4);
    if (tcp_send(c->fd[r], w, sizeof w, err, sizeof err) != 0 || tcp_send(c->fd[r], buf, bytes, err, sizeof err) != 0)
        fsdp_abort(c, "lost the connection to rank %d during %s: %s (rank %d has stopped; its output says why)",
                   c->peer[r], fsdp__tcp_ops[op], err, c->peer[r]);
}

// receives what rank r of c sent, which must be op of bytes: anything else means
// the ranks are in different collectives, and stops this one
static inline void fsdp__tcp_recv(FsdpComm *c, int r, uint32_t op, void *buf, size_t bytes) {
    uint32_t w[4], h[4];
    char err[256];
    if (tcp_recv(c->fd[r], w, sizeof w, 0, err, sizeof err) != 0)
        fsdp_abort(c, "lost the connection to rank %d waiting for %s: %s (rank %d has stopped; its output says why)",
                   c->peer[r], fsdp__tcp_ops[op], err, c->peer[r]);
    fsdp__get(h, w, 4);
    uint64_t got = (uint64_t)h[2] << 32 | h[3];
    if (h[0] != FSDP_TCP_MAGIC || h[1] != op || got != bytes)
        fsdp_abort(c, "rank %d sent %s of %llu bytes where this rank is in %s of %zu bytes: the ranks are not running "
                   "the same collectives (were they started with the same options?)", c->peer[r],
                   h[0] == FSDP_TCP_MAGIC && h[1] >= 1 && h[1] <= FSDP__TCP_BARRIER ? fsdp__tcp_ops[h[1]] : "a message that is no collective",
                   (unsigned long long)got, fsdp__tcp_ops[op], bytes);
    if (tcp_recv(c->fd[r], buf, bytes, 0, err, sizeof err) != 0)
        fsdp_abort(c, "lost the connection to rank %d during %s: %s", c->peer[r], fsdp__tcp_ops[op], err);
}

// rank 0 sends buf to every other rank, which receives it (op: what it is)
static inline void fsdp__tcp_fan_out(FsdpComm *c, uint32_t op, void *buf, size_t bytes) {
    if (c->rank != 0) { fsdp__tcp_recv(c, 0, op, buf, bytes); return; }
    for (int r = 1; r < c->size; r++) fsdp__tcp_send(c, r, op, buf, bytes);
}

// full (size * bytes) = every rank's part (bytes), in rank order
static inline void fsdp__tcp_all_gather(FsdpComm *c, void *full, const void *part, size_t bytes) {
    if (c->rank != 0) fsdp__tcp_send(c, 0, FSDP__TCP_GATHER, part, bytes);
    else {
        if (full != part) memmove(full, part, bytes);
        for (int r = 1; r < c->size; r++) fsdp__tcp_recv(c, r, FSDP__TCP_GATHER, (char *)full + r * bytes, bytes);
    }
    fsdp__tcp_fan_out(c, FSDP__TCP_RESULT, full, (size_t)c->size * bytes);
}

// rank 0: acc (n) = the sum over ranks of their in (n), in rank order (acc may be
// in); the other ranks send their in. x: room for n elements on rank 0
static inline void fsdp__tcp_reduce(FsdpComm *c, void *acc, const void *in, void *x, size_t n, FsdpDtype t) {
    size_t bytes = n * fsdp_dtype_size(t);
    if (c->rank != 0) { fsdp__tcp_send(c, 0, FSDP__TCP_REDUCE, in, bytes); return; }
    if (acc != in) memcpy(acc, in, bytes);
    for (int r = 1; r < c->size; r++) {
        fsdp__tcp_recv(c, r, FSDP__TCP_REDUCE, x, bytes);
        fsdp__add(acc, x, n, t);
    }
}

// shard (S) = the sum over ranks of their full[rank * S .. (rank + 1) * S)
static inline void fsdp__tcp_reduce_scatter(FsdpComm *c, float *shard, const float *full, size_t S) {
    size_t n = (size_t)c->size * S;
    float *acc = c->rank == 0 ? (float *)fsdp__scratch(c, 2 * n * sizeof(float)) : NULL; // the sum, then room for one rank's
    fsdp__tcp_reduce(c, acc, full, acc ? acc + n : NULL, n, FSDP_F32);
    if (c->rank != 0) { fsdp__tcp_recv(c, 0, FSDP__TCP_SCATTER, shard, S * sizeof(float)); return; }
    for (int r = 1; r < c->size; r++) fsdp__tcp_send(c, r, FSDP__TCP_SCATTER, acc + r * S, S * sizeof(float));
    memcpy(shard, acc, S * sizeof(float));
}

static inline void fsdp__tcp_all_reduce(FsdpComm *c, void *buf, size_t n, FsdpDtype t) {
    void *x = c->rank == 0 ? fsdp__scratch(c, n * fsdp_dtype_size(t)) : NULL;
    fsdp__tcp_reduce(c, buf, buf, x, n, t);
    fsdp__tcp_fan_out(c, FSDP__TCP_RESULT, buf, n * fsdp_dtype_size(t));
}

static inline void fsdp__tcp_broadcast(FsdpComm *c, void *buf, size_t bytes, int root) {
    if (root != 0 && c->rank == root) fsdp__tcp_send(c, 0, FSDP__TCP_BCAST_UP, buf, bytes);
    if (root != 0 && c->rank == 0) fsdp__tcp_recv(c, root, FSDP__TCP_BCAST_UP, buf, bytes);
    if (c->rank != 0 && c->rank != root) fsdp__tcp_recv(c, 0, FSDP__TCP_RESULT, buf, bytes);
    for (int r = 1; c->rank == 0 && r < c->size; r++)
        if (r != root) fsdp__tcp_send(c, r, FSDP__TCP_RESULT, buf, bytes);
}

static inline void fsdp__tcp_barrier(FsdpComm *c) {
    for (int r = 1; c->rank == 0 && r < c->size; r++) fsdp__tcp_recv(c, r, FSDP__TCP_BARRIER, NULL, 0);
    if (c->rank != 0) fsdp__tcp_send(c, 0, FSDP__TCP_BARRIER, NULL, 0);
    fsdp__tcp_fan_out(c, FSDP__TCP_BARRIER, NULL, 0);
}

// an integer environment variable in [lo, hi]; -1 with a message when it is
// something else (a launcher's variables are input like any other)
static inline int fsdp__env_int(const char *name, int lo, int hi, int *out) {
    const char *s = getenv(name);
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "error: the environment variable %s%s%s%s must be an integer from %d to %d (RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT start ranks without MPI, as torchrun sets them)\n",
                name, s ? "='" : " is not set: it", s ? s : "", s ? "'" : "", lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

// frees the sockets and tables of the launch by environment
static inline void fsdp__tcp_end(void) {
    for (int r = 0; fsdp__tcp.fd && r < fsdp__tcp.size; r++)
        if (fsdp__tcp.fd[r] >= 0) close(fsdp__tcp.fd[r]);
    free(fsdp__tcp.fd);
    free(fsdp__tcp.peer);
    if (fsdp__tcp.listen_fd >= 0) close(fsdp__tcp.listen_fd);
    free(fsdp__tcp.host);
    free(fsdp__tcp.port);
    memset(&fsdp__tcp, 0, sizeof fsdp__tcp);
    fsdp__tcp.listen_fd = -1;
}

// What is wrong with the hello h (host byte order) that rank 0 of c receives
// while connecting a communicator of this kind and tag (want: as for
// fsdp__tcp_connect; c->fd: the ranks arrived so far): NULL if nothing, or
// fsdp__stranger if it comes from no rank of this job at all.
static const char fsdp__stranger[] = "is not a rank of this job";
static inline const char *fsdp__hello_problem(const uint32_t h[6], uint32_t kind, uint32_t tag, const FsdpComm *c,
                                              const int *want) {
    return h[0] != FSDP_TCP_MAGIC ? fsdp__stranger
           : h[1] != FSDP_TCP_VERSION ? "runs another version of llama2.tune"
           : h[2] != kind ? "is at another step of starting up"
           : h[3] != tag ? (kind == FSDP__HELLO_WORLD ? "has another WORLD_SIZE" : "split other communicators")
           : h[4] < 1 || h[4] >= (uint32_t)c->size ? "has a RANK out of range"
           : c->fd[h[4]] >= 0 ? "has the RANK of another process (each process needs its own)"
           : kind == FSDP__HELLO_SPLIT && h[5] != (uint32_t)want[h[4]] ? "is not the rank this one expects"
           : kind == FSDP__HELLO_WORLD && (h[5] < 1 || h[5] > 65535) ? "gave no valid port" : NULL;
}

// c (rank, size set) gets its connections: rank 0 accepts the other ranks on
// lfd, each of which must say hello {magic, version, kind, tag, its rank, and
// want[rank]: its world rank (a split) or its listener's port (the world)};
// the others connect to host:port and say theirs. A connection that says
// nothing valid in time is not a rank of this job and is closed; a hello that
// is valid but wrong (another world size, a rank twice) stops the run.
static inline int fsdp__tcp_connect(FsdpComm *c, int lfd, const char *host, int port, uint32_t kind, uint32_t tag,
                                    uint32_t mine, const int *want) {
    char err[300];
    double deadline = tcp__now() + fsdp__tcp.timeout;
    c->fd = (int *)mallocCheck((size_t)c->size * sizeof(int));
    c->peer = (int *)mallocCheck((size_t)c->size * sizeof(int));
    for (int r = 0; r < c->size; r++) c->fd[r] = -1;
    uint32_t h[6], w[6];
    if (c->rank != 0) {
        c->peer[0] = kind == FSDP__HELLO_WORLD ? 0 : want[0];
        uint32_t me[6] = {FSDP_TCP_MAGIC, FSDP_TCP_VERSION, kind, tag, (uint32_t)c->rank, mine};
        fsdp__put(w, me, 6);
        if (tcp_connect(host, port, deadline, &c->fd[0], err, sizeof err) != 0 ||
            tcp_send(c->fd[0], w, sizeof w, err, sizeof err) != 0) {
            fprintf(stderr, "error: rank %d: cannot reach rank %d at %s:%d: %s (is it running? LLAMA2TUNE_TIMEOUT=%g s)\n",
                    c->world_rank, c->peer[0], host, port, err, fsdp__tcp.timeout);
            return -1;
        }
        return 0;
    }
    c->peer[0] = c->world_rank;
    for (int arrived = 1; arrived < c->size;) {
        int fd;
        char from[FSDP_TCP_HOST];
        if (tcp_accept(lfd, deadline, &fd, from, sizeof from, err, sizeof err) != 0) {
            fprintf(stderr, "error: rank %d: only %d of %d ranks arrived within %g s (LLAMA2TUNE_TIMEOUT); missing:",
                    c->world_rank, arrived, c->size, fsdp__tcp.timeout);
            for (int r = 1; r < c->size; r++)
                if (c->fd[r] < 0) fprintf(stderr, " %d", kind == FSDP__HELLO_WORLD ? r : want[r]);
            fprintf(stderr, " (%s)\n", err);
            return -1;
        }
        double wait = tcp__now() + FSDP_TCP_HELLO_WAIT;
        const char *bad = tcp_recv(fd, w, sizeof w, wait < deadline ? wait : deadline, err, sizeof err) != 0
                              ? fsdp__stranger : (fsdp__get(h, w, 6), fsdp__hello_problem(h, kind, tag, c, want));
        if (bad == fsdp__stranger) {
            fprintf(stderr, "warning: rank %d: ignored a connection from %s that %s\n", c->world_rank, from, bad);
            close(fd);
            continue;
        }
        if (bad) {
            fprintf(stderr, "error: rank %d: the process at %s that says it is rank %u %s\n", c->world_rank, from, h[4], bad);
            close(fd);
            return -1;
        }
        c->fd[h[4]] = fd;
        c->peer[h[4]] = kind == FSDP__HELLO_WORLD ? (int)h[4] : want[h[4]];
        if (kind == FSDP__HELLO_WORLD) { // a loopback address: rank 0's host, which every rank reaches as MASTER_ADDR
            int loopback = !strncmp(from, "127.", 4) || !strncmp(from, "::ffff:127.", 11) || !strcmp(from, "::1");
            snprintf(fsdp__tcp.host[h[4]], FSDP_TCP_HOST, "%s", loopback ? "" : from);
            fsdp__tcp.port[h[4]] = (int)h[5];
        }
        arrived++;
    }
    return 0;
}

// The world of a launch by environment (WORLD_SIZE > 1): the rendezvous, then
// every rank learns where the others listen; once per process, as MPI_Init,
// and every later world communicator borrows the connections. 0, or -1 with a
// message.
static inline int fsdp__tcp_world(FsdpComm *c) {
    c->backend = c->host = FSDP_BACKEND_TCP;
    if (fsdp__tcp.fd) {
        c->rank = c->world_rank = fsdp__tcp.rank;
        c->size = fsdp__tcp.size;
        c->fd = fsdp__tcp.fd, c->peer = fsdp__tcp.peer;
        return 0;
    }
    int W, rank, port;
    if (fsdp__env_int("WORLD_SIZE", 1, FSDP_MAX_RANKS, &W) != 0 || fsdp__env_int("RANK", 0, W - 1, &rank) != 0 ||
        fsdp__env_int("MASTER_PORT", 1, 65534, &port) != 0)
        return -1;
    const char *addr = getenv("MASTER_ADDR"), *wait = getenv("LLAMA2TUNE_TIMEOUT");
    if (!addr || !*addr || strlen(addr) >= sizeof fsdp__tcp.master) {
        fprintf(stderr, "error: MASTER_ADDR (rank 0's host name or address) %s\n", addr && *addr ? "is too long" : "is not set");
        return -1;
    }
    char *end;
    fsdp__tcp.timeout = wait ? strtod(wait, &end) : 600;
    if (wait && (!*wait || *end || !(fsdp__tcp.timeout > 0 && fsdp__tcp.timeout <= 1e6))) {
        fprintf(stderr, "error: LLAMA2TUNE_TIMEOUT='%s' must be the seconds to wait for the ranks, above 0 and up to 1e6\n", wait);
        return -1;
    }
    snprintf(fsdp__tcp.master, sizeof fsdp__tcp.master, "%s", addr);
    const char *agent_store = getenv("TORCHELASTIC_USE_AGENT_STORE");
    int agent = agent_store && !strcmp(agent_store, "True");
    port += agent; // the agent's store holds MASTER_PORT
    c->rank = c->world_rank = rank;
    c->size = W;
    fsdp__tcp.host = (char (*)[FSDP_TCP_HOST])callocCheck((size_t)W, FSDP_TCP_HOST);
    fsdp__tcp.port = (int *)callocCheck((size_t)W, sizeof(int));
    char err[300];
    int master = -1, bound, mine;
    if (tcp_listen(0, &fsdp__tcp.listen_fd, &mine, err, sizeof err) != 0 ||
        (rank == 0 && tcp_listen(port, &master, &bound, err, sizeof err) != 0)) {
        fprintf(stderr, "error: rank %d: %s%s%s\n", rank, err, master < 0 && rank == 0 ? " (MASTER_PORT" : "",
                master < 0 && rank == 0 ? (agent ? " + 1, under torchrun's agent store, must be free on rank 0's host)"
                                                 : " must be a port free on rank 0's host)") : "");
        return -1;
    }
    int rc = fsdp__tcp_connect(c, master, fsdp__tcp.master, port, FSDP__HELLO_WORLD, (uint32_t)W, (uint32_t)mine, NULL);
    if (master >= 0) close(master);
    if (rc != 0) return -1;
    fsdp__tcp.port[0] = mine;
    // the table: rank 0 is reached at MASTER_ADDR, the others where rank 0 saw them
    size_t table = (size_t)W * (FSDP_TCP_HOST + sizeof(int));
    char *t = (char *)mallocCheck(table);
    if (rank == 0) {
        memcpy(t, fsdp__tcp.host, (size_t)W * FSDP_TCP_HOST);
        memcpy(t + (size_t)W * FSDP_TCP_HOST, fsdp__tcp.port, (size_t)W * sizeof(int));
    }
    fsdp__tcp_fan_out(c, FSDP__TCP_RESULT, t, table);
    memcpy(fsdp__tcp.host, t, (size_t)W * FSDP_TCP_HOST);
    memcpy(fsdp__tcp.port, t + (size_t)W * FSDP_TCP_HOST, (size_t)W * sizeof(int));
    free(t);
    for (int r = 0; r < W; r++) fsdp__tcp.host[r][FSDP_TCP_HOST - 1] = '\0';
    fsdp__tcp.rank = rank, fsdp__tcp.size = W, fsdp__tcp.fd = c->fd, fsdp__tcp.peer = c->peer;
    return 0;
}

// out: the ranks of c with this color, ordered by (key, rank in c), connected
// around the first of them. The connections of one split are all made before
// any rank goes on (a barrier over c), so two splits' hellos never mix.
static inline void fsdp__tcp_split(FsdpComm *out, FsdpComm *c, int color, int key) {
    int me[3] = {color, key, c->world_rank}, *all = (int *)mallocCheck((size_t)c->size * sizeof me);
    int *members = (int *)mallocCheck((size_t)c->size * sizeof(int)), n = 0;
    fsdp__tcp_all_gather(c, all, me, sizeof me);
    for (int r = 0; r < c->size; r++) { // insertion sort: a stable order by key
        if (all[3 * r] != color) continue;
        int i = n++;
        for (; i > 0 && all[3 * members[i - 1] + 1] > all[3 * r + 1]; i--) members[i] = members[i - 1];
        members[i] = r;
    }
    for (int i = 0; i < n; i++) {
        if (members[i] == c->rank) out->rank = i;
        members[i] = all[3 * members[i] + 2]; // now world ranks
    }
    out->size = n;
    uint32_t tag = (uint32_t)++fsdp__tcp.splits;
    int rc = 0;
    if (n > 1) {
        out->backend = out->host = FSDP_BACKEND_TCP;
        const char *host = fsdp__tcp.host[members[0]][0] ? fsdp__tcp.host[members[0]] : fsdp__tcp.master;
        rc = fsdp__tcp_connect(out, fsdp__tcp.listen_fd, host, fsdp__tcp.port[members[0]], FSDP__HELLO_SPLIT, tag,
                               (uint32_t)c->world_rank, members);
    }
    free(all);
    free(members);
    if (rc != 0) fsdp_abort(c, "cannot connect a communicator of %d ranks (see above)", n);
    fsdp__tcp_barrier(c);
}

// ----------------------------------------------------------------------------
// the world and its communicators

// 1 if an MPI launcher started this process: mpirun / mpiexec (OpenMPI, MPICH's
// Hydra) or srun (Slurm's PMI or PMIx), each of which sets one of these
static inline int fsdp_launched_by_mpi(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

// Every process's communicator: MPI_COMM_WORLD (MPI_Init here) when an MPI
// launcher started the process; else, with WORLD_SIZE above 1 in the
// environment, the TCP world of a launch such as torchrun's; else a world of one
// that never calls MPI. A communicator of one rank does every collective
// locally. 0, or -1 with a message (a bad launch environment, a rendezvous
// that failed).
static inline int fsdp_world_init(FsdpComm *c) {
    memset(c, 0, sizeof *c);
    c->size = 1;
    const char *ws = getenv("WORLD_SIZE");
#ifdef USE_MPI
    c->mpi = MPI_COMM_NULL;
    int up;
    MPI_Initialized(&up);
    if (up || fsdp_launched_by_mpi()) {
        if (!up) MPI_Init(NULL, NULL);
        c->backend = c->host = FSDP_BACKEND_MPI;
        c->mpi = MPI_COMM_WORLD;
        MPI_Comm_rank(c->mpi, &c->rank);
        MPI_Comm_size(c->mpi, &c->size);
        c->world_rank = c->rank;
        return 0;
    }
#else
    const char *np = getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : getenv("PMI_SIZE");
    if (np && atoi(np) > 1) {
        fprintf(stderr, "error: an MPI launcher started %s processes, but this program was built without MPI (no mpicc "
                "when it was built): install OpenMPI and rebuild, or start the ranks with RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT set (torchrun --no_python)\n", np);
        return -1;
    }
#endif
    if (ws && strcmp(ws, "1") != 0) return fsdp__tcp_world(c);
    return 0;
}

// Splits c: ranks of the same color form a communicator, ordered by key
// (collective over c).
static inline void fsdp_comm_split(FsdpComm *out, FsdpComm *c, int color, int key) {
    memset(out, 0, sizeof *out);
    out->size = 1;
    out->world_rank = c->world_rank;
    if (c->host == FSDP_BACKEND_TCP && c->size > 1) {
        fsdp__tcp_split(out, c, color, key);
        return;
    }
#ifdef USE_MPI
    out->mpi = MPI_COMM_NULL;
    if (c->host == FSDP_BACKEND_MPI) {
        out->backend = out->host = FSDP_BACKEND_MPI;
        MPI_Comm_split(c->mpi, color, key, &out->mpi);
        MPI_Comm_rank(out->mpi, &out->rank);
        MPI_Comm_size(out->mpi, &out->size);
    }
#endif
    (void)color, (void)key;
}

// frees what a device backend (fsdp_nccl_init, fsdp_staged_init) added to c,
// before its stream is destroyed; c's host side stays
static inline void fsdp_device_free(FsdpComm *c) {
#ifdef FSDP_NCCL
    if (c->backend == FSDP_BACKEND_NCCL) fsdp_ncclCheck(c, ncclCommDestroy(c->nccl));
#endif
#ifdef FSDP_DEVICE
    if (c->staging) { // its last copy back may still be reading it
        fsdp_cudaCheck(c, cudaStreamSynchronize(c->stream));
        fsdp_cudaCheck(c, cudaFreeHost(c->staging));
        c->staging = NULL, c->staging_bytes = 0;
    }
#endif
    c->backend = c->host;
}

static inline void fsdp_comm_free(FsdpComm *c) {
    fsdp_device_free(c);
#ifdef USE_MPI
    if (c->host == FSDP_BACKEND_MPI && c->mpi != MPI_COMM_WORLD && c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
#endif
    for (int r = 0; c->fd && c->fd != fsdp__tcp.fd && r < c->size; r++) // the world's are fsdp_world_finalize's
        if (c->fd[r] >= 0) close(c->fd[r]);
    if (c->fd != fsdp__tcp.fd) free(c->fd), free(c->peer);
    free(c->scratch);
    memset(c, 0, sizeof *c);
}

// ends MPI, or the launch by environment (call once, after every communicator is freed)
static inline void fsdp_world_finalize(void) {
    fsdp__tcp_end();
#ifdef USE_MPI
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) MPI_Finalize();
#endif
}

// ----------------------------------------------------------------------------
// the collectives, for every backend

#ifdef USE_MPI
static inline MPI_Datatype fsdp__mpi_type(FsdpDtype t) { return t == FSDP_F64 ? MPI_DOUBLE : MPI_FLOAT; }
// MPI counts are ints
static inline void fsdp__check_count(const FsdpComm *c, size_t n, const char *what) {
    if (n > (size_t)INT_MAX)
        fsdp_abort(c, "%s of %zu elements per rank is more than MPI can send at once (%d): use more ranks", what, n, INT_MAX);
}

// out (S) = the sum over ranks of their in[rank * S .. (rank + 1) * S): each rank
// receives every rank's block of its shard (MPI_Alltoall), then adds them in rank order
static inline void fsdp__mpi_reduce_scatter(FsdpComm *c, void *out, const void *in, size_t S, FsdpDtype t) {
    fsdp__check_count(c, S, "reduce-scatter");
    size_t es = fsdp_dtype_size(t);
    char *recv = (char *)fsdp__scratch(c, (size_t)c->size * S * es);
    MPI_Alltoall(in, (int)S, fsdp__mpi_type(t), recv, (int)S, fsdp__mpi_type(t), c->mpi);
    memcpy(out, recv, S * es);
    for (int r = 1; r < c->size; r++) fsdp__add(out, recv + (size_t)r * S * es, S, t);
}
#endif

// full (size * bytes) = every rank's part (bytes) in rank order; host buffers
// (any backend's host side: small things such as the checkpoint digests)
static inline void fsdp_all_gather_bytes(FsdpComm *c, void *full, const void *part, size_t bytes) {
    if (c->size > 1 && c->host == FSDP_BACKEND_TCP) { fsdp__tcp_all_gather(c, full, part, bytes); return; }
#ifdef USE_MPI
    if (c->size > 1) {
        fsdp__check_count(c, bytes, "all-gather");
        if (part == (char *)full + (size_t)c->rank * bytes) MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, full, (int)bytes, MPI_BYTE, c->mpi);
        else MPI_Allgather(part, (int)bytes, MPI_BYTE, full, (int)bytes, MPI_BYTE, c->mpi);
        return;
    }
#endif
    if (full != part) memmove(full, part, bytes);
}

// *lo, *hi = the smallest and the largest v over the ranks (host side): how
// ranks check that they agree on a number
static inline void fsdp_int_range(FsdpComm *c, int v, int *lo, int *hi) {
    int *all = (int *)mallocCheck((size_t)c->size * sizeof(int));
    fsdp_all_gather_bytes(c, all, &v, sizeof v);
    *lo = *hi = v;
    for (int r = 0; r < c->size; r++) *lo = all[r] < *lo ? all[r] : *lo, *hi = all[r] > *hi ? all[r] : *hi;
    free(all);
}

// ---- the host side of the data collectives (host buffers: MPI, TCP, or one process)

// full (size * S) = every rank's shard (S) in rank order
static inline void fsdp__host_all_gather(FsdpComm *c, float *full, const float *shard, size_t S) {
#ifdef USE_MPI
    if (c->size > 1 && c->host == FSDP_BACKEND_MPI) { // in floats: MPI's counts are ints
        fsdp__check_count(c, S, "all-gather");
        if (shard == full + (size_t)c->rank * S) MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, full, (int)S, MPI_FLOAT, c->mpi);
        else MPI_Allgather(shard, (int)S, MPI_FLOAT, full, (int)S, MPI_FLOAT, c->mpi);
        return;
    }
#endif
    fsdp_all_gather_bytes(c, full, shard, S * sizeof(float));
}

// shard (S) = the sum over ranks of their full[rank * S .. (rank + 1) * S)
static inline void fsdp__host_reduce_scatter(FsdpComm *c, float *shard, const float *full, size_t S) {
    if (c->size > 1 && c->host == FSDP_BACKEND_TCP) { fsdp__tcp_reduce_scatter(c, shard, full, S); return; }
#ifdef USE_MPI
    if (c->size > 1) { fsdp__mpi_reduce_scatter(c, shard, full, S, FSDP_F32); return; }
#endif
    if (shard != full) memmove(shard, full, S * sizeof(float));
}

// buf (n) = the sum over ranks of their buf, in place
static inline void fsdp__host_all_reduce(FsdpComm *c, void *buf, size_t n, FsdpDtype t) {
    if (c->size == 1) return;
    if (c->host == FSDP_BACKEND_TCP) { fsdp__tcp_all_reduce(c, buf, n, t); return; }
#ifdef USE_MPI
    // reduce-scatter of the zero-padded buffer (sums in rank order), then all-gather
    size_t es = fsdp_dtype_size(t), S = fsdp_shard_size(n, c->size, 1), W = (size_t)c->size;
    char *padded = (char *)callocCheck(W * S + S, es), *mine = padded + W * S * es;
    memcpy(padded, buf, n * es);
    fsdp__mpi_reduce_scatter(c, mine, padded, S, t);
    MPI_Allgather(mine, (int)S, fsdp__mpi_type(t), padded, (int)S, fsdp__mpi_type(t), c->mpi);
    memcpy(buf, padded, n * es);
    free(padded);
#endif
}

// buf (bytes) = root's buf
static inline void fsdp__host_broadcast(FsdpComm *c, void *buf, size_t bytes, int root) {
    if (c->size > 1 && c->host == FSDP_BACKEND_TCP) { fsdp__tcp_broadcast(c, buf, bytes, root); return; }
#ifdef USE_MPI
    for (size_t done = 0; c->size > 1 && done < bytes;) { // in pieces: MPI counts are ints
        size_t k = bytes - done < (size_t)1 << 30 ? bytes - done : (size_t)1 << 30;
        MPI_Bcast((char *)buf + done, (int)k, MPI_BYTE, root, c->mpi);
        done += k;
    }
#else
    (void)buf, (void)bytes, (void)root;
#endif
}

#ifdef FSDP_DEVICE
// ---- the staged backend: device buffers through pinned host memory, in c's stream's order
//
// A staged collective copies its input from the device into c->staging on c's
// stream (so after everything the stream waits for, as NCCL's kernel would
// start), waits for the stream, runs the host side's collective on the
// staging buffer, and copies the result back to the device on the stream,
// where what is enqueued later (events, the other stream's waits) follows it
// as it follows NCCL's. The host writes the staging buffer only after a
// synchronize of the stream, which the previous copy back is part of.

// the staging buffer, room bytes at least, holding bytes of the device buffer
// dev at offset at, copied on c's stream, which has then finished
static inline char *fsdp__stage_in(FsdpComm *c, size_t room, size_t at, const void *dev, size_t bytes) {
    if (room > c->staging_bytes) {
        fsdp_cudaCheck(c, cudaStreamSynchronize(c->stream)); // the old buffer's last copy back is done
        if (c->staging) fsdp_cudaCheck(c, cudaFreeHost(c->staging));
        fsdp_cudaCheck(c, cudaMallocHost(&c->staging, room));
        c->staging_bytes = room;
    }
    char *h = (char *)c->staging;
    if (bytes) fsdp_cudaCheck(c, cudaMemcpyAsync(h + at, dev, bytes, cudaMemcpyDeviceToHost, c->stream));
    fsdp_cudaCheck(c, cudaStreamSynchronize(c->stream));
    return h;
}

// bytes of the staging buffer from offset at into the device buffer dev, on c's stream
static inline void fsdp__stage_out(FsdpComm *c, void *dev, size_t at, size_t bytes) {
    if (bytes) fsdp_cudaCheck(c, cudaMemcpyAsync(dev, (char *)c->staging + at, bytes, cudaMemcpyHostToDevice, c->stream));
}

// full (size * bytes) = every rank's part (bytes): fp32 or bf16 elements alike, moved as bytes
static inline void fsdp__staged_all_gather(FsdpComm *c, void *full, const void *part, size_t bytes) {
    size_t at = (size_t)c->rank * bytes, all = (size_t)c->size * bytes;
    char *h = fsdp__stage_in(c, all, at, part, bytes);
    fsdp_all_gather_bytes(c, h, h + at, bytes);
    fsdp__stage_out(c, full, 0, all);
}

// shard (S) = the sum of the ranks' full[rank * S ..): full staged at 0, the shard after it
static inline void fsdp__staged_reduce_scatter(FsdpComm *c, float *shard, const float *full, size_t S) {
    size_t n = (size_t)c->size * S;
    float *h = (float *)fsdp__stage_in(c, (n + S) * sizeof(float), 0, full, n * sizeof(float));
    fsdp__host_reduce_scatter(c, h + n, h, S);
    fsdp__stage_out(c, shard, n * sizeof(float), S * sizeof(float));
}

static inline void fsdp__staged_all_reduce(FsdpComm *c, void *buf, size_t n, FsdpDtype t) {
    size_t bytes = n * fsdp_dtype_size(t);
    fsdp__host_all_reduce(c, fsdp__stage_in(c, bytes, 0, buf, bytes), n, t);
    fsdp__stage_out(c, buf, 0, bytes);
}

static inline void fsdp__staged_broadcast(FsdpComm *c, void *buf, size_t bytes, int root) {
    fsdp__host_broadcast(c, fsdp__stage_in(c, bytes, 0, buf, bytes), bytes, root);
    fsdp__stage_out(c, buf, 0, bytes);
}

// Makes c (a host communicator) move device buffers through host memory, on
// stream: no call to any other rank.
static inline void fsdp_staged_init(FsdpComm *c, cudaStream_t stream) {
    c->stream = stream;
    c->backend = FSDP_BACKEND_STAGED;
}
#endif

// ---- the data collectives, for every backend

// full (size * S) = every rank's shard (S) in rank order
static inline void fsdp_all_gather(FsdpComm *c, float *full, const float *shard, size_t S) {
    FSDP__NCCL(c, ncclAllGather(shard, full, S, ncclFloat, c->nccl, c->stream));
    FSDP__STAGED(c, fsdp__staged_all_gather(c, full, shard, S * sizeof(float)));
    fsdp__host_all_gather(c, full, shard, S);
}

// the same for 16-bit elements: the CUDA trainer's bf16 or fp16 base weights (device
// buffers, so a device backend only; a gather moves them as they are, so ncclBfloat16
// serves fp16 as well)
static inline void fsdp_all_gather_bf16(FsdpComm *c, void *full, const void *shard, size_t S) {
    FSDP__NCCL(c, ncclAllGather(shard, full, S, ncclBfloat16, c->nccl, c->stream));
    FSDP__STAGED(c, fsdp__staged_all_gather(c, full, shard, S * 2));
    fsdp_abort(c, "internal: a bf16 all-gather needs a device backend (NCCL or staged), not %s", c->size > 1 ? "a host one" : "one process");
    (void)full, (void)shard, (void)S;
}

// full (size * bytes) = every rank's part (bytes), moved as they are: packed units, on
// the host or (NCCL, staged) the device
static inline void fsdp_all_gather_u8(FsdpComm *c, void *full, const void *part, size_t bytes) {
    FSDP__NCCL(c, ncclAllGather(part, full, bytes, ncclUint8, c->nccl, c->stream));
    FSDP__STAGED(c, fsdp__staged_all_gather(c, full, part, bytes));
    fsdp_all_gather_bytes(c, full, part, bytes);
}

// shard (S) = the sum over ranks of their full[rank * S .. (rank + 1) * S)
static inline void fsdp_reduce_scatter(FsdpComm *c, float *shard, const float *full, size_t S) {
    FSDP__NCCL(c, ncclReduceScatter(full, shard, S, ncclFloat, ncclSum, c->nccl, c->stream));
    FSDP__STAGED(c, fsdp__staged_reduce_scatter(c, shard, full, S));
    fsdp__host_reduce_scatter(c, shard, full, S);
}

// buf (n) = the sum over ranks of their buf, in place; every rank gets the same bits
static inline void fsdp_all_reduce(FsdpComm *c, void *buf, size_t n, FsdpDtype t) {
    FSDP__NCCL(c, ncclAllReduce(buf, buf, n, t == FSDP_F64 ? ncclDouble : ncclFloat, ncclSum, c->nccl, c->stream));
    FSDP__STAGED(c, fsdp__staged_all_reduce(c, buf, n, t));
    fsdp__host_all_reduce(c, buf, n, t);
}

// buf (bytes) = root's buf
static inline void fsdp_broadcast(FsdpComm *c, void *buf, size_t bytes, int root) {
    FSDP__NCCL(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->nccl, c->stream));
    FSDP__STAGED(c, fsdp__staged_broadcast(c, buf, bytes, root));
    fsdp__host_broadcast(c, buf, bytes, root);
}

// waits until every rank is here (a device backend: and its queued collectives have finished)
static inline void fsdp_barrier(FsdpComm *c) {
#ifdef FSDP_DEVICE
    if (c->backend == FSDP_BACKEND_NCCL || c->backend == FSDP_BACKEND_STAGED) fsdp_cudaCheck(c, cudaStreamSynchronize(c->stream));
#endif
    if (c->size > 1 && c->host == FSDP_BACKEND_TCP) fsdp__tcp_barrier(c);
#ifdef USE_MPI
    if (c->size > 1 && c->host == FSDP_BACKEND_MPI) MPI_Barrier(c->mpi);
#endif
}

// 1 if flag is set on any rank (host side, every backend): how ranks agree that
// a step failed, or that a stop was requested, before the next collective
static inline int fsdp_any(FsdpComm *c, int flag) {
    int any = flag != 0;
    if (c->size > 1 && c->host == FSDP_BACKEND_TCP) {
        double x = any;
        fsdp__tcp_all_reduce(c, &x, 1, FSDP_F64);
        return x > 0;
    }
#ifdef USE_MPI
    if (c->size > 1) MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_LOR, c->mpi);
#endif
    return any;
}

#ifdef FSDP_NCCL
// Makes c (a host communicator) use NCCL for its data collectives, on stream:
// rank 0 makes NCCL's unique id and broadcasts it over c's host side (MPI or
// TCP). Call cudaSetDevice first.
static inline void fsdp_nccl_init(FsdpComm *c, cudaStream_t stream) {
    ncclUniqueId id;
    if (c->rank == 0) fsdp_ncclCheck(c, ncclGetUniqueId(&id));
    fsdp_broadcast(c, &id, sizeof id, 0);
    fsdp_ncclCheck(c, ncclCommInitRank(&c->nccl, c->size, id, c->rank));
    c->stream = stream;
    c->backend = FSDP_BACKEND_NCCL;
}
#endif

// ----------------------------------------------------------------------------
// strategies

typedef enum { FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD, FSDP_HYBRID_SHARD, FSDP_N_STRATEGIES } FsdpStrategy;
enum { FSDP_OVER_WORLD, FSDP_OVER_NONE, FSDP_OVER_GROUP }; // who shares one copy of the parameters

typedef struct {
    const char *name;
    int shard_over;            // FSDP_OVER_*: the shard group is every rank, each rank alone, or a group (node)
    int reshard_after_forward; // free a unit gathered for its forward, gather it again for its backward
} FsdpStrategyInfo;

static const FsdpStrategyInfo fsdp_strategies[FSDP_N_STRATEGIES] = {
    {"FULL_SHARD", FSDP_OVER_WORLD, 1},    // parameters, gradients and optimizer state sharded over every rank
    {"SHARD_GRAD_OP", FSDP_OVER_WORLD, 0}, // the same, but a unit stays gathered from its forward to its backward
    {"NO_SHARD", FSDP_OVER_NONE, 0},       // DDP: every rank holds everything, gradients all-reduced
    {"HYBRID_SHARD", FSDP_OVER_GROUP, 1},  // FULL_SHARD within a group, replicated across groups
};

// "FULL_SHARD" etc. -> s; 0 ok, -1 with a message naming the option
static inline int fsdp_strategy_parse(const char *name, FsdpStrategy *s) {
    for (int i = 0; i < FSDP_N_STRATEGIES; i++)
        if (strcmp(name, fsdp_strategies[i].name) == 0) { *s = (FsdpStrategy)i; return 0; }
    fprintf(stderr, "error: --sharding_strategy: unknown strategy '%s' (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD)\n", name);
    return -1;
}

typedef struct {
    FsdpStrategy strategy;
    const FsdpStrategyInfo *info;
    FsdpComm world;   // every rank
    FsdpComm shard;   // the ranks sharing one copy of the parameters, each holding one shard (size G)
    FsdpComm replica; // the ranks holding the same shard index in the other groups (size W / G)
    FsdpComm context; // --context_parallel: the ranks holding different positions of the same rows (size P;
                      // consecutive ranks), set by fsdp_context_init; the data-parallel rank is world.rank / P
    int local_size;   // the ranks on this rank's node: MPI's ranks that share its memory, or the
                      // environment's LOCAL_WORLD_SIZE; 0 when a launch by environment does not say
} Fsdp;

// Starts the world and splits it for strategy s. shard_group (HYBRID_SHARD only):
// ranks per group, which must divide the world size; 0 = the ranks of one node.
// 0 ok; -1 with a message on every rank (they all see the same arguments).
static inline int fsdp_init(Fsdp *f, FsdpStrategy s, int shard_group) {
    memset(f, 0, sizeof *f);
    f->strategy = s;
    f->info = &fsdp_strategies[s];
    if (fsdp_world_init(&f->world) != 0) return -1;
    int W = f->world.size, rank = f->world.rank, G = shard_group;
    if (G != 0 && f->info->shard_over != FSDP_OVER_GROUP) {
        fprintf(stderr, "error: --shard_group applies to HYBRID_SHARD only, not %s\n", f->info->name);
        return -1;
    }
    f->local_size = W == 1;
    if (getenv("LOCAL_WORLD_SIZE") && f->world.host == FSDP_BACKEND_TCP &&
        fsdp__env_int("LOCAL_WORLD_SIZE", 1, W, &f->local_size) != 0)
        return -1;
#ifdef USE_MPI
    if (f->world.host == FSDP_BACKEND_MPI) {
        MPI_Comm node;
        MPI_Comm_split_type(f->world.mpi, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &f->local_size);
        MPI_Comm_free(&node);
    }
#endif
    if (f->info->shard_over == FSDP_OVER_WORLD) G = W;
    if (f->info->shard_over == FSDP_OVER_NONE) G = 1;
    if (G == 0 && W == 1) G = 1;
    if (G == 0) { // one group per node; every node must hold as many ranks
        int lo, hi;
        if (!f->local_size && fsdp__env_int("LOCAL_WORLD_SIZE", 1, W, &f->local_size) != 0) return -1; // (says it is not set)
        fsdp_int_range(&f->world, f->local_size, &lo, &hi);
        if (lo != hi) {
            fprintf(stderr, "error: HYBRID_SHARD: the nodes hold %d to %d ranks; give --shard_group\n", lo, hi);
            return -1;
        }
        G = f->local_size;
    }
    if (G < 1 || W % G != 0) {
        fprintf(stderr, "error: --shard_group %d does not divide the world size %d\n", G, W);
        return -1;
    }
    // groups of G consecutive ranks (mpirun and torchrun place consecutive ranks on one node)
    fsdp_comm_split(&f->shard, &f->world, rank / G, rank);
    fsdp_comm_split(&f->replica, &f->world, rank % G, rank);
    return 0;
}

// ----------------------------------------------------------------------------
// which backend moves device buffers (the CUDA trainer's --collectives)

// The device backend for requested ("auto", "nccl" or "host"), with world
// ranks of which local run on this rank's node, which has devices GPUs (each
// rank takes GPU local rank % devices); have_nccl: built with NCCL. NCCL
// refuses two ranks on one device, so auto is NCCL when every rank of the node
// has its own GPU and NCCL is built in, else staged (through host memory);
// nccl where NCCL cannot run is refused. FSDP_BACKEND_NCCL or
// FSDP_BACKEND_STAGED; -1 with the reason in err (n bytes). One rank has no
// collectives: nothing is refused then.
static inline int fsdp_device_backend(const char *requested, int world, int local, int devices, int have_nccl,
                                      char *err, size_t n) {
    int nccl_runs = have_nccl && local <= devices;
    if (!strcmp(requested, "host")) return FSDP_BACKEND_STAGED;
    if (!strcmp(requested, "auto")) return nccl_runs ? FSDP_BACKEND_NCCL : FSDP_BACKEND_STAGED;
    if (strcmp(requested, "nccl")) {
        snprintf(err, n, "--collectives: '%s' is not one of auto, nccl, host", requested);
        return -1;
    }
    if (world == 1 || nccl_runs) return FSDP_BACKEND_NCCL;
    if (!have_nccl)
        snprintf(err, n, "--collectives nccl: this program was built without NCCL (no nccl.h when it was built), so its %d "
                 "ranks need --collectives host (or install NCCL and rebuild)", world);
    else
        snprintf(err, n, "--collectives nccl: this node runs %d ranks on %d GPU(s), and NCCL refuses two ranks on one "
                 "device: use --collectives host (or at most one rank per GPU)", local, devices);
    return -1;
}

// Context parallelism (docs/long_context.md): groups of P consecutive ranks hold different
// positions of the same rows, so the world is W / P data-parallel groups of P; the shard and
// replica groups are unchanged (parameters are sharded over both dimensions, gradients summed
// over both). Collective over the world. 0 ok; -1 with a message on every rank.
static inline int fsdp_context_init(Fsdp *f, int P) {
    if (P < 1 || f->world.size % P != 0) {
        fprintf(stderr, "error: --context_parallel %d does not divide the world size %d (the ranks that mpirun -np, srun, "
                "torchrun or dev/launch.sh started)\n", P, f->world.size);
        return -1;
    }
    fsdp_comm_split(&f->context, &f->world, f->world.rank / P, f->world.rank);
    return 0;
}
// the context group's size P (1: none; f NULL: one process)
static inline int fsdp_context_size(const Fsdp *f) { return f && f->context.size > 1 ? f->context.size : 1; }
// the data-parallel group of this rank and their count: the dataloader's rank and world
static inline int fsdp_data_rank(const Fsdp *f) { return f->world.rank / (f->context.size ? f->context.size : 1); }
static inline int fsdp_data_size(const Fsdp *f) { return f->world.size / (f->context.size ? f->context.size : 1); }

static inline void fsdp_free(Fsdp *f) {
    fsdp_comm_free(&f->context);
    fsdp_comm_free(&f->replica);
    fsdp_comm_free(&f->shard);
    fsdp_comm_free(&f->world);
}

#ifdef FSDP_DEVICE
// ---- the device communicators (the CUDA trainer's): f's groups again, for device buffers

typedef struct {
    FsdpComm world, shard, replica; // NCCL or staged copies of f's groups (W > 1; fsdp_device_comm)
    FsdpComm context;               // and of the context group (--context_parallel)
} FsdpDeviceComms;

// Gives the world, shard and replica groups a device communicator each, on the
// collectives' stream (collective: every rank calls it, in this order): staged
// when any rank's backend (the trainer's set_device chose it: fsdp_device_backend)
// is that (auto can choose differently on nodes with other GPU counts; the ranks
// must agree), else NCCL. The trainer's communicators (f) stay as they are (MPI or
// TCP) for the host side, which the staged ones run their collectives over.
static inline void fsdp_device_comms_init(FsdpDeviceComms *d, Fsdp *f, int backend, cudaStream_t stream) {
    int staged = fsdp_any(&f->world, backend == FSDP_BACKEND_STAGED);
    FsdpComm *dev[4] = {&d->world, &d->shard, &d->replica, &d->context};
    const FsdpComm *host[4] = {&f->world, &f->shard, &f->replica, &f->context};
    for (int i = 0; i < (fsdp_context_size(f) > 1 ? 4 : 3); i++) {
        *dev[i] = *host[i];
        dev[i]->scratch = NULL, dev[i]->scratch_bytes = 0; // the host communicator's own
        if (staged) fsdp_staged_init(dev[i], stream);
#ifdef FSDP_NCCL
        else fsdp_nccl_init(dev[i], stream);
#endif
    }
}
static inline void fsdp_device_comms_free(FsdpDeviceComms *d) { // (before the collectives' stream is destroyed)
    FsdpComm *dev[4] = {&d->world, &d->shard, &d->replica, &d->context};
    for (int i = 0; i < 4; i++) {
        fsdp_device_free(dev[i]); // the host side is the trainer's
        free(dev[i]->scratch);
    }
}

// c, one of d's communicators, made at the first device collective (fsdp_device_comms_init
// with f, backend and stream): every rank reaches that in step, after the trainer agreed
// that every rank's load went well (the model's allocation is too early: a rank whose load
// failed never calls it)
static inline FsdpComm *fsdp_device_comm(FsdpDeviceComms *d, Fsdp *f, int backend, cudaStream_t stream, FsdpComm *c) {
    if (d->world.backend != FSDP_BACKEND_NCCL && d->world.backend != FSDP_BACKEND_STAGED)
        fsdp_device_comms_init(d, f, backend, stream);
    return c;
}
#endif

// A unit's parameters, whole: with a shard group of one (NO_SHARD) the shard is
// the unit; else gathered into buf (shard.size * unit.shard floats).
static inline float *fsdp_gather(Fsdp *f, const FsdpUnit *u, float *shards, float *buf) {
    if (f->shard.size == 1) return shards + u->shard_offset;
    fsdp_all_gather(&f->shard, buf, shards + u->shard_offset, u->shard);
    return buf;
}

// A packed unit's bytes, whole (never trained, so never reduced): the shard itself with a
// shard group of one, else gathered into buf (shard.size * unit.packed_shard bytes)
static inline uint8_t *fsdp_gather_packed(Fsdp *f, const FsdpUnit *u, uint8_t *shards, uint8_t *buf) {
    if (f->shard.size == 1) return shards + u->packed_offset;
    fsdp_all_gather_u8(&f->shard, buf, shards + u->packed_offset, u->packed_shard);
    return buf;
}

// A unit's gradients summed over every rank into this rank's shard of them:
// reduce-scatter in the shard group, then all-reduce across the groups. grad
// holds the unit's gradient (shard.size * unit.shard floats, the padding zero);
// grad_shards is the rank's flat shard buffer of gradients.
static inline void fsdp_reduce_grads(Fsdp *f, const FsdpUnit *u, float *grad_shards, const float *grad) {
    float *mine = grad_shards + u->shard_offset;
    fsdp_reduce_scatter(&f->shard, mine, grad, u->shard);
    fsdp_all_reduce(&f->replica, mine, u->shard, FSDP_F32);
}

// ----------------------------------------------------------------------------
// rank-local loading of a Hugging Face checkpoint

// Checks that sm holds every tensor of u with its shape and a float dtype (F32,
// BF16, F16), and nothing that contradicts the units (layers beyond them, a
// tied model's lm_head of another shape). Reads no data: call it before
// allocating what fsdp_load_model fills. 0 ok, -1 with a message.
static inline int fsdp_check_model(const FsdpUnits *u, const Weights *sm) {
    for (int i = 0; i < u->n_units; i++)
        for (int j = 0; j < u->units[i].n_tensors; j++) {
            const FsdpTensor *t = &u->units[i].tensors[j];
            const WeightsEntry *e = weights_find(sm, t->name);
            const StTensor *st = e ? e->tensor : NULL;
            if (!st) {
                fprintf(stderr, "error: %s: tensor '%s' is missing from the checkpoint%s\n", sm->dir, t->name,
                        strcmp(t->name, "lm_head.weight") == 0 ? " (config.json says tie_word_embeddings is false)" : "");
                return -1;
            }
            if (st->ndim != t->ndim || st->shape[0] != t->shape[0] || (t->ndim == 2 && st->shape[1] != t->shape[1])) {
                char got[128], want[128];
                st_format_shape(st->shape, st->ndim, got, sizeof got);
                st_format_shape(t->shape, t->ndim, want, sizeof want);
                fprintf(stderr, "error: %s: tensor '%s' has shape %s but config.json implies %s\n", weights_path(sm, e), t->name, got, want);
                return -1;
            }
            if (st->dtype != ST_F32 && st->dtype != ST_BF16 && st->dtype != ST_F16) {
                fprintf(stderr, "error: %s: tensor '%s' has dtype %s; only F32, BF16 and F16 weights are supported\n",
                        weights_path(sm, e), t->name, st_dtype_name(st->dtype));
                return -1;
            }
        }
    for (int i = 0; i < sm->n_entries; i++) {
        int layer;
        if (sscanf(sm->entries[i].name, "model.layers.%d.", &layer) == 1 && (layer < 0 || layer >= u->n_layers)) {
            fprintf(stderr, "error: %s: checkpoint has tensor '%s' but config.json says num_hidden_layers = %d\n", sm->dir,
                    sm->entries[i].name, u->n_layers);
            return -1;
        }
    }
    const WeightsEntry *head = u->tied ? weights_find(sm, "lm_head.weight") : NULL;
    const FsdpTensor *embed = &u->units[0].tensors[0];
    const StTensor *h = head ? head->tensor : NULL;
    if (h && (h->ndim != 2 || h->shape[0] != embed->shape[0] || h->shape[1] != embed->shape[1])) {
        fprintf(stderr, "error: %s: tensor 'lm_head.weight' has another shape than model.embed_tokens.weight but config.json "
                "says tie_word_embeddings is true\n", weights_path(sm, head));
        return -1;
    }
    return 0;
}

// A tied model's stored lm_head, if there is one, must equal the embedding (else
// the run would silently train another model): elements [begin, begin + count)
// of it against those of the embedding, embed. 0 ok, -1 with a message.
static inline int fsdp_check_tied_head(Weights *sm, size_t begin, size_t count, const float *embed) {
    const WeightsEntry *head = weights_find(sm, "lm_head.weight"); // its shape: fsdp_check_model
    if (!head || !count) return 0;
    float *mine = (float *)mallocCheck(count * sizeof(float));
    int rc = weights_read_f32(sm, head, begin, count, mine);
    if (rc == 0 && memcmp(mine, embed, count * sizeof(float)) != 0) {
        fprintf(stderr, "error: %s: tensor 'lm_head.weight' differs from model.embed_tokens.weight but config.json "
                "says tie_word_embeddings is true\n", weights_path(sm, head));
        rc = -1;
    }
    free(mine);
    return rc;
}

// Fills shard `rank` of every unit but the packed ones (u->n_shards shards) into out (u->shard_numel
// floats, padding zeroed) piece by piece, a piece being the part of one tensor
// inside the shard: read(ctx, unit, tensor, first, count, dst) reads elements
// [first, first + count) of tensor `tensor` of unit `unit` into dst, wherever the
// caller keeps it. 0 ok, -1 when a read failed (it has said why).
typedef int (*FsdpReadFn)(void *ctx, int unit, int tensor, size_t first, size_t count, float *dst);
// the part of tensor j of unit i in shard `rank`: its elements [*first, *first + count) (count
// returned, may be 0), which lie at *at of the rank's flat shard buffer
static inline size_t fsdp_tensor_shard(const FsdpUnits *u, int i, int j, int rank, size_t *first, size_t *at) {
    const FsdpUnit *un = &u->units[i];
    const FsdpTensor *t = &un->tensors[j];
    size_t begin, count = fsdp_shard_range(un->numel, u->n_shards, u->align, rank, &begin);
    size_t lo, n = range_overlap(begin, count, t->offset, t->numel, &lo);
    *first = n ? lo - t->offset : 0;
    *at = un->shard_offset + (n ? lo - begin : 0);
    return n;
}
static inline int fsdp_read_shard(const FsdpUnits *u, int rank, float *out, FsdpReadFn read, void *ctx) {
    for (int i = 0; i < u->n_units; i++) {
        const FsdpUnit *un = &u->units[i];
        if (un->packed) continue; // its model fills its bytes
        memset(out + un->shard_offset, 0, un->shard * sizeof(float));
        for (int j = 0; j < un->n_tensors; j++) {
            size_t first, at, n = fsdp_tensor_shard(u, i, j, rank, &first, &at);
            if (n && read(ctx, i, j, first, n, out + at) != 0) return -1;
        }
    }
    return 0;
}

// an FsdpReadFn reading a checkpoint folder's tensors (each present: fsdp_check_model said so)
typedef struct { const FsdpUnits *u; Weights *sm; } FsdpCheckpoint;
static inline int fsdp_read_checkpoint(void *ctx, int unit, int tensor, size_t first, size_t count, float *dst) {
    const FsdpCheckpoint *c = (const FsdpCheckpoint *)ctx;
    return weights_read_f32(c->sm, weights_find(c->sm, c->u->units[unit].tensors[tensor].name), first, count, dst);
}

// Reads shard `rank` of every unit (u->n_shards shards) into out (u->shard_numel
// floats, padding zeroed), converting BF16 and F16 exactly to float. Only the
// bytes of those elements are read (weights_read_f32 reads exactly the elements
// asked for), so a rank holds 1/n of the model. A tied model's stored lm_head must
// equal the embedding (each rank checks its own range). 0 ok, -1 with a message.
static inline int fsdp_load_model(const FsdpUnits *u, Weights *sm, int rank, float *out) {
    if (fsdp_check_model(u, sm) != 0) return -1;
    FsdpCheckpoint c = {u, sm};
    if (fsdp_read_shard(u, rank, out, fsdp_read_checkpoint, &c) != 0) return -1;
    if (!u->tied) return 0;
    size_t begin, count = fsdp_shard_range(u->units[0].numel, u->n_shards, u->align, rank, &begin);
    return fsdp_check_tied_head(sm, begin, count, out + u->units[0].shard_offset);
}

// ----------------------------------------------------------------------------
// sharded checkpoints
//
// A checkpoint folder holds one file per shard, fsdp-<k>-of-<n>.safetensors,
// with a tensor "<buffer>/<unit>" (F32, the padded shard) for each buffer (the
// parameters, the AdamW moments, ...) and unit, and fsdp_index.json, written
// last by rank 0: the format, the shard count, the model fingerprint, the
// buffers, and every unit with its numel and its tensors' names and shapes. Each
// shard file repeats the fingerprint and its place, and holds a checksum of every
// block of FSDP_CKPT_BLOCK elements of every tensor, so corrupt data is refused.
// Loading at another shard count reads, from whichever files hold them, just
// the blocks that cover this rank's elements. Each file is written atomically;
// the trainer makes the whole folder atomic with checkpoint.h (build in .tmp,
// fsync, rename).

#define FSDP_CKPT_FORMAT "llama2.tune-fsdp"
#define FSDP_CKPT_VERSION 1
#define FSDP_INDEX_NAME "fsdp_index.json"
#define FSDP_CKPT_BLOCK ((size_t)1 << 20) // elements per checksum (4 MiB): what a reader reads beyond its range at most twice per tensor
#define FSDP_MAX_SHARDS FSDP_MAX_RANKS

// one of a rank's flat shard buffers: {"params", p}, {"exp_avg", m}, ... data holds the
// shards of units first .. n_units - 1 (first > 0: the units before it are frozen and have
// no such buffer), unit i at units[i].shard_offset - units[first].shard_offset. A buffer
// that is not in host memory (the CUDA trainer's optimizer state) has data NULL and is
// saved through fill(ctx, first, count, dst), elements of that same flat layout. A buffer
// with a part function holds a part of each unit's elements (AdamW8bit's codes: those of
// its 8-bit tensors): part(part_ctx, i, x) counts the part's elements before element x of
// unit i (never decreasing in x); a rank's piece of the unit is the part of its shard's
// real elements, without padding, its units' pieces one after another in data. A buffer with
// data NULL is loaded through put(ctx, first, count, src), elements of the same flat layout, a
// piece of at most FSDP_CKPT_BLOCK at a time, into a destination that starts zeroed (the
// padding is never put).
typedef size_t (*FsdpPartFn)(void *ctx, int unit, size_t x);
typedef void (*FsdpPutFn)(void *ctx, size_t first, size_t count, const void *src);
typedef struct {
    const char *name;
    void *data;
    int first;
    StFillFn fill;
    void *ctx;
    StDtype dtype;       // F32, or U8
    FsdpPartFn part;     // NULL: the weights' layout
    void *part_ctx;
    FsdpPutFn put;       // (data NULL: how it loads)
} FsdpBuffer;

// rank r's piece of unit i of buffer b, the unit sharded n ways (align as fsdp_shard_size's):
// [*begin, *begin + count) of the unit's elements (or of its part), count returned;
// *stored: the elements its shard file holds from *begin on (the padded shard, or count)
static inline size_t fsdp__piece(const FsdpUnits *u, const FsdpBuffer *b, int i, int n, size_t align, int r, size_t *begin,
                                 size_t *stored) {
    size_t lo, count = fsdp_shard_range(u->units[i].numel, n, align, r, &lo);
    if (!b->part) {
        *begin = lo;
        *stored = fsdp_shard_size(u->units[i].numel, n, align);
        return count;
    }
    *begin = b->part(b->part_ctx, i, lo);
    return *stored = b->part(b->part_ctx, i, lo + count) - *begin;
}
// where unit i's piece starts in rank r's buffer b, in elements (i = n_units: the buffer's size)
static inline size_t fsdp__unit_start(const FsdpUnits *u, const FsdpBuffer *b, int i, int r) {
    if (!b->part) return (i < u->n_units ? u->units[i].shard_offset : u->shard_numel) - u->units[b->first].shard_offset;
    size_t at = 0, begin, stored;
    for (int k = b->first; k < i; k++) at += fsdp__piece(u, b, k, u->n_shards, u->align, r, &begin, &stored);
    return at;
}
static inline void *fsdp__buffer_unit(const FsdpUnits *u, const FsdpBuffer *b, int i, int r) {
    return (char *)b->data + fsdp__unit_start(u, b, i, r) * (size_t)st_dtype_size(b->dtype);
}
// a unit's shard of a buffer saved through its fill: the buffer and where the unit starts in it
typedef struct { const FsdpBuffer *b; size_t start; } FsdpUnitFill;
static inline int fsdp__unit_fill(void *ctx, size_t first, size_t count, void *dst) {
    const FsdpUnitFill *uf = (const FsdpUnitFill *)ctx;
    return uf->b->fill(uf->b->ctx, uf->start + first, count, dst);
}

// dir/name, or dir/fsdp-<k>-of-<shards>.safetensors when name is NULL; -1 with a message if too long
#define FSDP_PATH_MAX 4096
static inline int fsdp__path(char out[FSDP_PATH_MAX], const char *dir, const char *name, int k, int shards) {
    char file[64];
    if (!name) snprintf(file, sizeof file, "fsdp-%05d-of-%05d.safetensors", k, shards);
    if (snprintf(out, FSDP_PATH_MAX, "%s/%s", dir, name ? name : file) < FSDP_PATH_MAX) return 0;
    fprintf(stderr, "error: %s: path too long\n", dir);
    return -1;
}

// the checksums of the blocks of a unit's shard (n elements of es bytes: x, or with x NULL
// through uf, a block at a time: the file's header holds them, so such a buffer is read
// twice), as 16 hex digits each, comma-separated (malloc'd); NULL when uf's fill failed
// (with its message)
static inline char *fsdp__checksums(const void *x, FsdpUnitFill *uf, size_t n, size_t es) {
    size_t blocks = (n + FSDP_CKPT_BLOCK - 1) / FSDP_CKPT_BLOCK;
    char *s = (char *)callocCheck(blocks ? blocks * 17 : 1, 1);
    char *block = x ? NULL : (char *)mallocCheck(FSDP_CKPT_BLOCK * es);
    for (size_t b = 0; b < blocks; b++) {
        size_t lo = b * FSDP_CKPT_BLOCK, k = n - lo < FSDP_CKPT_BLOCK ? n - lo : FSDP_CKPT_BLOCK;
        if (block && fsdp__unit_fill(uf, lo, k, block) != 0) { free(block); free(s); return NULL; }
        const char *at = block ? block : (const char *)x + lo * es;
        snprintf(s + b * 17, 18, b + 1 < blocks ? "%016llx," : "%016llx", (unsigned long long)data_hash_bytes(0, at, k * es));
    }
    free(block);
    return s;
}

// Writes shard `rank` of the buffers: dir/fsdp-<rank>-of-<n>.safetensors (atomically).
// 0 ok, -1 with a message.
static inline int fsdp_save_shard(const char *dir, const FsdpUnits *u, const FsdpBuffer *bufs, int nb, int rank, const char *fingerprint) {
    int nt = 0;
    for (int b = 0; b < nb; b++) nt += u->n_units - bufs[b].first;
    StWriteTensor *ts = (StWriteTensor *)callocCheck((size_t)nt, sizeof(StWriteTensor));
    FsdpUnitFill *fills = (FsdpUnitFill *)callocCheck((size_t)nt, sizeof(FsdpUnitFill));
    char (*names)[FSDP_NAME_MAX] = (char (*)[FSDP_NAME_MAX])callocCheck((size_t)nt, FSDP_NAME_MAX);
    const char **meta = (const char **)callocCheck(2 * ((size_t)nt + 4), sizeof(char *));
    char shard[16], shards[16];
    snprintf(shard, sizeof shard, "%d", rank);
    snprintf(shards, sizeof shards, "%d", u->n_shards);
    const char *fixed[8] = {"format", FSDP_CKPT_FORMAT, "fingerprint", fingerprint, "shard", shard, "shards", shards};
    memcpy(meta, fixed, sizeof fixed);
    int rc = 0;
    for (int b = 0, k = 0; b < nb; b++)
        for (int i = bufs[b].first; i < u->n_units; i++, k++) {
            size_t begin, stored;
            fsdp__piece(u, &bufs[b], i, u->n_shards, u->align, rank, &begin, &stored);
            const void *data = bufs[b].data ? fsdp__buffer_unit(u, &bufs[b], i, rank) : NULL;
            fills[k] = (FsdpUnitFill){&bufs[b], fsdp__unit_start(u, &bufs[b], i, rank)};
            snprintf(names[k], FSDP_NAME_MAX, "%s/%s", bufs[b].name, u->units[i].name);
            ts[k].name = names[k];
            ts[k].dtype = bufs[b].dtype;
            ts[k].ndim = 1;
            ts[k].shape[0] = (int64_t)stored;
            ts[k].data = data;
            if (!data) ts[k].fill = fsdp__unit_fill, ts[k].ctx = &fills[k];
            meta[8 + 2 * k] = names[k]; // the checksums are stored under the tensor's name
            if (rc == 0 && !(meta[8 + 2 * k + 1] = fsdp__checksums(data, &fills[k], stored, (size_t)st_dtype_size(bufs[b].dtype)))) rc = -1;
        }
    char path[FSDP_PATH_MAX];
    if (rc == 0) rc = fsdp__path(path, dir, NULL, rank, u->n_shards) || st_write(path, ts, nt, meta, nt + 4) ? -1 : 0;
    for (int k = 0; k < nt; k++) free((void *)meta[8 + 2 * k + 1]);
    free(meta);
    free(names);
    free(fills);
    free(ts);
    return rc;
}

// Writes dir/fsdp_index.json (atomically): what the shards hold. 0 ok, -1 with a message.
static inline int fsdp_save_index(const char *dir, const FsdpUnits *u, const FsdpBuffer *bufs, int nb, const char *fingerprint) {
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) { fprintf(stderr, "error: out of memory writing %s/%s\n", dir, FSDP_INDEX_NAME); return -1; }
    // every name written here is one of ours (units, HF tensor names, buffer names): plain ASCII
    fprintf(m, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"fingerprint\": \"%s\",\n  \"shards\": %d,\n"
            "  \"align\": %zu,\n  \"dtype\": \"F32\",\n  \"buffers\": [", FSDP_CKPT_FORMAT, FSDP_CKPT_VERSION, fingerprint,
            u->n_shards, u->align);
    for (int b = 0; b < nb; b++) fprintf(m, "%s\"%s\"", b ? ", " : "", bufs[b].name);
    fprintf(m, "],\n  \"units\": [\n");
    for (int i = 0; i < u->n_units; i++) {
        const FsdpUnit *un = &u->units[i];
        fprintf(m, "    {\"name\": \"%s\", \"numel\": %zu, \"shard_numel\": %zu, \"tensors\": [", un->name, un->numel, un->shard);
        for (int j = 0; j < un->n_tensors; j++) {
            const FsdpTensor *t = &un->tensors[j];
            fprintf(m, "%s{\"name\": \"%s\", \"shape\": [%lld", j ? ", " : "", t->name, (long long)t->shape[0]);
            if (t->ndim == 2) fprintf(m, ", %lld", (long long)t->shape[1]);
            fprintf(m, "]}");
        }
        fprintf(m, "]}%s\n", i + 1 < u->n_units ? "," : "");
    }
    fprintf(m, "  ]\n}\n");
    fclose(m);
    char path[FSDP_PATH_MAX];
    int rc = fsdp__path(path, dir, FSDP_INDEX_NAME, 0, 0) || write_bytes_atomic(path, text, len) ? -1 : 0;
    free(text);
    return rc;
}

// Collective: the ranks of the first group write their shards (one copy of
// each), then rank 0 the index, once every shard is written. dir must exist
// (and be seen by every rank). 0 ok; -1 on every rank if any write failed.
static inline int fsdp_save(Fsdp *f, const char *dir, const FsdpUnits *u, const FsdpBuffer *bufs, int nb, const char *fingerprint) {
    if (u->n_shards != f->shard.size) fsdp_abort(&f->world, "fsdp_save: units sharded %d ways, shard group of %d", u->n_shards, f->shard.size);
    int rc = f->replica.rank == 0 ? fsdp_save_shard(dir, u, bufs, nb, f->shard.rank, fingerprint) : 0;
    if (fsdp_any(&f->world, rc != 0)) return -1;
    rc = f->world.rank == 0 ? fsdp_save_index(dir, u, bufs, nb, fingerprint) : 0;
    return fsdp_any(&f->world, rc != 0) ? -1 : 0;
}

// the index's checks: format, version, fingerprint, units, buffers -> *shards, *align (the
// shards' alignment: 1 when the index does not say)
static inline int fsdp__check_index(const char *path, const JsonValue *ix, const FsdpUnits *u, const FsdpBuffer *bufs, int nb,
                             const char *fingerprint, int *shards, size_t *align) {
    const char *s;
    long long v;
    if (ix->type != JSON_OBJECT || json_get_string(ix, "format", &s, NULL) != 0 || strcmp(s, FSDP_CKPT_FORMAT) != 0) {
        fprintf(stderr, "error: %s: not a sharded checkpoint index (\"format\" is not \"%s\")\n", path, FSDP_CKPT_FORMAT);
        return -1;
    }
    if (json_get_int(ix, "version", &v) != 0 || v != FSDP_CKPT_VERSION) {
        fprintf(stderr, "error: %s: unsupported \"version\" (this program reads version %d)\n", path, FSDP_CKPT_VERSION);
        return -1;
    }
    if (json_get_string(ix, "fingerprint", &s, NULL) != 0 || strcmp(s, fingerprint) != 0) {
        fprintf(stderr, "error: %s: the checkpoint is of another model (fingerprint %s, this model's is %s)\n", path,
                json_get_string(ix, "fingerprint", &s, NULL) == 0 ? s : "missing", fingerprint);
        return -1;
    }
    if (json_get_int(ix, "shards", &v) != 0 || v < 1 || v > FSDP_MAX_SHARDS) {
        fprintf(stderr, "error: %s: \"shards\" must be an integer in [1, %d]\n", path, FSDP_MAX_SHARDS);
        return -1;
    }
    *shards = (int)v;
    if (json_get(ix, "align") && (json_get_int(ix, "align", &v) != 0 || v < 1 || v > (1 << 20))) {
        fprintf(stderr, "error: %s: \"align\" must be an integer in [1, %d]\n", path, 1 << 20);
        return -1;
    }
    *align = json_get(ix, "align") ? (size_t)v : 1;
    const JsonValue *units = json_get(ix, "units"), *b = json_get(ix, "buffers");
    if (!units || units->type != JSON_ARRAY || units->count != u->n_units) {
        fprintf(stderr, "error: %s: \"units\" must list the model's %d units\n", path, u->n_units);
        return -1;
    }
    for (int i = 0; i < u->n_units; i++) {
        long long numel, shard;
        if (json_get_string(&units->items[i], "name", &s, NULL) != 0 || strcmp(s, u->units[i].name) != 0 ||
            json_get_int(&units->items[i], "numel", &numel) != 0 || numel != (long long)u->units[i].numel ||
            json_get_int(&units->items[i], "shard_numel", &shard) != 0 ||
            shard != (long long)fsdp_shard_size(u->units[i].numel, *shards, *align)) {
            fprintf(stderr, "error: %s: unit %d is not the model's unit '%s' of %zu elements in %d shards\n", path, i,
                    u->units[i].name, u->units[i].numel, *shards);
            return -1;
        }
    }
    for (int k = 0; k < nb; k++) {
        int found = 0;
        for (int i = 0; b && b->type == JSON_ARRAY && i < b->count; i++)
            found |= b->items[i].type == JSON_STRING && strcmp(b->items[i].string, bufs[k].name) == 0;
        if (!found) { fprintf(stderr, "error: %s: the checkpoint has no buffer \"%s\"\n", path, bufs[k].name); return -1; }
    }
    return 0;
}

// opens shard k of n and checks that it belongs to this checkpoint
static inline int fsdp__open_shard(StFile *sf, const char *dir, int k, int n, const char *fingerprint) {
    char path[FSDP_PATH_MAX], want[16];
    if (fsdp__path(path, dir, NULL, k, n) != 0 || st_open(sf, path) != 0) return -1;
    const char *s;
    int ok = json_get_string(&sf->metadata, "format", &s, NULL) == 0 && strcmp(s, FSDP_CKPT_FORMAT) == 0;
    ok = ok && json_get_string(&sf->metadata, "fingerprint", &s, NULL) == 0 && strcmp(s, fingerprint) == 0;
    snprintf(want, sizeof want, "%d", k);
    ok = ok && json_get_string(&sf->metadata, "shard", &s, NULL) == 0 && strcmp(s, want) == 0;
    snprintf(want, sizeof want, "%d", n);
    ok = ok && json_get_string(&sf->metadata, "shards", &s, NULL) == 0 && strcmp(s, want) == 0;
    if (!ok) {
        fprintf(stderr, "error: %s: not shard %d of %d of this checkpoint (its metadata say otherwise)\n", path, k, n);
        st_close(sf);
        return -1;
    }
    return 0;
}

// Reads elements [first, first + count) of the tensor `name` (S elements of dtype) of
// shard file sf into out, verifying the checksum of every block it touches; or with out
// NULL, a block's overlap at a time through into's put, element `at` of the buffer's layout
// being the range's first.
static inline int fsdp__read_verified(StFile *sf, const char *name, StDtype dtype, size_t S, size_t first, size_t count, void *out,
                                      void *block, const FsdpBuffer *into, size_t at) {
    const StTensor *t = st_find(sf, name);
    const char *sums;
    size_t len, blocks = (S + FSDP_CKPT_BLOCK - 1) / FSDP_CKPT_BLOCK, es = (size_t)st_dtype_size(dtype);
    if (!t || t->dtype != dtype || t->ndim != 1 || (size_t)t->shape[0] != S) {
        fprintf(stderr, "error: %s: no %s tensor '%s' of %zu elements\n", sf->path, st_dtype_name(dtype), name, S);
        return -1;
    }
    if (json_get_string(&sf->metadata, name, &sums, &len) != 0 || len != (blocks ? blocks * 17 - 1 : 0)) {
        fprintf(stderr, "error: %s: tensor '%s' has no valid checksums in the metadata\n", sf->path, name);
        return -1;
    }
    for (size_t b = first / FSDP_CKPT_BLOCK; b < blocks && b * FSDP_CKPT_BLOCK < first + count; b++) {
        size_t lo = b * FSDP_CKPT_BLOCK, k = S - lo < FSDP_CKPT_BLOCK ? S - lo : FSDP_CKPT_BLOCK;
        if (st_read_stored(sf, t, dtype, lo, k, block) != 0) return -1;
        char got[17];
        snprintf(got, sizeof got, "%016llx", (unsigned long long)data_hash_bytes(0, block, k * es));
        if (memcmp(got, sums + b * 17, 16) != 0) {
            fprintf(stderr, "error: %s: tensor '%s': elements [%zu, %zu) do not match their checksum (corrupt file)\n",
                    sf->path, name, lo, lo + k);
            return -1;
        }
        size_t a, na = range_overlap(first, count, lo, k, &a);
        if (out) memcpy((char *)out + (a - first) * es, (char *)block + (a - lo) * es, na * es);
        else into->put(into->ctx, at + (a - first), na, (char *)block + (a - lo) * es);
    }
    return 0;
}

// Reads shard `rank` (of u->n_shards) of each buffer from the checkpoint in dir,
// whatever shard count it was saved with, into bufs[i].data (padding zeroed), or where
// that is NULL through bufs[i].put.
// Refuses another model's checkpoint, a missing buffer, and a missing,
// truncated or corrupt shard file. Local: no collectives. 0 ok, -1 with a message.
static inline int fsdp_load(const char *dir, const FsdpUnits *u, FsdpBuffer *bufs, int nb, int rank, const char *fingerprint) {
    char path[FSDP_PATH_MAX];
    JsonValue ix;
    int shards = 0, rc = -1;
    size_t align = 1; // the saved shards'
    if (fsdp__path(path, dir, FSDP_INDEX_NAME, 0, 0) != 0) return -1;
    if (access(path, F_OK) != 0) {
        fprintf(stderr, "error: %s: no %s: not a sharded checkpoint, or an incomplete one\n", dir, FSDP_INDEX_NAME);
        return -1;
    }
    if (json_load_file(path, &ix) != 0) return -1;
    StFile *files = NULL; // the old shard files this rank needs, opened when first needed
    float *block = NULL;  // (room for a block of any dtype)
    if (fsdp__check_index(path, &ix, u, bufs, nb, fingerprint, &shards, &align) != 0) goto done;
    files = (StFile *)callocCheck((size_t)shards, sizeof(StFile));
    block = (float *)mallocCheck(FSDP_CKPT_BLOCK * sizeof(float));
    for (int b = 0; b < nb; b++)
        for (int i = bufs[b].first; i < u->n_units; i++) {
            size_t es = (size_t)st_dtype_size(bufs[b].dtype), begin, own;
            size_t count = fsdp__piece(u, &bufs[b], i, u->n_shards, u->align, rank, &begin, &own);
            size_t at = fsdp__unit_start(u, &bufs[b], i, rank);
            char *dst = bufs[b].data ? (char *)bufs[b].data + at * es : NULL;
            if (dst) memset(dst, 0, own * es);
            char name[FSDP_NAME_MAX];
            snprintf(name, sizeof name, "%s/%s", bufs[b].name, u->units[i].name);
            for (int k = 0; count && k < shards; k++) { // the saved shards that hold some of it
                size_t kb, S, kc = fsdp__piece(u, &bufs[b], i, shards, align, k, &kb, &S);
                size_t lo, n = range_overlap(begin, count, kb, kc, &lo);
                if (!n) continue;
                if (!files[k].path && fsdp__open_shard(&files[k], dir, k, shards, fingerprint) != 0) goto done;
                if (fsdp__read_verified(&files[k], name, bufs[b].dtype, S, lo - kb, n, dst ? dst + (lo - begin) * es : NULL, block,
                                        &bufs[b], at + (lo - begin)) != 0) goto done;
            }
        }
    rc = 0;
done:
    for (int k = 0; files && k < shards; k++) st_close(&files[k]);
    free(files);
    free(block);
    json_free(&ix);
    return rc;
}
#endif // FSDP_H
