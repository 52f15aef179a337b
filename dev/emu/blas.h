// dev/emu/blas.h: cuBLAS and cuBLASLt for the emulated build, from NVIDIA's
// documentation of them, for what llama2.tune calls (support/matmul.cuh):
// cuBLASLt's handle, matmul descriptor (TRANSA, TRANSB), matrix layouts,
// preference (workspace, minimum alignments), heuristic and cublasLtMatmul;
// cuBLAS's handle, stream, workspace and cublasGemmEx. Both compute the
// column-major product
//     D (m, n) = alpha * op(A) (m, k) op(B) (k, n) + beta * C (m, n)
// where op(X) is X or its transpose, element (i, j) of a matrix with leading
// dimension ld is X[i + j * ld], C is D itself (in place, same layout) or
// another matrix of D's type and shape with its own ld (0: one column, broadcast
// to all), and with beta == 0 C is not read (a NaN there does not reach D).
//
// Numerics (CUBLAS_COMPUTE_32F, alpha and beta fp32): inputs are read as stored
// and widened exactly (bf16 is the top half of an fp32, fp16 a subset of it); each
// D(i, j) is one fp32 sum over l = 0 .. k-1 in that order, every step a fused
// multiply-add (one rounding, as the GPU's FFMA), then alpha * sum, then + beta *
// C(i, j) fused, rounded once to D's type (bf16, fp16: to nearest, ties to even,
// cuda_bf16.h, cuda_fp16.h). The
// order is fixed so that results repeat bit for bit; the GPU's algorithms sum in
// other orders (tiles, split-k), so fp32 results differ from a GPU's in the last bits.
//
// The product is enqueued (emu::enqueue, as "cublasLtMatmul" or "cublasGemmEx")
// on the stream the call names (cublasLtMatmul's argument, cublasSetStream's for
// cublasGemmEx) and runs in stream order like a kernel. What the call reads from
// the host (alpha, beta, descriptors, layouts) is copied at the call.
//
// Checks: the argument checks the documentation states return its status, and
// print "emu: cuBLASLt: <call>: <what is wrong>" (or cuBLAS) to stderr:
//   - INVALID_VALUE: NULL arguments; shapes of op(A), op(B), C and D that do not
//     agree; a leading dimension below the rows; C != D of another type or shape
//     than D; C == D with another layout than D's; a workspace not 256-byte
//     aligned; an algorithm used for another product than the heuristic chose it for;
//   - NOT_SUPPORTED: an operand less aligned than the preference promised
//     (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, 256 by default: the algorithm
//     was chosen for that alignment); a type combination outside
//     {bf16 in, bf16 or fp32 out; fp16 in, fp16 or fp32 out; fp32 in and out}; and anything the
//     documentation defines that this file does not implement (another
//     attribute, compute type, operation, algorithm, batches), named, never guessed.
// An output overlapping an input (other than C == D) is a race on the GPU, where
// no status reports it: it stops the program through emu::fail.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#include "types.h"
#include "library_types.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"

// ----------------------------------------------------------------------------
// cuBLAS's and cuBLASLt's enumerations, with their values. Each list names its
// values once, for the enumeration and for the messages (emu::blas::name_of).

#define EMU_CUBLAS_STATUS(X)                                                                                       \
    X(CUBLAS_STATUS_SUCCESS, 0) X(CUBLAS_STATUS_NOT_INITIALIZED, 1) X(CUBLAS_STATUS_ALLOC_FAILED, 3)                 \
    X(CUBLAS_STATUS_INVALID_VALUE, 7) X(CUBLAS_STATUS_ARCH_MISMATCH, 8) X(CUBLAS_STATUS_MAPPING_ERROR, 11)          \
    X(CUBLAS_STATUS_EXECUTION_FAILED, 13) X(CUBLAS_STATUS_INTERNAL_ERROR, 14) X(CUBLAS_STATUS_NOT_SUPPORTED, 15)    \
    X(CUBLAS_STATUS_LICENSE_ERROR, 16)
