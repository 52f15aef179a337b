// Planted bug: a linear layer's forward, out (N, O) = inp (N, I) @ W (O, I)^T with
// row-major tensors, through support/matmul.cuh's cublaslt_matmul with the wrong
// transpose flag for the weight. cuBLAS is column-major: it computes
// out^T (O, N) = op(A) (O, I) @ inp^T (I, N), and sees the row-major W (O, I) as the
// column-major (I, O) matrix W^T, so op(A) must transpose it (CUBLAS_OP_T). With
// CUBLAS_OP_N it reads W's numbers as a column-major (O, I) matrix, as if W were
// stored (I, O): same shapes, no error, a wrong product. Plain row-major loops
// must catch it, naming the worst element (exit 1); given "fixed", the right flag
// passes.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include "../../support/matmul.cuh"

int main(int argc, char **argv) {
    bool fixed = argc > 1 && !strcmp(argv[1], "fixed");
    const int N = 3, I = 5, O = 4;
    // small integers: every product and sum is exact in fp32, so the loops and
    // cuBLASLt must agree exactly (tolerance 0) whatever order either sums in
    std::vector<float> inp(N * I), w(O * I), want(N * O, 0.0f), out(N * O);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) inp[n * I + i] = (float)((n + 2 * i) % 5 - 2);
    for (int o = 0; o < O; o++)
        for (int i = 0; i < I; i++) w[o * I + i] = (float)((3 * o + i) % 7 - 3);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int i = 0; i < I; i++) want[n * O + o] += inp[n * I + i] * w[o * I + i];
    float *d_inp, *d_w, *d_out;
    cudaCheck(cudaMalloc(&d_inp, inp.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&d_w, w.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&d_out, out.size() * sizeof(float)));
    cudaCheck(cudaMemcpy(d_inp, inp.data(), inp.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_w, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice));
    bool transpose_w = fixed; // PLANTED: CUBLAS_OP_N for the weight, where CUBLAS_OP_T is right
    cublaslt_matmul(d_out, d_w, d_inp, O, N, I, transpose_w, false, 1.0f, 0.0f, 0);
    cudaCheck(cudaMemcpy(out.data(), d_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    int worst = 0;
    for (int e = 0; e < N * O; e++)
        if (fabsf(out[e] - want[e]) > fabsf(out[worst] - want[worst])) worst = e;
    if (out[worst] != want[worst]) {
        fprintf(stderr, "gemm_transposed: out[%d][%d] = %g, want %g (the worst of %d elements): the product does not "
                "match the row-major loops\n", worst / O, worst % O, out[worst], want[worst], N * O);
        return 1;
    }
    printf("gemm_transposed: out = inp @ W^T\n");
    return 0;
}
