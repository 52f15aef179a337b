// fsdp.h: sharded parameters, the collectives that move them, rank-local
// loading and sharded checkpoints (DESIGN section 5). C99 + POSIX, and C++ for
// the CUDA trainer. Build with -DUSE_MPI (mpicc) for several processes, and
// with -DFSDP_NCCL (nvcc, -lnccl) for the GPU backend; without either it is a
// world of one process and every collective is a copy. An MPI build started
// without a launcher (no mpirun or srun) is a world of one too, and never
// calls MPI: it runs where MPI is not set up.
//
// Units. A Llama model is cut into units: the embedding, one per decoder layer,
// and the head (the final norm and lm_head; with tied embeddings only the norm,
// and the output projection uses the embedding unit again). A unit's tensors
// lie one after another in a flat buffer, in a fixed order. With n shards, the
// rank of index r owns elements [r*S, (r+1)*S) of a unit, S = ceil(numel / n):
// the last shards are zero-padded, so any n works. A rank's shards of all units
// lie one after another in one flat buffer of units.shard_numel floats (unit u
// at units[u].shard_offset), which is what the optimizer, the gradient norm
// and the checkpoints work on.
//
// Collectives (FsdpComm): all-gather, reduce-scatter, all-reduce, broadcast,
// barrier, "any" (do all ranks agree nothing failed) and abort, with one
// backend per build: a single process, MPI (the CPU twin, host buffers) or
// NCCL (device buffers, enqueued on the communicator's stream). Sums are in
// fp32 (or fp64 where asked). Order, MPI backend: every element is summed in
// rank order, ((x_0 + x_1) + x_2) + ..., whatever algorithm MPI would pick,
// so a result is the same on every rank and in every run; it differs from a
// single process only by where fp32 rounding falls. NCCL's order is its own
// (ring or tree): deterministic for a fixed NCCL version, topology and
// NCCL_ALGO, and the same on every rank.
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
// ends every rank (MPI_Abort), so no rank waits forever in a collective. MPI's
// own errors are fatal by MPI's default error handler (it prints and aborts).
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
//   data      dataloader_init(&dl, &ds, shuffle, seed, f.world.rank, f.world.size)
//   stop      fsdp_any(&f.world, stop_requested) at each step, so all ranks stop together
//   save      rank 0 checkpoint_begin; fsdp_save into its .tmp with {"params", p},
//             {"exp_avg", m}, {"exp_avg_sq", v}; rank 0 checkpoint_commit;
//             fsdp_any on each step's failure. Resume: fsdp_load at any world size
#ifndef FSDP_H
#define FSDP_H
#include "safetensors.h" // first: it sets the POSIX feature macros
#include <limits.h>
#include <stdint.h>
#include "json.h"
#include "utils.h"
#ifdef USE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only, also in C++
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif
#ifdef FSDP_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

// ----------------------------------------------------------------------------
// shard arithmetic

// S = ceil(numel / n): the elements of every rank's shard, padding included
static inline size_t fsdp_shard_size(size_t numel, int n) { return numel / (size_t)n + (numel % (size_t)n != 0); }

// the real (unpadded) elements of shard r of n: [*begin, *begin + count); count may be 0
static inline size_t fsdp_shard_range(size_t numel, int n, int r, size_t *begin) {
    size_t S = fsdp_shard_size(numel, n), b = (size_t)r * S;
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
    size_t shard;             // S = ceil(numel / n_shards): one rank's shard, padding included
    size_t shard_offset;      // where that shard starts in a rank's flat shard buffer
} FsdpUnit;