#define EMU_CUBLAS_OPERATION(X) X(CUBLAS_OP_N, 0) X(CUBLAS_OP_T, 1) X(CUBLAS_OP_C, 2)
#define EMU_CUBLAS_COMPUTE_TYPE(X)                                                                                 \
    X(CUBLAS_COMPUTE_16F, 64) X(CUBLAS_COMPUTE_16F_PEDANTIC, 65) X(CUBLAS_COMPUTE_32F, 68)                         \
    X(CUBLAS_COMPUTE_32F_PEDANTIC, 69) X(CUBLAS_COMPUTE_64F, 70) X(CUBLAS_COMPUTE_64F_PEDANTIC, 71)                \
    X(CUBLAS_COMPUTE_32I, 72) X(CUBLAS_COMPUTE_32I_PEDANTIC, 73) X(CUBLAS_COMPUTE_32F_FAST_16F, 74)                 \
    X(CUBLAS_COMPUTE_32F_FAST_16BF, 75) X(CUBLAS_COMPUTE_32F_FAST_TF32, 77)
#define EMU_CUBLASLT_MATMUL_DESC(X)                                                                                \
    X(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, 0) X(CUBLASLT_MATMUL_DESC_SCALE_TYPE, 1)                                  \
    X(CUBLASLT_MATMUL_DESC_POINTER_MODE, 2) X(CUBLASLT_MATMUL_DESC_TRANSA, 3) X(CUBLASLT_MATMUL_DESC_TRANSB, 4)     \
    X(CUBLASLT_MATMUL_DESC_TRANSC, 5) X(CUBLASLT_MATMUL_DESC_FILL_MODE, 6) X(CUBLASLT_MATMUL_DESC_EPILOGUE, 7)      \
    X(CUBLASLT_MATMUL_DESC_BIAS_POINTER, 8) X(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, 10)                          \
    X(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, 11) X(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, 12)                   \
    X(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, 13) X(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, 14)    \
    X(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 15) X(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, 17)                        \
    X(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, 18) X(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, 19)                        \
    X(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, 20) X(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, 21)                         \
    X(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, 22)
#define EMU_CUBLASLT_MATRIX_LAYOUT(X)                                                                              \
    X(CUBLASLT_MATRIX_LAYOUT_TYPE, 0) X(CUBLASLT_MATRIX_LAYOUT_ORDER, 1) X(CUBLASLT_MATRIX_LAYOUT_ROWS, 2)          \
    X(CUBLASLT_MATRIX_LAYOUT_COLS, 3) X(CUBLASLT_MATRIX_LAYOUT_LD, 4) X(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 5)      \
    X(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, 6) X(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, 7)
#define EMU_CUBLASLT_MATMUL_PREF(X)                                                                                \
    X(CUBLASLT_MATMUL_PREF_SEARCH_MODE, 0) X(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 1)                          \
    X(CUBLASLT_MATMUL_PREF_MATH_MODE_MASK, 2) X(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, 3)                     \
    X(CUBLASLT_MATMUL_PREF_GAUSSIAN_MODE_MASK, 4) X(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, 5)                 \
    X(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, 6) X(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, 7)              \
    X(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, 8) X(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, 9)                    \
    X(CUBLASLT_MATMUL_PREF_POINTER_MODE_MASK, 10) X(CUBLASLT_MATMUL_PREF_EPILOGUE_MASK, 11)                        \
    X(CUBLASLT_MATMUL_PREF_IMPL_MASK, 12)
#define EMU_BLAS_ENUMERATOR(name, value) name = value,
#define EMU_BLAS_NAME_CASE(name, value) case value: return #name;

