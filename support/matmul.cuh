// matmul_forward / matmul_backward on the GPU through cuBLASLt, with the names and
// semantics of support/matmul.h's, the CPU's (lora.h calls them by these names):
//   forward   out (N, O) = [out +] alpha * inp (N, I) @ weight (O, I)^T   (torch Linear layout)
//   backward  dinp (N, I) += alpha * dout (N, O) @ weight (O, I)
//             dweight (O, I) += alpha * dout^T @ inp          (either output may be NULL)
// Inputs are float, bf16 or fp16; products accumulate in fp32 (CUBLAS_COMPUTE_32F: true
// fp32 for float inputs, no TF32, so --precision fp32 stays close to the CPU).
// Outputs are the input type, or fp32 where a float pointer is passed (logits for
// the loss, gradients of trainable weights, which are always fp32).
//
// cuBLAS is column-major and our tensors are row-major: a row-major (r, c) matrix,
// read column-major, is its transpose (c, r). So each product is computed for the
// transposes, e.g. out = inp W^T becomes out^T (O, N) = W (O, I) @ inp^T (I, N),
// where cuBLAS sees inp^T as stored and W as the transpose of what is stored.
//
// Each kind of product (shape, types, alignments) gets a plan once: cuBLASLt's
// descriptor, layouts and the algorithm its heuristic picks, kept in a small
// table; where the heuristic finds none, the plan says so and the product runs
// through cublasGemmEx instead, which has a kernel for every shape.
#pragma once
#include <stdint.h>
#include <string.h>
#include <cublas_v2.h>
#include "cuda_common.cuh"

// one cuBLASLt handle and one workspace for every matmul; 32 MiB is what cuBLASLt
// asks for on Hopper. cublas_handle is the fallback's (below), made at its first use.
inline cublasLtHandle_t cublaslt_handle = NULL;
inline cublasHandle_t cublas_handle = NULL;
inline void *cublaslt_workspace = NULL;
constexpr size_t CUBLASLT_WORKSPACE_BYTES = 32u << 20;

// Creates them; the first matmul calls it, but call it up front when the first
// matmul might run inside a CUDA graph capture (it allocates).
inline void matmul_setup(void) {
    if (cublaslt_handle) return;
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    cublaslt_workspace = cudaMallocCheck(CUBLASLT_WORKSPACE_BYTES);
}

template <typename T> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <> constexpr cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }

// the largest power of two (at most 256) that divides the address: cuBLASLt must be
// told, or it may pick a kernel that assumes 256-byte aligned operands
inline uint32_t pointer_alignment(const void *p) {
    uint32_t a = 256;
    while ((uintptr_t)p % a) a /= 2;
    return a;
}

// ----------------------------------------------------------------------------
// plans: what cuBLASLt needs for one kind of product, made once and kept

// What a plan depends on: the shape, the transposes, the types, the pointers'
// alignments (the kernels cuBLASLt may pick depend on them) and whether D is read.
struct MatmulKey { int m, n, k, trans_a, trans_b, type_ab, type_d, align_a, align_b, align_d, read_d; };

// cuBLASLt's descriptor, matrix layouts and the algorithm its heuristic picked;
// or, where the heuristic has none (LoRA's r = 4 products have 8-byte rows in
// bf16, narrower than many of its kernels take), fallback: the product runs
// through cublasGemmEx, which has a kernel for every shape, type and alignment.
struct MatmulPlan {
    MatmulKey key;
    uint64_t last_use; // matmul_clock at its last use; 0: the entry is empty
    bool fallback;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};

// 1024 plans in 128 sets of 8; a key's hash picks its set. A training run uses a
// few hundred (per chunk shape: each linear layer's forward, dinp and dweight
// products, LoRA's six per module shape, at the alignments its rows fall on, and
// the head's); when a set is full, its least recently used plan is destroyed and
// the entry reused, so a plan evicted and needed again is made again.
constexpr int MATMUL_PLAN_SETS = 128, MATMUL_PLAN_WAYS = 8;
inline MatmulPlan matmul_plans[MATMUL_PLAN_SETS * MATMUL_PLAN_WAYS];
inline uint64_t matmul_clock = 0;
inline long matmul_fallback_calls = 0; // products run through the fallback (dev/cuda/matmul.cu reports the path)
inline bool matmul_force_fallback = false; // set to run every product through the fallback (checks, debugging)

