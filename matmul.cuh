// matmul_forward / matmul_backward on the GPU through cuBLASLt, with the names and
// semantics of train_llama2.c's (lora.h calls them by these names):
//   forward   out (N, O) = [out +] alpha * inp (N, I) @ weight (O, I)^T   (torch Linear layout)
//   backward  dinp (N, I) += alpha * dout (N, O) @ weight (O, I)
//             dweight (O, I) += alpha * dout^T @ inp          (either output may be NULL)
// Inputs are float or bf16; products accumulate in fp32 (CUBLAS_COMPUTE_32F: true
// fp32 for float inputs, no TF32, so --precision fp32 stays close to the CPU).
// Outputs are the input type, or fp32 where a float pointer is passed (logits for
// the loss, gradients of trainable weights, which are always fp32).
//
// cuBLAS is column-major and our tensors are row-major: a row-major (r, c) matrix,
// read column-major, is its transpose (c, r). So each product is computed for the
// transposes, e.g. out = inp W^T becomes out^T (O, N) = W (O, I) @ inp^T (I, N),
// where cuBLAS sees inp^T as stored and W as the transpose of what is stored.
#pragma once
#include <stdint.h>
#include "cuda_common.cuh"

// one handle and one workspace for every matmul; 32 MiB is what cuBLASLt asks for on Hopper
inline cublasLtHandle_t cublaslt_handle = NULL;
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

// the largest power of two (at most 256) that divides the address: cuBLASLt must be
// told, or it may pick a kernel that assumes 256-byte aligned operands
inline uint32_t pointer_alignment(const void *p) {
    uint32_t a = 256;
    while ((uintptr_t)p % a) a /= 2;
    return a;
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
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    // stored shapes: op(A) is (m, k), so A is (k, m) when transposed
    cublasLtMatrixLayout_t la, lb, ld;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, cuda_type<T>(), trans_a ? k : m, trans_a ? m : k, trans_a ? k : m));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, cuda_type<T>(), trans_b ? n : k, trans_b ? k : n, trans_b ? n : k));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, cuda_type<TD>(), m, n, m));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = CUBLASLT_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t align[4] = {pointer_alignment(a), pointer_alignment(b), pointer_alignment(d), pointer_alignment(d)};
    cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, la, lb, ld, ld, pref, 1, &heuristic, &found));
    if (found == 0) {
        fprintf(stderr, "[cuBLASLt ERROR] %s:%d: no kernel for the column-major product (%d, %d) = op%s (%d, %d) "
                "op%s (%d, %d), types %d/%d, alignments %u/%u/%u bytes\n", __FILE__, __LINE__, m, n,
                trans_a ? "T" : "N", m, k, trans_b ? "T" : "N", k, n, (int)cuda_type<T>(), (int)cuda_type<TD>(),
                align[0], align[1], align[2]);
        exit(EXIT_FAILURE);
    }
    cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heuristic.algo,
                               cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
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