typedef enum { EMU_CUBLAS_STATUS(EMU_BLAS_ENUMERATOR) } cublasStatus_t;
typedef enum { EMU_CUBLAS_OPERATION(EMU_BLAS_ENUMERATOR) } cublasOperation_t;
typedef enum { EMU_CUBLAS_COMPUTE_TYPE(EMU_BLAS_ENUMERATOR) } cublasComputeType_t;
typedef enum { EMU_CUBLASLT_MATMUL_DESC(EMU_BLAS_ENUMERATOR) } cublasLtMatmulDescAttributes_t;
typedef enum { EMU_CUBLASLT_MATRIX_LAYOUT(EMU_BLAS_ENUMERATOR) } cublasLtMatrixLayoutAttribute_t;
typedef enum { EMU_CUBLASLT_MATMUL_PREF(EMU_BLAS_ENUMERATOR) } cublasLtMatmulPreferenceAttributes_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

namespace emu {
namespace blas {

// What the handles and descriptors point to. A layout is as cublasLtMatrixLayoutCreate
// makes it: column-major, one matrix.
struct LtContext {};
struct Context { cudaStream_t stream = NULL; }; // cublasSetStream's (NULL: the legacy default stream)
struct MatmulDesc { cublasComputeType_t compute; cudaDataType_t scale; cublasOperation_t trans_a, trans_b; };
struct Layout { cudaDataType_t type; uint64_t rows, cols; int64_t ld; };
struct Preference { uint64_t max_workspace_bytes; uint32_t min_alignment[4]; }; // of A, B, C, D

} // namespace blas
} // namespace emu

typedef emu::blas::LtContext *cublasLtHandle_t;
typedef emu::blas::Context *cublasHandle_t;
typedef emu::blas::MatmulDesc *cublasLtMatmulDesc_t;
typedef emu::blas::Layout *cublasLtMatrixLayout_t;
typedef emu::blas::Preference *cublasLtMatmulPreference_t;
// an algorithm is a plain value (the trainer keeps copies); here it holds what
// the heuristic chose it for (emu::blas::ALGO_*)
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

namespace emu {
namespace blas {

// ----------------------------------------------------------------------------
// names and refusals

#define EMU_BLAS_NAME_OF(type, list)                                                                               \
    inline const char *name_of(type v) {                                                                           \
        switch ((int)v) { list(EMU_BLAS_NAME_CASE) }                                                               \
        return "(no " #type ")";                                                                                   \
    }
EMU_BLAS_NAME_OF(cublasStatus_t, EMU_CUBLAS_STATUS)
EMU_BLAS_NAME_OF(cublasOperation_t, EMU_CUBLAS_OPERATION)
EMU_BLAS_NAME_OF(cublasComputeType_t, EMU_CUBLAS_COMPUTE_TYPE)
EMU_BLAS_NAME_OF(cublasLtMatmulDescAttributes_t, EMU_CUBLASLT_MATMUL_DESC)
EMU_BLAS_NAME_OF(cublasLtMatrixLayoutAttribute_t, EMU_CUBLASLT_MATRIX_LAYOUT)
EMU_BLAS_NAME_OF(cublasLtMatmulPreferenceAttributes_t, EMU_CUBLASLT_MATMUL_PREF)
inline const char *name_of(cudaDataType_t v) {
    switch (v) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_32I: return "CUDA_R_32I";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    }
    return "(a cudaDataType_t the emulation does not know)";
}

// prints "emu: cuBLASLt: call: <message> (STATUS)" (cuBLAS for cuBLAS's calls) and returns status
inline cublasStatus_t refuse(cublasStatus_t status, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
inline cublasStatus_t refuse(cublasStatus_t status, const char *call, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emu: %s: %s: ", strncmp(call, "cublasLt", 8) == 0 ? "cuBLASLt" : "cuBLAS", call);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (%s)\n", name_of(status));
    va_end(ap);
    return status;
}

// ----------------------------------------------------------------------------
// the product

struct Operand { const void *p; cudaDataType_t type; int64_t ld; };
struct Product {
    int64_t m, n, k;
    bool trans_a, trans_b;
    Operand a, b, c, d; // d.p is written
    float alpha, beta;
};

// of the two types check_types lets through
inline size_t element_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
inline float load(const Operand &x, size_t i) {
    if (x.type == CUDA_R_32F) return ((const float *)x.p)[i];
    if (x.type == CUDA_R_16F) return __half2float(((const __half *)x.p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)x.p)[i]);
}
inline void store(const Operand &x, size_t i, float v) {
    if (x.type == CUDA_R_32F) ((float *)x.p)[i] = v;
    else if (x.type == CUDA_R_16F) ((__half *)x.p)[i] = __float2half_rn(v);
    else ((__nv_bfloat16 *)x.p)[i] = __float2bfloat16_rn(v);
}
// element (r, c) of op(X), X column-major
inline float op_at(const Operand &x, bool trans, int64_t r, int64_t c) {
    return trans ? load(x, (size_t)(c + r * x.ld)) : load(x, (size_t)(r + c * x.ld));
}