// destroys p's cuBLASLt objects, if it has them
inline void plan_release(MatmulPlan *p) {
    if (!p->desc) return;
    cublasCheck(cublasLtMatrixLayoutDestroy(p->la));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->ld));
    cublasCheck(cublasLtMatmulDescDestroy(p->desc));
    p->desc = NULL;
}

inline const char *cuda_type_name(int t) {
    return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "fp16" : t == CUDA_R_32F ? "fp32" : "?";
}

// Makes the plan for key in p: the descriptor and layouts of the column-major
// product D (m, n) = op(A) (m, k) op(B) (k, n) with every matrix dense (ld = its
// rows), and the heuristic's first algorithm; or the fallback where it has none,
// which stderr hears of the first few times (it is slower to launch).
inline void plan_make(MatmulPlan *p, const MatmulKey &key) {
    static int notes = 0;
    p->key = key;
    p->fallback = false;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    // stored shapes: op(A) is (m, k), so A is (k, m) when transposed
    int a_rows = key.trans_a ? key.k : key.m, b_rows = key.trans_b ? key.n : key.k;
    cudaDataType_t tab = (cudaDataType_t)key.type_ab;
    cublasCheck(cublasLtMatrixLayoutCreate(&p->la, tab, a_rows, key.trans_a ? key.m : key.k, a_rows));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->lb, tab, b_rows, key.trans_b ? key.k : key.n, b_rows));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->ld, (cudaDataType_t)key.type_d, key.m, key.n, key.m));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = CUBLASLT_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t align[4] = {(uint32_t)key.align_a, (uint32_t)key.align_b, (uint32_t)key.align_d, (uint32_t)key.align_d};
    cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]));
    // "none" comes back as no result, or for some configurations as NOT_SUPPORTED
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, p->desc, p->la, p->lb, p->ld, p->ld, pref,
                                                           1, &heuristic, &found);
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) cublasCheck(status);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (status == CUBLAS_STATUS_SUCCESS && found > 0 && heuristic.state == CUBLAS_STATUS_SUCCESS) {
        p->algo = heuristic.algo;
        return;
    }
    plan_release(p);
    p->fallback = true;
    if (notes++ < 4)
        fprintf(stderr, "note: cuBLASLt has no kernel for the column-major product (%d, %d) = op%s (%d, %d) op%s (%d, %d), "
                "%s in, %s out, alignments %d/%d/%d bytes: such products run through cublasGemmEx%s\n", key.m, key.n,
                key.trans_a ? "T" : "N", key.m, key.k, key.trans_b ? "T" : "N", key.k, key.n,
                cuda_type_name(key.type_ab), cuda_type_name(key.type_d), key.align_a, key.align_b, key.align_d,
                notes == 4 ? " (further ones are not noted)" : "");
}

// the plan for key: the one kept, or a new one in its set's empty or least recently used entry
inline MatmulPlan *matmul_plan(const MatmulKey &key) {
    int v[sizeof key / sizeof(int)];
    memcpy(v, &key, sizeof key);
    uint64_t h = 0xcbf29ce484222325ull; // FNV-1a over the key's numbers
    for (int x : v) h = (h ^ (uint32_t)x) * 0x100000001b3ull;
    MatmulPlan *set = matmul_plans + (h % MATMUL_PLAN_SETS) * MATMUL_PLAN_WAYS, *victim = set;
    for (MatmulPlan *p = set; p < set + MATMUL_PLAN_WAYS; p++) {
        if (p->last_use && memcmp(&p->key, &key, sizeof key) == 0) {
            p->last_use = ++matmul_clock;
            return p;
        }
        if (p->last_use < victim->last_use) victim = p;
    }
    plan_release(victim);
    plan_make(victim, key);
    victim->last_use = ++matmul_clock;
    return victim;
}