typedef struct {
    FsdpUnit *units;          // embed, layers.0 .. layers.<L-1>, head
    int n_units, n_layers;
    int tied;                 // no lm_head: the output projection uses the embedding unit
    int n_shards;             // what the shard sizes are for
    size_t numel;             // every parameter, once
    size_t shard_numel;       // one rank's flat shard buffer: every unit's shard, padding included
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

// the shard size and offset of every unit for n shards
static inline void fsdp_units_set_shards(FsdpUnits *u, int n) {
    u->n_shards = n;
    u->shard_numel = 0;
    for (int i = 0; i < u->n_units; i++) {
        u->units[i].shard = fsdp_shard_size(u->units[i].numel, n);
        u->units[i].shard_offset = u->shard_numel;
        u->shard_numel += u->units[i].shard;
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

typedef enum { FSDP_BACKEND_SINGLE, FSDP_BACKEND_MPI, FSDP_BACKEND_NCCL } FsdpBackend;
typedef enum { FSDP_F32, FSDP_F64 } FsdpDtype;
static inline size_t fsdp_dtype_size(FsdpDtype t) { return t == FSDP_F64 ? 8 : 4; }

typedef struct {
    FsdpBackend backend;
    int rank, size;           // this rank's index in the communicator, and its size
    int world_rank;           // for messages
    void *scratch;            // MPI: the ranks' contributions to a reduction (grown as needed)
    size_t scratch_bytes;
#ifdef USE_MPI
    MPI_Comm mpi;             // host side: every backend with more than one process has it
#endif
#ifdef FSDP_NCCL
    ncclComm_t nccl;          // the NCCL backend: device buffers, enqueued on stream
    cudaStream_t stream;
#endif
} FsdpComm;

#if defined(__GNUC__)
#define FSDP__ABORT_ATTRS __attribute__((noreturn, format(printf, 2, 3)))
#else
#define FSDP__ABORT_ATTRS
#endif

// Prints "error: rank R: <message>" and ends every rank of the job (MPI_Abort),
// so none is left waiting in a collective; in a single process, exit(1).
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
#define fsdp_cudaCheck(c, call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) \
    fsdp_abort((c), "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); } while (0)
#endif

// the NCCL backend's form of a collective: the NCCL call on the communicator's stream
#ifdef FSDP_NCCL
#define FSDP__NCCL(c, call) do { if ((c)->backend == FSDP_BACKEND_NCCL) { fsdp_ncclCheck((c), call); return; } } while (0)
#else
#define FSDP__NCCL(c, call) do { } while (0)
#endif

// 1 if an MPI launcher started this process: mpirun / mpiexec (OpenMPI, MPICH's
// Hydra) or srun (Slurm's PMI or PMIx), each of which sets one of these
static inline int fsdp_launched_by_mpi(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

// Every process's communicator: MPI_COMM_WORLD (MPI_Init here) when an MPI
// launcher started the process; else a world of one that never calls MPI.
// A communicator of one rank does every collective locally, MPI or not.
static inline void fsdp_world_init(FsdpComm *c) {
    memset(c, 0, sizeof *c);
    c->size = 1;
#ifdef USE_MPI
    c->mpi = MPI_COMM_NULL;
    int up;
    MPI_Initialized(&up);
    if (up || fsdp_launched_by_mpi()) {
        if (!up) MPI_Init(NULL, NULL);
        c->backend = FSDP_BACKEND_MPI;
        c->mpi = MPI_COMM_WORLD;
        MPI_Comm_rank(c->mpi, &c->rank);
        MPI_Comm_size(c->mpi, &c->size);
    }
#endif
    c->world_rank = c->rank;
}

// Splits c: ranks of the same color form a communicator, ordered by key.
static inline void fsdp_comm_split(FsdpComm *out, const FsdpComm *c, int color, int key) {
    memset(out, 0, sizeof *out);
    out->size = 1;
    out->world_rank = c->world_rank;
#ifdef USE_MPI
    out->mpi = MPI_COMM_NULL;
    if (c->backend != FSDP_BACKEND_SINGLE) {
        out->backend = FSDP_BACKEND_MPI;
        MPI_Comm_split(c->mpi, color, key, &out->mpi);
        MPI_Comm_rank(out->mpi, &out->rank);
        MPI_Comm_size(out->mpi, &out->size);
    }
#endif
    (void)color, (void)key;
}

static inline void fsdp_comm_free(FsdpComm *c) {
#ifdef FSDP_NCCL
    if (c->backend == FSDP_BACKEND_NCCL) ncclCommDestroy(c->nccl);
#endif
#ifdef USE_MPI
    if (c->backend != FSDP_BACKEND_SINGLE && c->mpi != MPI_COMM_WORLD && c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
#endif
    free(c->scratch);
    memset(c, 0, sizeof *c);
}

// ends MPI (call once, after every communicator is freed)
static inline void fsdp_world_finalize(void) {
#ifdef USE_MPI
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) MPI_Finalize();
#endif
}

#ifdef USE_MPI
static inline MPI_Datatype fsdp__mpi_type(FsdpDtype t) { return t == FSDP_F64 ? MPI_DOUBLE : MPI_FLOAT; }
// MPI counts are ints
static inline void fsdp__check_count(const FsdpComm *c, size_t n, const char *what) {
    if (n > (size_t)INT_MAX)
        fsdp_abort(c, "%s of %zu elements per rank is more than MPI can send at once (%d): use more ranks", what, n, INT_MAX);
}
static inline void *fsdp__scratch(FsdpComm *c, size_t bytes) {
    if (bytes > c->scratch_bytes) {
        c->scratch = reallocCheck(c->scratch, bytes);
        c->scratch_bytes = bytes;
    }
    return c->scratch;
}
#endif

// out[i] = ((in_0[i] + in_1[i]) + in_2[i]) + ..., in_r = in + r * S: rank order
static inline void fsdp__sum_blocks(void *out, const void *in, size_t S, int n, FsdpDtype t) {
    const float *xf = (const float *)in;
    const double *xd = (const double *)in;
#pragma omp parallel for if (S > 65536)
    for (size_t i = 0; i < S; i++) {
        if (t == FSDP_F64) {
            double acc = xd[i];
            for (int r = 1; r < n; r++) acc += xd[(size_t)r * S + i];
            ((double *)out)[i] = acc;
        } else {
            float acc = xf[i];
            for (int r = 1; r < n; r++) acc += xf[(size_t)r * S + i];
            ((float *)out)[i] = acc;
        }
    }
}

#ifdef USE_MPI
// out (S) = the sum over ranks of their in[rank * S .. (rank + 1) * S): each rank
// receives every rank's block of its shard (MPI_Alltoall), then sums them in rank order
static inline void fsdp__mpi_reduce_scatter(FsdpComm *c, void *out, const void *in, size_t S, FsdpDtype t) {
    fsdp__check_count(c, S, "reduce-scatter");
    void *recv = fsdp__scratch(c, (size_t)c->size * S * fsdp_dtype_size(t));
    MPI_Alltoall(in, (int)S, fsdp__mpi_type(t), recv, (int)S, fsdp__mpi_type(t), c->mpi);
    fsdp__sum_blocks(out, recv, S, c->size, t);
}
#endif

// full (size * S) = every rank's shard (S) in rank order
static inline void fsdp_all_gather(FsdpComm *c, float *full, const float *shard, size_t S) {
    FSDP__NCCL(c, ncclAllGather(shard, full, S, ncclFloat, c->nccl, c->stream));
#ifdef USE_MPI
    if (c->size > 1) {
        fsdp__check_count(c, S, "all-gather");
        if (shard == full + (size_t)c->rank * S) MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, full, (int)S, MPI_FLOAT, c->mpi);
        else MPI_Allgather(shard, (int)S, MPI_FLOAT, full, (int)S, MPI_FLOAT, c->mpi);
        return;
    }
#endif
    (void)c;
    if (full != shard) memmove(full, shard, S * sizeof(float));
}

// the same for bf16 elements: the CUDA trainer's bf16 base weights (device buffers,
// so the NCCL backend only)
static inline void fsdp_all_gather_bf16(FsdpComm *c, void *full, const void *shard, size_t S) {
    FSDP__NCCL(c, ncclAllGather(shard, full, S, ncclBfloat16, c->nccl, c->stream));
    fsdp_abort(c, "internal: a bf16 all-gather needs the NCCL backend (device buffers), not %s", c->size > 1 ? "MPI" : "one process");
    (void)full, (void)shard, (void)S;
}

// shard (S) = the sum over ranks of their full[rank * S .. (rank + 1) * S)
static inline void fsdp_reduce_scatter(FsdpComm *c, float *shard, const float *full, size_t S) {
    FSDP__NCCL(c, ncclReduceScatter(full, shard, S, ncclFloat, ncclSum, c->nccl, c->stream));
#ifdef USE_MPI
    if (c->size > 1) { fsdp__mpi_reduce_scatter(c, shard, full, S, FSDP_F32); return; }
#endif
    (void)c;
    if (shard != full) memmove(shard, full, S * sizeof(float));
}

// buf (n) = the sum over ranks of their buf, in place; every rank gets the same bits
static inline void fsdp_all_reduce(FsdpComm *c, void *buf, size_t n, FsdpDtype t) {
    FSDP__NCCL(c, ncclAllReduce(buf, buf, n, t == FSDP_F64 ? ncclDouble : ncclFloat, ncclSum, c->nccl, c->stream));
#ifdef USE_MPI
    if (c->size == 1) return;
    // reduce-scatter of the zero-padded buffer (sums in rank order), then all-gather
    size_t es = fsdp_dtype_size(t), S = fsdp_shard_size(n, c->size), W = (size_t)c->size;
    char *padded = (char *)callocCheck(W * S + S, es), *mine = padded + W * S * es;
    memcpy(padded, buf, n * es);
    fsdp__mpi_reduce_scatter(c, mine, padded, S, t);
    MPI_Allgather(mine, (int)S, fsdp__mpi_type(t), padded, (int)S, fsdp__mpi_type(t), c->mpi);
    memcpy(buf, padded, n * es);
    free(padded);
#else
    (void)c, (void)buf, (void)n, (void)t;
#endif
}

// buf (bytes) = root's buf
static inline void fsdp_broadcast(FsdpComm *c, void *buf, size_t bytes, int root) {
    FSDP__NCCL(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->nccl, c->stream));
#ifdef USE_MPI
    for (size_t done = 0; c->size > 1 && done < bytes;) { // in pieces: MPI counts are ints
        size_t k = bytes - done < (size_t)1 << 30 ? bytes - done : (size_t)1 << 30;
        MPI_Bcast((char *)buf + done, (int)k, MPI_BYTE, root, c->mpi);
        done += k;
    }
#else
    (void)c, (void)buf, (void)bytes, (void)root;
#endif
}

// waits until every rank is here (NCCL: and its queued collectives have finished)
static inline void fsdp_barrier(FsdpComm *c) {
#ifdef FSDP_NCCL
    if (c->backend == FSDP_BACKEND_NCCL) fsdp_cudaCheck(c, cudaStreamSynchronize(c->stream));
#endif
#ifdef USE_MPI
    if (c->size > 1) MPI_Barrier(c->mpi);
#else
    (void)c;
#endif
}

// 1 if flag is set on any rank (host side, every backend): how ranks agree that
// a step failed, or that a stop was requested, before the next collective
static inline int fsdp_any(FsdpComm *c, int flag) {
    int any = flag != 0;
#ifdef USE_MPI
    if (c->size > 1) MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_LOR, c->mpi);
#else
    (void)c;
#endif
    return any;
}

#ifdef FSDP_NCCL
// Makes c (a host communicator) use NCCL for its data collectives, on stream:
// rank 0 makes NCCL's unique id and broadcasts it over c. Call cudaSetDevice first.
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
} Fsdp;

// Starts the world and splits it for strategy s. shard_group (HYBRID_SHARD only):
// ranks per group, which must divide the world size; 0 = the ranks of one node.
// 0 ok; -1 with a message on every rank (they all see the same arguments).
static inline int fsdp_init(Fsdp *f, FsdpStrategy s, int shard_group) {
    memset(f, 0, sizeof *f);
    f->strategy = s;
    f->info = &fsdp_strategies[s];
    fsdp_world_init(&f->world);
    int W = f->world.size, rank = f->world.rank, G = shard_group;
    if (G != 0 && f->info->shard_over != FSDP_OVER_GROUP) {
        fprintf(stderr, "error: --shard_group applies to HYBRID_SHARD only, not %s\n", f->info->name);
        return -1;
    }
    if (f->info->shard_over == FSDP_OVER_WORLD) G = W;
    if (f->info->shard_over == FSDP_OVER_NONE) G = 1;
    if (G == 0 && W == 1) G = 1;
    if (G == 0) { // one group per node; every node must hold as many ranks
#ifdef USE_MPI
        MPI_Comm node;
        MPI_Comm_split_type(f->world.mpi, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
        int local, lo, hi;
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
        MPI_Allreduce(&local, &lo, 1, MPI_INT, MPI_MIN, f->world.mpi);
        MPI_Allreduce(&local, &hi, 1, MPI_INT, MPI_MAX, f->world.mpi);
        if (lo != hi) {
            fprintf(stderr, "error: HYBRID_SHARD: the nodes hold %d to %d ranks; give --shard_group\n", lo, hi);
            return -1;
        }
        G = local;
#else
        G = 1;
#endif
    }
    if (G < 1 || W % G != 0) {
        fprintf(stderr, "error: --shard_group %d does not divide the world size %d\n", G, W);
        return -1;
    }
    // groups of G consecutive ranks (mpirun places consecutive ranks on one node)
    fsdp_comm_split(&f->shard, &f->world, rank / G, rank);
    fsdp_comm_split(&f->replica, &f->world, rank % G, rank);
    return 0;
}

static inline void fsdp_free(Fsdp *f) {
    fsdp_comm_free(&f->replica);
    fsdp_comm_free(&f->shard);
    fsdp_comm_free(&f->world);
}

// A unit's parameters, whole: with a shard group of one (NO_SHARD) the shard is
// the unit; else gathered into buf (shard.size * unit.shard floats).
static inline float *fsdp_gather(Fsdp *f, const FsdpUnit *u, float *shards, float *buf) {
    if (f->shard.size == 1) return shards + u->shard_offset;
    fsdp_all_gather(&f->shard, buf, shards + u->shard_offset, u->shard);
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
static inline int fsdp_check_model(const FsdpUnits *u, const StModel *sm) {
    for (int i = 0; i < u->n_units; i++)
        for (int j = 0; j < u->units[i].n_tensors; j++) {
            const FsdpTensor *t = &u->units[i].tensors[j];
            StFile *f;
            const StTensor *st = st_model_find(sm, t->name, &f);
            if (!st) {
                fprintf(stderr, "error: %s: tensor '%s' is missing from the checkpoint%s\n", sm->dir, t->name,
                        strcmp(t->name, "lm_head.weight") == 0 ? " (config.json says tie_word_embeddings is false)" : "");
                return -1;
            }
            if (st->ndim != t->ndim || st->shape[0] != t->shape[0] || (t->ndim == 2 && st->shape[1] != t->shape[1])) {
                char got[128], want[128];
                st_format_shape(st->shape, st->ndim, got, sizeof got);
                st_format_shape(t->shape, t->ndim, want, sizeof want);
                fprintf(stderr, "error: %s: tensor '%s' has shape %s but config.json implies %s\n", f->path, t->name, got, want);
                return -1;
            }
            if (st->dtype != ST_F32 && st->dtype != ST_BF16 && st->dtype != ST_F16) {
                fprintf(stderr, "error: %s: tensor '%s' has dtype %s; only F32, BF16 and F16 weights are supported\n",
                        f->path, t->name, st_dtype_name(st->dtype));
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
    StFile *hf;
    const StTensor *head = u->tied ? st_model_find(sm, "lm_head.weight", &hf) : NULL;
    const FsdpTensor *embed = &u->units[0].tensors[0];
    if (head && (head->ndim != 2 || head->shape[0] != embed->shape[0] || head->shape[1] != embed->shape[1])) {
        fprintf(stderr, "error: %s: tensor 'lm_head.weight' has another shape than model.embed_tokens.weight but config.json "
                "says tie_word_embeddings is true\n", hf->path);
        return -1;
    }
    return 0;
}

// A tied model's stored lm_head, if there is one, must equal the embedding (else
// the run would silently train another model): elements [begin, begin + count)
// of it against those of the embedding, embed. 0 ok, -1 with a message.
static inline int fsdp_check_tied_head(StModel *sm, size_t begin, size_t count, const float *embed) {
    StFile *hf;
    const StTensor *head = st_model_find(sm, "lm_head.weight", &hf); // its shape: fsdp_check_model
    if (!head || !count) return 0;
    float *mine = (float *)mallocCheck(count * sizeof(float));
    int rc = st_read_f32(hf, head, begin, count, mine);
    if (rc == 0 && memcmp(mine, embed, count * sizeof(float)) != 0) {
        fprintf(stderr, "error: %s: tensor 'lm_head.weight' differs from model.embed_tokens.weight but config.json "
                "says tie_word_embeddings is true\n", hf->path);
        rc = -1;
    }
    free(mine);
    return rc;
}

// Fills shard `rank` of every unit (u->n_shards shards) into out (u->shard_numel
// floats, padding zeroed) piece by piece, a piece being the part of one tensor
// inside the shard: read(ctx, unit, tensor, first, count, dst) reads elements
// [first, first + count) of tensor `tensor` of unit `unit` into dst, wherever the
// caller keeps it. 0 ok, -1 when a read failed (it has said why).
typedef int (*FsdpReadFn)(void *ctx, int unit, int tensor, size_t first, size_t count, float *dst);
static inline int fsdp_read_shard(const FsdpUnits *u, int rank, float *out, FsdpReadFn read, void *ctx) {
    for (int i = 0; i < u->n_units; i++) {
        const FsdpUnit *un = &u->units[i];
        float *dst = out + un->shard_offset;
        size_t begin, count = fsdp_shard_range(un->numel, u->n_shards, rank, &begin);
        memset(dst, 0, un->shard * sizeof(float));
        for (int j = 0; j < un->n_tensors; j++) {
            const FsdpTensor *t = &un->tensors[j];
            size_t lo = begin > t->offset ? begin : t->offset;
            size_t hi = begin + count < t->offset + t->numel ? begin + count : t->offset + t->numel;
            if (lo < hi && read(ctx, i, j, lo - t->offset, hi - lo, dst + (lo - begin)) != 0) return -1;
        }
    }
    return 0;
}

typedef struct { const FsdpUnits *u; StModel *sm; } Fsdp__Checkpoint;
static inline int fsdp__read_tensor(void *ctx, int unit, int tensor, size_t first, size_t count, float *dst) {
    const Fsdp__Checkpoint *c = (const Fsdp__Checkpoint *)ctx;
    StFile *f = NULL;
    const StTensor *st = st_model_find(c->sm, c->u->units[unit].tensors[tensor].name, &f); // present: fsdp_check_model said so
    return st_read_f32(f, st, first, count, dst);
}

// Reads shard `rank` of every unit (u->n_shards shards) into out (u->shard_numel
// floats, padding zeroed), converting BF16 and F16 exactly to float. Only the
// bytes of those elements are read (st_read_f32 reads exactly the elements asked
// for), so a rank holds 1/n of the model. A tied model's stored lm_head must
// equal the embedding (each rank checks its own range). 0 ok, -1 with a message.
static inline int fsdp_load_model(const FsdpUnits *u, StModel *sm, int rank, float *out) {
    if (fsdp_check_model(u, sm) != 0) return -1;
    Fsdp__Checkpoint c = {u, sm};
    if (fsdp_read_shard(u, rank, out, fsdp__read_tensor, &c) != 0) return -1;
    if (!u->tied) return 0;
    size_t begin, count = fsdp_shard_range(u->units[0].numel, u->n_shards, rank, &begin);
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
#define FSDP_MAX_SHARDS 65536

// one of a rank's flat shard buffers (u->shard_numel floats): {"params", p}, {"exp_avg", m}, ...
typedef struct { const char *name; float *data; } FsdpBuffer;

// dir/name, or dir/fsdp-<k>-of-<shards>.safetensors when name is NULL; -1 with a message if too long
#define FSDP_PATH_MAX 4096
static inline int fsdp__path(char out[FSDP_PATH_MAX], const char *dir, const char *name, int k, int shards) {
    char file[64];
    if (!name) snprintf(file, sizeof file, "fsdp-%05d-of-%05d.safetensors", k, shards);
    if (snprintf(out, FSDP_PATH_MAX, "%s/%s", dir, name ? name : file) < FSDP_PATH_MAX) return 0;
    fprintf(stderr, "error: %s: path too long\n", dir);
    return -1;
}

// the checksums of the blocks of x (n floats), as 16 hex digits each, comma-separated (malloc'd)
static inline char *fsdp__checksums(const float *x, size_t n) {
    size_t blocks = (n + FSDP_CKPT_BLOCK - 1) / FSDP_CKPT_BLOCK;
    char *s = (char *)callocCheck(blocks ? blocks * 17 : 1, 1);
    for (size_t b = 0; b < blocks; b++) {
        size_t lo = b * FSDP_CKPT_BLOCK, k = n - lo < FSDP_CKPT_BLOCK ? n - lo : FSDP_CKPT_BLOCK;
        snprintf(s + b * 17, 18, b + 1 < blocks ? "%016llx," : "%016llx", (unsigned long long)data_hash_bytes(0, x + lo, k * sizeof(float)));
    }
    return s;
}

// Writes shard `rank` of the buffers: dir/fsdp-<rank>-of-<n>.safetensors (atomically).
// 0 ok, -1 with a message.
static inline int fsdp_save_shard(const char *dir, const FsdpUnits *u, const FsdpBuffer *bufs, int nb, int rank, const char *fingerprint) {
    int nt = nb * u->n_units;
    StWriteTensor *ts = (StWriteTensor *)callocCheck((size_t)nt, sizeof(StWriteTensor));
    char (*names)[FSDP_NAME_MAX] = (char (*)[FSDP_NAME_MAX])callocCheck((size_t)nt, FSDP_NAME_MAX);
    const char **meta = (const char **)callocCheck(2 * ((size_t)nt + 4), sizeof(char *));
    char shard[16], shards[16];
    snprintf(shard, sizeof shard, "%d", rank);
    snprintf(shards, sizeof shards, "%d", u->n_shards);
    const char *fixed[8] = {"format", FSDP_CKPT_FORMAT, "fingerprint", fingerprint, "shard", shard, "shards", shards};
    memcpy(meta, fixed, sizeof fixed);
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < u->n_units; i++) {
            int k = b * u->n_units + i;
            const FsdpUnit *un = &u->units[i];
            snprintf(names[k], FSDP_NAME_MAX, "%s/%s", bufs[b].name, un->name);
            ts[k].name = names[k];
            ts[k].dtype = ST_F32;
            ts[k].ndim = 1;
            ts[k].shape[0] = (int64_t)un->shard;
            ts[k].data = bufs[b].data + un->shard_offset;
            meta[8 + 2 * k] = names[k]; // the checksums are stored under the tensor's name
            meta[8 + 2 * k + 1] = fsdp__checksums(bufs[b].data + un->shard_offset, un->shard);
        }
    char path[FSDP_PATH_MAX];
    int rc = fsdp__path(path, dir, NULL, rank, u->n_shards) || st_write(path, ts, nt, meta, nt + 4) ? -1 : 0;
    for (int k = 0; k < nt; k++) free((void *)meta[8 + 2 * k + 1]);
    free(meta);
    free(names);
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
            "  \"dtype\": \"F32\",\n  \"buffers\": [", FSDP_CKPT_FORMAT, FSDP_CKPT_VERSION, fingerprint, u->n_shards);
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

// the index's checks: format, version, fingerprint, units, buffers -> *shards
static inline int fsdp__check_index(const char *path, const JsonValue *ix, const FsdpUnits *u, const FsdpBuffer *bufs, int nb,
                             const char *fingerprint, int *shards) {
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
            shard != (long long)fsdp_shard_size(u->units[i].numel, *shards)) {
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

// Reads elements [first, first + count) of the tensor `name` (S floats) of shard
// file sf into out, verifying the checksum of every block it touches.
static inline int fsdp__read_verified(StFile *sf, const char *name, size_t S, size_t first, size_t count, float *out, float *block) {
    const StTensor *t = st_find(sf, name);
    const char *sums;
    size_t len, blocks = (S + FSDP_CKPT_BLOCK - 1) / FSDP_CKPT_BLOCK;
    if (!t || t->dtype != ST_F32 || t->ndim != 1 || (size_t)t->shape[0] != S) {
        fprintf(stderr, "error: %s: no F32 tensor '%s' of %zu elements\n", sf->path, name, S);
        return -1;
    }
    if (json_get_string(&sf->metadata, name, &sums, &len) != 0 || len != (blocks ? blocks * 17 - 1 : 0)) {
        fprintf(stderr, "error: %s: tensor '%s' has no valid checksums in the metadata\n", sf->path, name);
        return -1;
    }
    for (size_t b = first / FSDP_CKPT_BLOCK; b < blocks && b * FSDP_CKPT_BLOCK < first + count; b++) {
        size_t lo = b * FSDP_CKPT_BLOCK, k = S - lo < FSDP_CKPT_BLOCK ? S - lo : FSDP_CKPT_BLOCK;
        if (st_read_f32(sf, t, lo, k, block) != 0) return -1;
        char got[17];
        snprintf(got, sizeof got, "%016llx", (unsigned long long)data_hash_bytes(0, block, k * sizeof(float)));
        if (memcmp(got, sums + b * 17, 16) != 0) {
            fprintf(stderr, "error: %s: tensor '%s': elements [%zu, %zu) do not match their checksum (corrupt file)\n",
                    sf->path, name, lo, lo + k);
            return -1;
        }
        size_t a = first > lo ? first : lo, e = first + count < lo + k ? first + count : lo + k;
        memcpy(out + (a - first), block + (a - lo), (e - a) * sizeof(float));
    }
    return 0;
}

// Reads shard `rank` (of u->n_shards) of each buffer from the checkpoint in dir,
// whatever shard count it was saved with, into bufs[i].data (padding zeroed).
// Refuses another model's checkpoint, a missing buffer, and a missing,
// truncated or corrupt shard file. Local: no collectives. 0 ok, -1 with a message.
static inline int fsdp_load(const char *dir, const FsdpUnits *u, FsdpBuffer *bufs, int nb, int rank, const char *fingerprint) {
    char path[FSDP_PATH_MAX];
    JsonValue ix;
    int shards = 0, rc = -1;
    if (fsdp__path(path, dir, FSDP_INDEX_NAME, 0, 0) != 0) return -1;
    if (access(path, F_OK) != 0) {
        fprintf(stderr, "error: %s: no %s: not a sharded checkpoint, or an incomplete one\n", dir, FSDP_INDEX_NAME);
        return -1;
    }
    if (json_load_file(path, &ix) != 0) return -1;
    StFile *files = NULL; // the old shard files this rank needs, opened when first needed
    float *block = NULL;
    if (fsdp__check_index(path, &ix, u, bufs, nb, fingerprint, &shards) != 0) goto done;
    files = (StFile *)callocCheck((size_t)shards, sizeof(StFile));
    block = (float *)mallocCheck(FSDP_CKPT_BLOCK * sizeof(float));
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < u->n_units; i++) {
            const FsdpUnit *un = &u->units[i];
            float *dst = bufs[b].data + un->shard_offset;
            size_t begin, count = fsdp_shard_range(un->numel, u->n_shards, rank, &begin);
            size_t S = fsdp_shard_size(un->numel, shards); // the saved shards' size
            memset(dst, 0, un->shard * sizeof(float));
            char name[FSDP_NAME_MAX];
            snprintf(name, sizeof name, "%s/%s", bufs[b].name, un->name);
            for (int k = (int)(begin / (S ? S : 1)); count && k < shards && (size_t)k * S < begin + count; k++) {
                if (!files[k].path && fsdp__open_shard(&files[k], dir, k, shards, fingerprint) != 0) goto done;
                size_t lo = begin > (size_t)k * S ? begin : (size_t)k * S;
                size_t hi = begin + count < (size_t)(k + 1) * S ? begin + count : (size_t)(k + 1) * S;
                if (fsdp__read_verified(&files[k], name, S, lo - (size_t)k * S, hi - lo, dst + (lo - begin), block) != 0) goto done;
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