// D = alpha * op(A) op(B) + beta * C, in the order the file's comment gives
inline void run(const Product &p) {
    size_t m = (size_t)p.m, n = (size_t)p.n, k = (size_t)p.k;
    // op(A) by columns (padded with zero rows to a multiple of R) and op(B) by columns,
    // widened to fp32 (exactly). R rows of a column of D at a time: each element's sum still
    // runs over k in order, but R chains of fused multiply-adds run side by side instead of
    // one waiting for the last (a sixth of the emulated CUDA trainer's time had gone to that)
    constexpr size_t R = 8;
    size_t mr = (m + R - 1) / R * R;
    std::vector<float> a(k * mr, 0.0f), b(n * k);
    for (size_t l = 0; l < k; l++)
        for (size_t i = 0; i < m; i++) a[l * mr + i] = op_at(p.a, p.trans_a, (int64_t)i, (int64_t)l);
    for (size_t j = 0; j < n; j++)
        for (size_t l = 0; l < k; l++) b[j * k + l] = op_at(p.b, p.trans_b, (int64_t)l, (int64_t)j);
    for (size_t j = 0; j < n; j++)
        for (size_t i0 = 0; i0 < m; i0 += R) {
            float sum[R] = {0};
            for (size_t l = 0; l < k; l++)
                for (size_t r = 0; r < R; r++) sum[r] = std::fma(a[l * mr + i0 + r], b[j * k + l], sum[r]);
            for (size_t i = i0; i < m && i < i0 + R; i++) {
                float v = p.alpha * sum[i - i0];
                if (p.beta != 0.0f) v = std::fma(p.beta, load(p.c, i + j * (size_t)p.c.ld), v);
                store(p.d, i + j * (size_t)p.d.ld, v);
            }
        }
}

// ----------------------------------------------------------------------------
// the checks both APIs share

// the type combinations cuBLAS documents for CUBLAS_COMPUTE_32F that this file computes
inline cublasStatus_t check_types(const char *call, cudaDataType_t ta, cudaDataType_t tb, cudaDataType_t tc) {
    bool half = ta == CUDA_R_16BF || ta == CUDA_R_16F; // 16-bit in: out the same type, or fp32
    if (ta == tb && ((half && (tc == ta || tc == CUDA_R_32F)) || (ta == CUDA_R_32F && tc == CUDA_R_32F)))
        return CUBLAS_STATUS_SUCCESS;
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  "A %s, B %s, C/D %s: the emulation computes A and B CUDA_R_16BF (or CUDA_R_16F) with C/D of that type "
                  "or CUDA_R_32F, and all CUDA_R_32F", name_of(ta), name_of(tb), name_of(tc));
}

// the bytes from x.p that a (rows, cols) matrix spans
inline size_t span_bytes(const Operand &x, int64_t rows, int64_t cols) {
    return rows && cols ? (size_t)((cols - 1) * x.ld + rows) * element_size(x.type) : 0;
}
// an output written while a kernel reads an overlapping input is a race on the GPU
inline void check_no_overlap(const char *call, const char *out, const Operand &o, int64_t o_rows, int64_t o_cols,
                             const char *in, const Operand &x, int64_t x_rows, int64_t x_cols) {
    uintptr_t a = (uintptr_t)o.p, b = (uintptr_t)x.p;
    size_t na = span_bytes(o, o_rows, o_cols), nb = span_bytes(x, x_rows, x_cols);
    if (na && nb && a < b + nb && b < a + na)
        fail("%s: %s [%p, +%zu bytes) overlaps %s [%p, +%zu bytes): the product writes %s while it reads %s, a race on "
             "the GPU (only C == D, with the same layout, may share memory)", call, out, o.p, na, in, x.p, nb, out, in);
}