// cuBLAS's general product, for what cuBLASLt has no kernel for: fp32 compute
// (CUBLAS_COMPUTE_32F, no TF32) as cuBLASLt's, the same column-major arguments.
// It shares cuBLASLt's workspace, as every product does: they run one after
// another on one stream (the trainer's compute stream).
template <typename TD, typename T>
void gemm_fallback(TD *d, const T *a, const T *b, const MatmulKey &key, float alpha, float beta, cudaStream_t stream) {
    if (!cublas_handle) cublasCheck(cublasCreate(&cublas_handle));
    // in this order: cublasSetStream puts the handle back on cuBLAS's own workspace pool
    cublasCheck(cublasSetStream(cublas_handle, stream));
    cublasCheck(cublasSetWorkspace(cublas_handle, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES));
    cublasOperation_t op_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasGemmEx(cublas_handle, op_a, op_b, key.m, key.n, key.k, &alpha, a, cuda_type<T>(),
                             key.trans_a ? key.k : key.m, b, cuda_type<T>(), key.trans_b ? key.n : key.k, &beta, d,
                             cuda_type<TD>(), key.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    matmul_fallback_calls++;
}

// Column-major D (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * D, with op
// a transpose where trans_a / trans_b say; every matrix is dense (ld = its rows).
template <typename TD, typename T>
void cublaslt_matmul(TD *d, const T *a, const T *b, int m, int n, int k, bool trans_a, bool trans_b,
                     float alpha, float beta, cudaStream_t stream) {
    if (m == 0 || n == 0) return;
    if (k == 0) { // an empty sum: out = beta * out, as the CPU's gemm
        if (beta == 0.0f) cudaCheck(cudaMemsetAsync(d, 0, (size_t)m * n * sizeof(TD), stream));
        return;
    }
    matmul_setup();
    MatmulKey key = {m, n, k, trans_a, trans_b, cuda_type<T>(), cuda_type<TD>(), (int)pointer_alignment(a),
                     (int)pointer_alignment(b), (int)pointer_alignment(d), beta != 0.0f};
    const MatmulPlan *p = matmul_force_fallback ? NULL : matmul_plan(key);
    if (!p || p->fallback) {
        gemm_fallback(d, a, b, key, alpha, beta, stream);
        return;
    }
    cublasCheck(cublasLtMatmul(cublaslt_handle, p->desc, &alpha, a, p->la, b, p->lb, &beta, d, p->ld, d, p->ld,
                               &p->algo, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream));
}

// destroys the plans, the handles and the workspace (a check calls it before it
// ends, so that compute-sanitizer's leak check finds nothing); the next matmul starts afresh
inline void matmul_free(void) {
    for (MatmulPlan &p : matmul_plans) plan_release(&p);
    memset(matmul_plans, 0, sizeof matmul_plans);
    if (cublas_handle) cublasCheck(cublasDestroy(cublas_handle));
    if (cublaslt_handle) cublasCheck(cublasLtDestroy(cublaslt_handle));
    if (cublaslt_workspace) cudaCheck(cudaFree(cublaslt_workspace));
    cublas_handle = NULL;
    cublaslt_handle = NULL;
    cublaslt_workspace = NULL;
}

// Arguments that may be NULL get this type: a NULL there does not take part in
// working out T, which comes from the arguments that are never NULL.
template <typename T> struct type_identity { using type = T; };
template <typename T> using same_type = typename type_identity<T>::type;

// out (N, O) = [out +] alpha * inp (N, I) @ weight (O, I)^T. The stream defaults to
// the legacy default stream because lora.h calls the CPU's eight-argument form.
template <typename TO, typename T>
void matmul_forward(TO *out, const T *inp, const T *weight, int N, int I, int O, float alpha, int accumulate,
                    cudaStream_t stream = 0) {
    // out^T (O, N) = W (O, I) @ inp^T (I, N): W is the transpose of what cuBLAS sees, inp^T is as seen
    cublaslt_matmul(out, weight, inp, O, N, I, true, false, alpha, accumulate ? 1.0f : 0.0f, stream);
}

// dinp (N, I) += alpha * dout (N, O) @ weight (O, I); dweight (O, I) += alpha * dout^T @ inp.
// dinp and inp may be NULL when dweight is, and weight when dinp is (frozen weights need no dweight).
template <typename T>
void matmul_backward(same_type<T> *dinp, float *dweight, const T *dout, const same_type<T> *inp,
                     const same_type<T> *weight, int N, int I, int O, float alpha, cudaStream_t stream = 0) {
    // dinp^T (I, N) += W^T (I, O) @ dout^T (O, N): both as cuBLAS sees them
    if (dinp) cublaslt_matmul(dinp, weight, dout, I, N, O, false, false, alpha, 1.0f, stream);
    // dW^T (I, O) += inp^T (I, N) @ dout (N, O): inp^T as seen, dout the transpose of what is seen
    if (dweight) cublaslt_matmul(dweight, inp, dout, I, O, N, false, true, alpha, 1.0f, stream);
}