// the operation TRANSA/TRANSB or cublasGemmEx's transa/transb names: N and T
inline cublasStatus_t check_operation(const char *call, const char *what, int v) {
    if (v == CUBLAS_OP_N || v == CUBLAS_OP_T) return CUBLAS_STATUS_SUCCESS;
    if (v == CUBLAS_OP_C)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "%s CUBLAS_OP_C is not implemented (for real types it means "
                      "CUBLAS_OP_T: pass that)", what);
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "%s %d is not a cublasOperation_t", what, v);
}

// ----------------------------------------------------------------------------
// cuBLASLt's product: its shape from the descriptor and layouts

// what a cublasLtMatmulAlgo_t holds: a tag (it came from the heuristic), the
// minimum alignments of A, B, C, D it was chosen for, and the product's fingerprint
enum { ALGO_TAG, ALGO_ALIGN_A, ALGO_FINGERPRINT = ALGO_ALIGN_A + 4 };
constexpr uint64_t ALGO_TAG_VALUE = 0x656d75626c617331ull; // "emublas1"

// FNV-1a over the descriptor's and the layouts' fields
inline uint64_t fingerprint(const MatmulDesc &desc, const Layout *const ls[4]) {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ull; };
    mix(desc.compute), mix(desc.scale), mix(desc.trans_a), mix(desc.trans_b);
    for (int i = 0; i < 4; i++) mix(ls[i]->type), mix(ls[i]->rows), mix(ls[i]->cols), mix((uint64_t)ls[i]->ld);
    return h;
}

// Checks the descriptor and the layouts of A, B, C, D as the documentation states
// and fills p's shape, transposes, types and leading dimensions.
inline cublasStatus_t lt_problem(const char *call, const MatmulDesc *desc, const Layout *la, const Layout *lb,
                                 const Layout *lc, const Layout *ld, Product *p) {
    if (!desc || !la || !lb || !lc || !ld)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the matmul descriptor or a matrix layout is NULL");
    bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
    // op(A) (m, k), op(B) (k, n), D (m, n)
    int64_t m = (int64_t)ld->rows, n = (int64_t)ld->cols;
    int64_t am = (int64_t)(ta ? la->cols : la->rows), k = (int64_t)(ta ? la->rows : la->cols);
    int64_t bk = (int64_t)(tb ? lb->cols : lb->rows), bn = (int64_t)(tb ? lb->rows : lb->cols);
    if (am != m || bk != k || bn != n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                      "op(A) (%lld, %lld) times op(B) (%lld, %lld) is not D (%lld, %lld): A's layout is (%llu, %llu) "
                      "with TRANSA %s, B's (%llu, %llu) with TRANSB %s", (long long)am, (long long)k, (long long)bk,
                      (long long)bn, (long long)m, (long long)n, (unsigned long long)la->rows,
                      (unsigned long long)la->cols, name_of(desc->trans_a), (unsigned long long)lb->rows,
                      (unsigned long long)lb->cols, name_of(desc->trans_b));
    if (lc->rows != ld->rows || lc->cols != ld->cols || lc->type != ld->type)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                      "C (%llu, %llu) %s and D (%llu, %llu) %s differ in shape or type", (unsigned long long)lc->rows,
                      (unsigned long long)lc->cols, name_of(lc->type), (unsigned long long)ld->rows,
                      (unsigned long long)ld->cols, name_of(ld->type));
    const emu::blas::Layout *ls[4] = {la, lb, lc, ld}; // (qualified: support/utils.h has a Layout too)
    const char *names = "ABCD";
    for (int i = 0; i < 4; i++) // column-major: ld at least the rows; C's may be 0 (one column for all)
        if (ls[i]->ld < (int64_t)ls[i]->rows && !(i == 2 && ls[i]->ld == 0))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "%c's leading dimension %lld is less than its %llu rows",
                          names[i], (long long)ls[i]->ld, (unsigned long long)ls[i]->rows);
    cublasStatus_t status = check_types(call, la->type, lb->type, ld->type);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    p->m = m, p->n = n, p->k = k, p->trans_a = ta, p->trans_b = tb;
    p->a = {NULL, la->type, la->ld}, p->b = {NULL, lb->type, lb->ld}, p->c = {NULL, lc->type, lc->ld};
    p->d = {NULL, ld->type, ld->ld};
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace blas
} // namespace emu

// ----------------------------------------------------------------------------
// cuBLASLt

inline const char *cublasLtGetStatusString(cublasStatus_t status) { return emu::blas::name_of(status); }

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
    if (!handle) return emu::blas::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "handle is NULL");
    *handle = new emu::blas::LtContext();
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle) return emu::blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "handle is NULL");
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
    const char *call = "cublasLtMatmulDescCreate";
    if (!desc) return emu::blas::refuse(CUBLAS_STATUS_INVALID_VALUE, call, "matmulDesc is NULL");
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F)
        return emu::blas::refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "compute type %s with scale type %s: the emulation "
                                 "implements CUBLAS_COMPUTE_32F with CUDA_R_32F", emu::blas::name_of(compute),
                                 emu::blas::name_of(scale));
    *desc = new emu::blas::MatmulDesc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}
// TRANSA and TRANSB (int32_t, cublasOperation_t N or T); any other attribute is refused
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                                     const void *buf, size_t size) {
    const char *call = "cublasLtMatmulDescSetAttribute";
    if (attr != CUBLASLT_MATMUL_DESC_TRANSA && attr != CUBLASLT_MATMUL_DESC_TRANSB)
        return emu::blas::refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                                 "%s (%d) is not implemented (the emulation "
                                 "implements CUBLASLT_MATMUL_DESC_TRANSA and _TRANSB)",
                                 emu::blas::name_of(attr), (int)attr);
    if (!desc || !buf || size != sizeof(int32_t))
        return emu::blas::refuse(CUBLAS_STATUS_INVALID_VALUE, call, "%s takes an int32_t: desc %p, buf %p, %zu bytes",
                                 emu::blas::name_of(attr), (void *)desc, buf, size);
    int32_t op;
    memcpy(&op, buf, sizeof op);
    cublasStatus_t status = emu::blas::check_operation(call, emu::blas::name_of(attr), op);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) = (cublasOperation_t)op;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    if (!layout)
        return emu::blas::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "matLayout is NULL");
    *layout = new emu::blas::Layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}
// every attribute is refused: layouts are what cublasLtMatrixLayoutCreate makes (column-major, one matrix)
inline cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t attr,
                                                       const void *, size_t) {
    return emu::blas::refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatrixLayoutSetAttribute", "%s (%d) is not "
                             "implemented (the emulation implements layouts as cublasLtMatrixLayoutCreate makes them: "
                             "column-major, one matrix, no batches)", emu::blas::name_of(attr), (int)attr);
}

inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref) return emu::blas::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "pref is NULL");
    *pref = new emu::blas::Preference{0, {256, 256, 256, 256}}; // the documented defaults
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}
// MAX_WORKSPACE_BYTES (uint64_t) and MIN_ALIGNMENT_{A,B,C,D}_BYTES (uint32_t, a power of two); others refused
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                           size_t size) {
    const char *call = "cublasLtMatmulPreferenceSetAttribute";
    bool alignment =
        attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES;
    if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && !alignment)
        return emu::blas::refuse(
            CUBLAS_STATUS_NOT_SUPPORTED, call,
            "%s (%d) is not implemented (the emulation "
            "implements CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES and _MIN_ALIGNMENT_{A,B,C,D}_BYTES)",
            emu::blas::name_of(attr), (int)attr);
    size_t want = alignment ? sizeof(uint32_t) : sizeof(uint64_t);
    if (!pref || !buf || size != want)
        return emu::blas::refuse(CUBLAS_STATUS_INVALID_VALUE, call, "%s takes %zu bytes: pref %p, buf %p, %zu bytes",
                                 emu::blas::name_of(attr), want, (void *)pref, buf, size);
    if (!alignment) {
        memcpy(&pref->max_workspace_bytes, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    uint32_t a;
    memcpy(&a, buf, size);
    if (a == 0 || (a & (a - 1)))
        return emu::blas::refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "%s %u is not a power of two",
                                 emu::blas::name_of(attr), a);
    pref->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = a;
    return CUBLAS_STATUS_SUCCESS;
}

// One algorithm for every product the file computes (it needs no workspace),
// chosen for the preference's minimum alignments; NOT_SUPPORTED, no algorithm,
// for what it does not compute.
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                     cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                                     cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                                     cublasLtMatmulPreference_t pref, int requested,
                                                     cublasLtMatmulHeuristicResult_t results[], int *returned) {
    using namespace emu::blas;
    const char *call = "cublasLtMatmulAlgoGetHeuristic";
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "lightHandle is NULL");
    if (!pref || !results || !returned)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                      "preference, heuristicResultsArray or returnAlgoCount is NULL");
    *returned = 0;
    if (requested <= 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "requestedAlgoCount %d is not positive", requested);
    Product p;
    cublasStatus_t status = lt_problem(call, desc, la, lb, lc, ld, &p);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    cublasLtMatmulHeuristicResult_t r = {};
    const emu::blas::Layout *ls[4] = {la, lb, lc, ld}; // (qualified: support/utils.h has a Layout too)
    r.algo.data[ALGO_TAG] = ALGO_TAG_VALUE;
    for (int i = 0; i < 4; i++) r.algo.data[ALGO_ALIGN_A + i] = pref->min_alignment[i];
    r.algo.data[ALGO_FINGERPRINT] = fingerprint(*desc, ls);
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    results[0] = r;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// D = alpha * op(A) op(B) + beta * C, enqueued on stream
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                                     const void *A, cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb,
                                     const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D,
                                     cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, void *workspace,
                                     size_t /* workspace bytes: the algorithm needs none */, cudaStream_t stream) {
    using namespace emu::blas;
    const char *call = "cublasLtMatmul";
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "lightHandle is NULL");
    if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "alpha or beta is NULL");
    Product p;
    cublasStatus_t status = lt_problem(call, desc, la, lb, lc, ld, &p);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    p.alpha = *(const float *)alpha, p.beta = *(const float *)beta;
    p.a.p = A, p.b.p = B, p.c.p = C, p.d.p = D;
    bool reads_c = p.beta != 0.0f;
    if (!algo)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "algo NULL (an implicit heuristic query) is not implemented: "
                      "pass the algorithm cublasLtMatmulAlgoGetHeuristic returned");
    const emu::blas::Layout *ls[4] = {la, lb, lc, ld}; // (qualified: support/utils.h has a Layout too)
    if (algo->data[ALGO_TAG] != ALGO_TAG_VALUE)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "algo is not one cublasLtMatmulAlgoGetHeuristic returned");
    if (algo->data[ALGO_FINGERPRINT] != fingerprint(*desc, ls))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "algo was chosen for another product: the descriptor or a "
                      "layout differs from the heuristic query's");
    if ((uintptr_t)workspace % 256)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "workspace %p is not 256-byte aligned", workspace);
    // the operands the product reads and writes, each at least as aligned as the algorithm was chosen for
    const Operand *ops[4] = {&p.a, &p.b, &p.c, &p.d};
    const char *names = "ABCD";
    for (int i = 0; i < 4; i++) {
        if (i == 2 && !reads_c) continue;
        bool empty = ls[i]->rows == 0 || ls[i]->cols == 0;
        if (!ops[i]->p && !empty) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "%c is NULL", names[i]);
        uint64_t want = algo->data[ALGO_ALIGN_A + i];
        if ((uintptr_t)ops[i]->p % want)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "%c at %p is not %llu-byte aligned, the alignment the "
                          "algorithm was chosen for (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)", names[i],
                          ops[i]->p, (unsigned long long)want, names[i]);
    }
    if (reads_c && C == D && (lc->ld != ld->ld))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                      "C == D (in place) needs C's layout to be D's: ld %lld and %lld", (long long)lc->ld,
                      (long long)ld->ld);
    check_no_overlap(call, "D", p.d, p.m, p.n, "A", p.a, (int64_t)la->rows, (int64_t)la->cols);
    check_no_overlap(call, "D", p.d, p.m, p.n, "B", p.b, (int64_t)lb->rows, (int64_t)lb->cols);
    if (reads_c && C != D) check_no_overlap(call, "D", p.d, p.m, p.n, "C", p.c, (int64_t)lc->rows, lc->ld ? p.n : 1);
    emu::enqueue(stream, call, [p] { run(p); });
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// cuBLAS

inline const char *cublasGetStatusString(cublasStatus_t status) { return emu::blas::name_of(status); }

inline cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    if (!handle) return emu::blas::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate", "handle is NULL");
    *handle = new emu::blas::Context();
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (!handle) return emu::blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy", "handle is NULL");
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
// (the documentation: this also gives the handle back cuBLAS's own workspace,
// undoing cublasSetWorkspace; the emulation's products need none)
inline cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle) return emu::blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream", "handle is NULL");
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t) {
    if (!handle) return emu::blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetWorkspace", "handle is NULL");
    if ((uintptr_t)workspace % 256)
        return emu::blas::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace", "workspace %p is not 256-byte "
                                 "aligned", workspace);
    return CUBLAS_STATUS_SUCCESS;
}

// C = alpha * op(A) op(B) + beta * C, enqueued on the handle's stream
inline cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda,
                                   const void *B, cudaDataType_t Btype, int ldb, const void *beta, void *C,
                                   cudaDataType_t Ctype, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    using namespace emu::blas;
    const char *call = "cublasGemmEx";
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "handle is NULL");
    if (compute != CUBLAS_COMPUTE_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "computeType %s (%d) is not implemented (the emulation "
                      "implements CUBLAS_COMPUTE_32F)", name_of(compute), (int)compute);
    if (algo != CUBLAS_GEMM_DEFAULT)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "algo %d is not implemented (the emulation implements "
                      "CUBLAS_GEMM_DEFAULT)", (int)algo);
    cublasStatus_t status = check_operation(call, "transa", transa);
    if (status == CUBLAS_STATUS_SUCCESS) status = check_operation(call, "transb", transb);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
    int a_rows = ta ? k : m, b_rows = tb ? n : k;
    if (m < 0 || n < 0 || k < 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "m %d, n %d, k %d: none may be negative", m, n, k);
    if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "lda %d, ldb %d, ldc %d: each must be at least max(1, rows) "
                      "= %d, %d, %d", lda, ldb, ldc, std::max(1, a_rows), std::max(1, b_rows), std::max(1, m));
    if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "alpha or beta is NULL");
    status = check_types(call, Atype, Btype, Ctype);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS; // nothing to compute
    Product p = {m, n, k, ta, tb, {A, Atype, lda}, {B, Btype, ldb}, {C, Ctype, ldc}, {C, Ctype, ldc},
                 *(const float *)alpha, *(const float *)beta};
    check_no_overlap(call, "C", p.d, m, n, "A", p.a, a_rows, ta ? m : k);
    check_no_overlap(call, "C", p.d, m, n, "B", p.b, b_rows, tb ? k : n);
    emu::enqueue(handle->stream, call, [p] { run(p); });
    return CUBLAS_STATUS_SUCCESS;
}
