// dev/emu/blas.h, the emulated build's cuBLAS and cuBLASLt, against cuBLAS's
// documented definitions only: every expected value below is worked out by hand
// from D = alpha * op(A) op(B) + beta * C over column-major matrices (element
// (i, j) at X[i + j * ld]) and written out as a literal, so that nothing here
// shares a mistake with the layer or with how the trainer calls it (a transposed
// operand in support/matmul.cuh cannot be cancelled by the same one here).
// Compiled as C++ (no kernels, no source rewrite) with blas_test_prelude.h standing
// in for the runtime: operations run at once, or are held until the test runs them.
#include "blas.h"
#include "test_common.h"
#include "stderr_of.h"
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>
#include <unistd.h>

static const float P = NAN;     // padding below a column (ld > rows): read, it would poison the sum
static const float S = -777.0f; // padding of D: must be left as it is

// device-like memory: 256-byte aligned copies (freed at the end)
static std::vector<void *> allocations;
template <typename T> static T *copy_of(std::vector<T> v) {
    T *p = (T *)aligned_alloc(256, 256 * ((v.size() * sizeof(T) + 255) / 256 + 1));
    memcpy(p, v.data(), v.size() * sizeof(T));
    allocations.push_back(p);
    return p;
}
static __nv_bfloat16 bf(uint16_t bits) {
    __nv_bfloat16 h;
    h.__x = bits;
    return h;
}
static __half hf(uint16_t bits) {
    __half h;
    h.__x = bits;
    return h;
}

// got[0 .. want.size()) equals want exactly (the values are exact in fp32)
static void check_floats(const char *what, const float *got, std::vector<float> want) {
    size_t bad = want.size();
    for (size_t i = 0; i < want.size() && bad == want.size(); i++)
        if (!(got[i] == want[i])) bad = i;
    CHECK(bad == want.size(), what, "element %zu is %.9g, expected %.9g", bad, bad < want.size() ? got[bad] : 0.0,
          bad < want.size() ? want[bad] : 0.0);
}
template <typename H> static void check_bits(const char *what, const H *got, std::vector<uint16_t> want) {
    size_t bad = want.size();
    for (size_t i = 0; i < want.size() && bad == want.size(); i++)
        if (got[i].__x != want[i]) bad = i;
    CHECK(bad == want.size(), what, "element %zu is 0x%04x, expected 0x%04x", bad,
          bad < want.size() ? got[bad].__x : 0, bad < want.size() ? want[bad] : 0);
}

// ----------------------------------------------------------------------------
// one cublasLtMatmul as the documentation describes its use: a descriptor with
// TRANSA/TRANSB, a layout per matrix as stored (C and D share one when C == D),
// the heuristic's first algorithm for a preference, then the product

static cublasLtHandle_t lt;

struct LtCall {
    cublasOperation_t ta, tb;
    int m, n, k;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    const void *C;
    int ldc;
    void *D;
    int ldd;
    float alpha = 1.0f, beta = 0.0f;
    cudaDataType_t tab = CUDA_R_32F, tcd = CUDA_R_32F;
    uint32_t align = 256; // the preference's minimum alignment of every operand
    cudaStream_t stream = NULL;
};

static cublasStatus_t lt_matmul(const LtCall &c) {
    cublasLtMatmulDesc_t desc;
    cublasStatus_t st = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st) return st;
    int32_t ta = c.ta, tb = c.tb;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    // stored: A (m, k) or (k, m) when transposed; B (k, n) or (n, k)
    bool at = c.ta == CUBLAS_OP_T, bt = c.tb == CUBLAS_OP_T;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatrixLayoutCreate(&la, c.tab, at ? c.k : c.m, at ? c.m : c.k, c.lda);
    cublasLtMatrixLayoutCreate(&lb, c.tab, bt ? c.n : c.k, bt ? c.k : c.n, c.ldb);
    cublasLtMatrixLayoutCreate(&ld, c.tcd, c.m, c.n, c.ldd);
    bool shared = c.C == c.D && c.ldc == c.ldd;
    if (shared) lc = ld;
    else cublasLtMatrixLayoutCreate(&lc, c.tcd, c.m, c.n, c.ldc);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    for (int a = CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES; a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES; a++)
        cublasLtMatmulPreferenceSetAttribute(pref, (cublasLtMatmulPreferenceAttributes_t)a, &c.align, sizeof c.align);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &h, &found);
    if (st == CUBLAS_STATUS_SUCCESS)
        st =
            cublasLtMatmul(lt, desc, &c.alpha, c.A, la, c.B, lb, &c.beta, c.C, lc, c.D, ld, &h.algo, NULL, 0, c.stream);
    cublasLtMatmulPreferenceDestroy(pref);
    if (!shared) cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    return st;
}

// status and stderr of f: the status wanted, and stderr naming what was refused
static void check_refusal(const char *what, cublasStatus_t want, const char *says,
                          const std::function<cublasStatus_t()> &f) {
    cublasStatus_t got = CUBLAS_STATUS_SUCCESS;
    std::string err = stderr_of([&] { got = f(); });
    CHECK(got == want && err.find(says) != std::string::npos, what, "status %s (expected %s), stderr: %s",
          cublasLtGetStatusString(got), cublasLtGetStatusString(want), err.c_str());
}

// ----------------------------------------------------------------------------
// the worked example (fp32)
//
// op(A) (2, 3) = [1 2 3]    op(B) (3, 2) = [ 7  8]    op(A) op(B) = [ 58  64]
//                [4 5 6]                   [ 9 10]                  [139 154]
//                                          [11 12]
// e.g. (0, 0) = 1*7 + 2*9 + 3*11 = 7 + 18 + 33 = 58; (1, 1) = 4*8 + 5*10 + 6*12 = 32 + 50 + 72 = 154.
// Stored column-major, each with a leading dimension above its rows (padding P):
//   A as is (2, 3), lda 3:            1 4 P | 2 5 P | 3 6 P
//   A transposed (3, 2), lda 4:       1 2 3 P | 4 5 6 P        (TRANSA = T)
//   B as is (3, 2), ldb 4:            7 9 11 P | 8 10 12 P
//   B transposed (2, 3), ldb 3:       7 8 P | 9 10 P | 11 12 P  (TRANSB = T)
//   D (2, 2), ldd 3:                  58 139 S | 64 154 S

static const std::vector<float> A_N = {1, 4, P, 2, 5, P, 3, 6, P}, A_T = {1, 2, 3, P, 4, 5, 6, P};
static const std::vector<float> B_N = {7, 9, 11, P, 8, 10, 12, P}, B_T = {7, 8, P, 9, 10, P, 11, 12, P};
static const std::vector<float> D_WANT = {58, 139, S, 64, 154, S};

static void check_transposes(void) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            // in place (C == D, one layout), beta 0, D's elements NaN before: documented as not read
            float *D = copy_of<float>({P, P, S, P, P, S});
            LtCall c = {ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, 2, 2, 3,
                        copy_of(ta ? A_T : A_N), ta ? 4 : 3, copy_of(tb ? B_T : B_N), tb ? 3 : 4, D, 3, D, 3};
            char what[128];
            snprintf(what, sizeof what,
                     "cublasLtMatmul TRANSA %s TRANSB %s, lda/ldb/ldd above the rows, beta 0 over NaN", ta ? "T" : "N",
                     tb ? "T" : "N");
            cublasStatus_t st = lt_matmul(c);
            if (st) CHECK(0, what, "status %s", cublasLtGetStatusString(st));
            else check_floats(what, D, D_WANT);
        }
}

static void check_alpha_beta(void) {
    // alpha 2, beta 0.5, C (2, 2) = [1 2; 3 4] out of place, ldc 2 (C: 1 3 2 4), D ldd 3:
    // (0, 0) = 2*58 + 0.5*1 = 116.5, (1, 0) = 2*139 + 0.5*3 = 279.5,
    // (0, 1) = 2*64 + 0.5*2 = 129,   (1, 1) = 2*154 + 0.5*4 = 310
    float *C = copy_of<float>({1, 3, 2, 4}), *D = copy_of<float>({P, P, S, P, P, S});
    LtCall c = {CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, copy_of(A_N), 3, copy_of(B_N), 4, C, 2, D, 3, 2.0f, 0.5f};
    lt_matmul(c);
    check_floats("cublasLtMatmul alpha 2 beta 0.5, C out of place with its own ld: D", D,
                 {116.5f, 279.5f, S, 129, 310, S});
    check_floats("cublasLtMatmul alpha 2 beta 0.5, C out of place: C is left as it was", C, {1, 3, 2, 4});

    // in place accumulation, beta 1: D = C + op(A) op(B) = [1+58 2+64; 3+139 4+154]
    D = copy_of<float>({1, 3, S, 2, 4, S});
    c.C = c.D = D, c.ldc = 3, c.alpha = 1.0f, c.beta = 1.0f;
    lt_matmul(c);
    check_floats("cublasLtMatmul in place (C == D), beta 1", D, {59, 142, S, 66, 158, S});

    // C with ld 0 (documented: one column for every column of D): C = [10; 20]
    C = copy_of<float>({10, 20});
    D = copy_of<float>({P, P, S, P, P, S});
    c.C = C, c.ldc = 0, c.D = D;
    lt_matmul(c);
    check_floats("cublasLtMatmul C with ld 0 broadcast over D's columns", D, {68, 159, S, 74, 174, S});

    // beta 0 out of place: C all NaN is not read
    C = copy_of<float>({P, P, P, P});
    D = copy_of<float>({P, P, S, P, P, S});
    c.C = C, c.ldc = 2, c.D = D, c.beta = 0.0f;
    lt_matmul(c);
    check_floats("cublasLtMatmul beta 0 out of place: a NaN C does not reach D", D, D_WANT);
}

// ----------------------------------------------------------------------------
// bf16 in: read as stored, widened exactly, products summed in fp32

static void check_bf16_inputs(void) {
    // (1, 3) [1 1 1] times (3, 1) [256 1 1]: fp32 sums 256 + 1 + 1 = 258. Summed in bf16
    // (8 significant bits) 256 + 1 = 257 would round back to 256 (ties to even), twice: 256.
    // 258 = 256 * (1 + 2^-7) is a bf16 too, so both outputs hold it. bits: 1 = 0x3F80, 256 = 0x4380, 258 = 0x4381
    __nv_bfloat16 *A = copy_of<__nv_bfloat16>({bf(0x3F80), bf(0x3F80), bf(0x3F80)});
    __nv_bfloat16 *B = copy_of<__nv_bfloat16>({bf(0x4380), bf(0x3F80), bf(0x3F80)});
    float *D = copy_of<float>({P});
    LtCall c = {CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 3, A, 1, B, 3, D, 1, D, 1};
    c.tab = CUDA_R_16BF;
    lt_matmul(c);
    check_floats("cublasLtMatmul bf16 in, fp32 out: the sum is fp32's (258, not bf16's 256)", D, {258});
    __nv_bfloat16 *Dh = copy_of<__nv_bfloat16>({bf(0x7FFF)});
    c.C = c.D = Dh, c.tcd = CUDA_R_16BF;
    lt_matmul(c);
    check_bits("cublasLtMatmul bf16 in, bf16 out: the sum is fp32's (258 = 0x4381)", Dh, {0x4381});

    // the inputs as stored: (1 + 2^-7) = 0x3F81, -1 = 0xBF80.
    // [1+2^-7, 1+2^-7] . [1+2^-7, -1] = (1 + 2^-6 + 2^-14) - (1 + 2^-7) = 2^-7 + 2^-14 = 0.00787353515625
    A = copy_of<__nv_bfloat16>({bf(0x3F81), bf(0x3F81)});
    B = copy_of<__nv_bfloat16>({bf(0x3F81), bf(0xBF80)});
    D = copy_of<float>({P});
    c = {CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, A, 1, B, 2, D, 1, D, 1};
    c.tab = CUDA_R_16BF;
    lt_matmul(c);
    check_floats("cublasLtMatmul bf16 inputs widened exactly (2^-7 + 2^-14)", D, {0.00787353515625f});
}

// bf16 out: rounded once, to nearest, ties to even
static void check_bf16_rounding(void) {
    // op(A) (4, 2) times [1; 1]: rows sum to
    //   1 + 2^-8                halfway between 1 (0x3F80) and 1 + 2^-7 (0x3F81): to even, 0x3F80
    //   1 + 2^-7 + 2^-8         halfway between 0x3F81 and 1 + 2^-6 (0x3F82): to even, 0x3F82
    //   -(1 + 2^-8)             to even, -1 (0xBF80)
    //   1 + 2^-8 + 2^-15        past halfway: 0x3F81
    // (truncation would give 0x3F80 0x3F81 0xBF80 0x3F80; ties away from zero 0x3F81 0x3F82 0xBF81 0x3F81)
    // A stored (4, 2), lda 4: column 0 = 1, 1+2^-7, -1, 1; column 1 = 2^-8, 2^-8, -2^-8, 2^-8 + 2^-15
    __nv_bfloat16 *A = copy_of<__nv_bfloat16>({bf(0x3F80), bf(0x3F81), bf(0xBF80), bf(0x3F80), bf(0x3B80), bf(0x3B80),
                                               bf(0xBB80), bf(0x3B81)});
    __nv_bfloat16 *B = copy_of<__nv_bfloat16>({bf(0x3F80), bf(0x3F80)});
    __nv_bfloat16 *D = copy_of<__nv_bfloat16>({bf(0x7FFF), bf(0x7FFF), bf(0x7FFF), bf(0x7FFF)});
    LtCall c = {CUBLAS_OP_N, CUBLAS_OP_N, 4, 1, 2, A, 4, B, 2, D, 4, D, 4};
    c.tab = c.tcd = CUDA_R_16BF;
    lt_matmul(c);
    check_bits("cublasLtMatmul bf16 out rounds to nearest, ties to even", D, {0x3F80, 0x3F82, 0xBF80, 0x3F81});
}

// fp16 in and out (CUDA_R_16F, cudaDataType 2): read as stored, widened exactly, summed in
// fp32, rounded once to nearest, ties to even. fp16 bits: 1 = 0x3C00, 2048 = 0x6800,
// 2^-11 = 0x1000, 1 + 2^-10 = 0x3C01
static void check_fp16(void) {
    // [1 1 1] . [2048 1 1]: fp32 sums 2050 = 2048 (1 + 2^-10) = 0x6801; summed in fp16 (11
    // significant bits) 2048 + 1 would round back to 2048 (ties to even), twice: 2048
    __half *A = copy_of<__half>({hf(0x3C00), hf(0x3C00), hf(0x3C00)});
    __half *B = copy_of<__half>({hf(0x6800), hf(0x3C00), hf(0x3C00)});
    float *D = copy_of<float>({P});
    LtCall c = {CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 3, A, 1, B, 3, D, 1, D, 1};
    c.tab = CUDA_R_16F;
    lt_matmul(c);
    check_floats("cublasLtMatmul fp16 in, fp32 out: the sum is fp32's (2050, not fp16's 2048)", D, {2050});
    __half *Dh = copy_of<__half>({hf(0x7FFF)});
    c.C = c.D = Dh, c.tcd = CUDA_R_16F;
    lt_matmul(c);
    check_bits("cublasLtMatmul fp16 in, fp16 out: the sum is fp32's (2050 = 0x6801)", Dh, {0x6801});
    // fp16 out: op(A) (4, 2) times [1; 1], rows 1 + 2^-11 (a tie: to even, 0x3C00),
    // 1 + 2^-10 + 2^-11 (a tie: up to the even 0x3C02), -(1 + 2^-11) (0xBC00), 1 + 2^-11 + 2^-20
    // (past halfway: 0x3C01). Column 1 = 2^-11, 2^-11, -2^-11, 2^-11 + 2^-20 (= 2^-11 (1 + 2^-9): 0x1002)
    A = copy_of<__half>({hf(0x3C00), hf(0x3C01), hf(0xBC00), hf(0x3C00), hf(0x1000), hf(0x1000), hf(0x9000), hf(0x1002)});
    B = copy_of<__half>({hf(0x3C00), hf(0x3C00)});
    Dh = copy_of<__half>({hf(0x7FFF), hf(0x7FFF), hf(0x7FFF), hf(0x7FFF)});
    c = {CUBLAS_OP_N, CUBLAS_OP_N, 4, 1, 2, A, 4, B, 2, Dh, 4, Dh, 4};
    c.tab = c.tcd = CUDA_R_16F;
    lt_matmul(c);
    check_bits("cublasLtMatmul fp16 out rounds to nearest, ties to even", Dh, {0x3C00, 0x3C02, 0xBC00, 0x3C01});
    // above 65504 (and past halfway to 2^16, 65520): infinity, as the hardware's conversion
    A = copy_of<__half>({hf(0x7BFF), hf(0x7BFF)}); // 65504, twice
    B = copy_of<__half>({hf(0x3C00), hf(0x3C00)});
    Dh = copy_of<__half>({hf(0)});
    c = {CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, A, 1, B, 2, Dh, 1, Dh, 1};
    c.tab = c.tcd = CUDA_R_16F;
    lt_matmul(c);
    check_bits("cublasLtMatmul fp16 out overflows to infinity (65504 + 65504)", Dh, {0x7C00});
}

// the layer's own order (dev/emu/README.md): l = 0 .. k-1, each step one fused multiply-add
static void check_order(void) {
    // [2^24, 1, -2^24] . [1, 1, 1]: 2^24, then 2^24 + 1 rounds to 2^24 (ties to even), then 0.
    // (Summing the two large ones first would give 1.)
    float *D = copy_of<float>({P});
    LtCall c = {CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 3, copy_of<float>({16777216.0f, 1, -16777216.0f}), 1,
                copy_of<float>({1, 1, 1}), 3, D, 1, D, 1};
    lt_matmul(c);
    check_floats("cublasLtMatmul sums l = 0 .. k-1 in order", D, {0});
    // [1, 1 + 2^-12] . [-1, 1 + 2^-12] = -1 + (1 + 2^-11 + 2^-24): fused, 2^-11 + 2^-24; the product
    // rounded first (1 + 2^-11, its 2^-24 a tie to even) would give 2^-11
    c.A = copy_of<float>({1, 1.000244140625f}), c.B = copy_of<float>({-1, 1.000244140625f}), c.k = 2, c.ldb = 2;
    lt_matmul(c);
    check_floats("cublasLtMatmul accumulates with fused multiply-adds", D, {0.00048834085464477539f});
}

// the product runs where it is enqueued, with what the call passed (copied at the call)
static void check_streams(void) {
    cudaStream_t s = (cudaStream_t)(uintptr_t)0x5100; // the stand-in runtime never uses it
    float *D = copy_of<float>({P, P, S, P, P, S});
    LtCall c = {CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, copy_of(A_N), 3, copy_of(B_N), 4, D, 3, D, 3};
    c.stream = s, c.alpha = 2.0f;
    emu_test::hold = true;
    lt_matmul(c); // alpha, the descriptor and the layouts are gone before it runs
    c.alpha = 100.0f;
    bool untouched = std::isnan(D[0]);
    emu_test::hold = false;
    emu_test::run_held();
    CHECK(emu_test::last_stream == s && emu_test::last_what == "cublasLtMatmul" && untouched, "cublasLtMatmul is "
          "enqueued on its stream argument, not run at the call", "stream %p, name %s, D before %g",
          (void *)emu_test::last_stream, emu_test::last_what.c_str(), D[0]);
    check_floats("cublasLtMatmul uses alpha as it was at the call", D, {116, 278, S, 128, 308, S});
}

// ----------------------------------------------------------------------------
// cublasGemmEx: the same definitions, C in place

static void check_gemmex(void) {
    cublasHandle_t h;
    cublasCreate(&h);
    cudaStream_t s = (cudaStream_t)(uintptr_t)0x5200;
    void *workspace = aligned_alloc(256, 256);
    CHECK(cublasSetWorkspace(h, workspace, 256) == CUBLAS_STATUS_SUCCESS &&
              cublasSetStream(h, s) == CUBLAS_STATUS_SUCCESS,
          "cublasSetWorkspace and cublasSetStream", "a call failed");
    float alpha = 1.0f, beta = 0.0f;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *C = copy_of<float>({P, P, S, P, P, S});
            cublasStatus_t st = cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, 2, 2, 3,
                                             &alpha, copy_of(ta ? A_T : A_N), CUDA_R_32F, ta ? 4 : 3,
                                             copy_of(tb ? B_T : B_N), CUDA_R_32F, tb ? 3 : 4, &beta, C, CUDA_R_32F, 3,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            char what[128];
            snprintf(what, sizeof what, "cublasGemmEx transa %s transb %s, beta 0 over NaN", ta ? "T" : "N",
                     tb ? "T" : "N");
            if (st) CHECK(0, what, "status %s", cublasGetStatusString(st));
            else check_floats(what, C, D_WANT);
        }
    CHECK(emu_test::last_stream == s && emu_test::last_what == "cublasGemmEx", "cublasGemmEx is enqueued on "
          "cublasSetStream's stream", "stream %p, name %s", (void *)emu_test::last_stream, emu_test::last_what.c_str());
    // k = 0: an empty sum, C = beta * C (alpha 1, beta 0.5): [1 3 | 2 4] -> [0.5 1.5 | 1 2]
    float *C = copy_of<float>({1, 3, 2, 4});
    beta = 0.5f;
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 0, &alpha, NULL, CUDA_R_32F, 2, NULL, CUDA_R_32F, 1, &beta, C,
                 CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    check_floats("cublasGemmEx k = 0 gives beta * C", C, {0.5f, 1.5f, 1, 2});

    const float *A = copy_of(A_N), *B = copy_of(B_N);
    auto gemm = [&](cublasOperation_t ta, int lda, cudaDataType_t tc, cublasComputeType_t ct, int algo) {
        return [=] {
            return cublasGemmEx(h, ta, CUBLAS_OP_N, 2, 2, 3, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, 4, &beta, C, tc,
                                2, ct, (cublasGemmAlgo_t)algo);
        };
    };
    check_refusal("cublasGemmEx refuses lda below the rows", CUBLAS_STATUS_INVALID_VALUE, "lda 1",
                  gemm(CUBLAS_OP_N, 1, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    check_refusal("cublasGemmEx refuses CUBLAS_OP_C by name", CUBLAS_STATUS_NOT_SUPPORTED, "transa CUBLAS_OP_C",
                  gemm(CUBLAS_OP_C, 3, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    check_refusal("cublasGemmEx refuses another compute type by name", CUBLAS_STATUS_NOT_SUPPORTED,
                  "CUBLAS_COMPUTE_32F_FAST_TF32",
                  gemm(CUBLAS_OP_N, 3, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
    check_refusal("cublasGemmEx refuses another algorithm", CUBLAS_STATUS_NOT_SUPPORTED, "algo 99",
                  gemm(CUBLAS_OP_N, 3, CUDA_R_32F, CUBLAS_COMPUTE_32F, 99));
    check_refusal("cublasGemmEx refuses fp32 in, bf16 out", CUBLAS_STATUS_NOT_SUPPORTED, "C/D CUDA_R_16BF",
                  gemm(CUBLAS_OP_N, 3, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    check_refusal("cublasSetWorkspace refuses a workspace not 256-byte aligned", CUBLAS_STATUS_INVALID_VALUE,
                  "not 256-byte aligned", [&] { return cublasSetWorkspace(h, (char *)workspace + 16, 128); });
    cublasDestroy(h);
    free(workspace);
}

// ----------------------------------------------------------------------------
// cuBLASLt's refusals, each with its status and a message naming what

static void check_lt_refusals(void) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    uint32_t epilogue = 1;
    int32_t op = CUBLAS_OP_C;
    int64_t wide = CUBLAS_OP_T;
    check_refusal("cublasLtMatmulDescSetAttribute refuses CUBLASLT_MATMUL_DESC_EPILOGUE by name",
                  CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATMUL_DESC_EPILOGUE", [&] {
                      return cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                            sizeof epilogue);
                  });
    check_refusal("cublasLtMatmulDescSetAttribute refuses TRANSA CUBLAS_OP_C by name", CUBLAS_STATUS_NOT_SUPPORTED,
                  "CUBLAS_OP_C",
                  [&] { return cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op); });
    check_refusal("cublasLtMatmulDescSetAttribute refuses a value of the wrong size", CUBLAS_STATUS_INVALID_VALUE,
                  "takes an int32_t", [&] {
                      return cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &wide, sizeof wide);
                  });
    cublasLtMatmulDescDestroy(desc);
    check_refusal("cublasLtMatmulDescCreate refuses CUBLAS_COMPUTE_32F_FAST_TF32 by name", CUBLAS_STATUS_NOT_SUPPORTED,
                  "CUBLAS_COMPUTE_32F_FAST_TF32",
                  [&] { return cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F); });

    cublasLtMatrixLayout_t layout;
    cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 2, 2, 2);
    int32_t batches = 4;
    check_refusal("cublasLtMatrixLayoutSetAttribute refuses CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT by name",
                  CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT", [&] {
                      return cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batches,
                                                              sizeof batches);
                  });
    cublasLtMatrixLayoutDestroy(layout);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint32_t mode = 0;
    check_refusal("cublasLtMatmulPreferenceSetAttribute refuses CUBLASLT_MATMUL_PREF_SEARCH_MODE by name",
                  CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT_MATMUL_PREF_SEARCH_MODE", [&] {
                      return cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode,
                                                                  sizeof mode);
                  });
    cublasLtMatmulPreferenceDestroy(pref);

    // shapes and types that do not agree (the worked example's operands, one thing wrong at a time)
    float *C = copy_of<float>({P, P, P, P, P, P});
    LtCall good = {CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, copy_of(A_N), 3, copy_of(B_N), 4, C, 3, C, 3};
    LtCall c = good;
    auto run = [&] { return lt_matmul(c); };
    check_refusal("cublasLtMatmulAlgoGetHeuristic refuses op(B) whose rows are not op(A)'s columns",
                  CUBLAS_STATUS_INVALID_VALUE, "is not D (2, 2)", [&] {
                      // TRANSB = T with B's layout (3, 2) as stored for TRANSB = N: op(B) is (2, 3)
                      cublasLtMatmulDesc_t d;
                      cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
                      int32_t t = CUBLAS_OP_T;
                      cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof t);
                      cublasLtMatrixLayout_t la, lb, ld;
                      cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 2, 3, 3);
                      cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 3, 2, 4);
                      cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 2, 2, 3);
                      cublasLtMatmulPreference_t p;
                      cublasLtMatmulPreferenceCreate(&p);
                      cublasLtMatmulHeuristicResult_t h;
                      int found;
                      cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, ld, ld, p, 1, &h, &found);
                      cublasLtMatmulPreferenceDestroy(p);
                      cublasLtMatrixLayoutDestroy(la);
                      cublasLtMatrixLayoutDestroy(lb);
                      cublasLtMatrixLayoutDestroy(ld);
                      cublasLtMatmulDescDestroy(d);
                      return st;
                  });
    c = good, c.lda = 1;
    check_refusal("cublasLtMatmulAlgoGetHeuristic refuses a leading dimension below the rows",
                  CUBLAS_STATUS_INVALID_VALUE, "A's leading dimension 1 is less than its 2 rows", run);
    c = good, c.tcd = CUDA_R_16BF;
    check_refusal("cublasLtMatmulAlgoGetHeuristic refuses fp32 in, bf16 out", CUBLAS_STATUS_NOT_SUPPORTED,
                  "A CUDA_R_32F, B CUDA_R_32F, C/D CUDA_R_16BF", run);
    c = good, c.tab = CUDA_R_16F, c.tcd = CUDA_R_16BF;
    check_refusal("cublasLtMatmulAlgoGetHeuristic refuses fp16 in, bf16 out", CUBLAS_STATUS_NOT_SUPPORTED,
                  "A CUDA_R_16F, B CUDA_R_16F, C/D CUDA_R_16BF", run);
    c = good, c.ldc = 2, c.beta = 1.0f; // C == D, but C's layout has ld 2 and D's 3
    check_refusal("cublasLtMatmul refuses C == D with a layout other than D's", CUBLAS_STATUS_INVALID_VALUE,
                  "C == D (in place) needs C's layout to be D's", run);
    // A one float past a 256-byte boundary: 4-byte aligned, not the default 256 the preference promises
    float *A_off = copy_of<float>({0, 1, 4, P, 2, 5, P, 3, 6, P}) + 1;
    c = good, c.A = A_off;
    check_refusal("cublasLtMatmul refuses A less aligned than the preference's minimum (256 by default)",
                  CUBLAS_STATUS_NOT_SUPPORTED, "is not 256-byte aligned", run);
    float *D4 = copy_of<float>({P, P, S, P, P, S});
    c.align = 4, c.C = c.D = D4;
    CHECK(lt_matmul(c) == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul takes a 4-byte aligned A under MIN_ALIGNMENT 4",
          "refused");
    check_floats("cublasLtMatmul with a 4-byte aligned A", D4, D_WANT);

    // an algorithm used for another product, a workspace not 256-byte aligned, no algorithm requested
    cublasLtMatmulDesc_t d;
    cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayout_t la, lb, ld, ld4;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 2, 3, 3);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 3, 2, 4);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 2, 2, 3);
    cublasLtMatrixLayoutCreate(&ld4, CUDA_R_32F, 2, 2, 4);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    check_refusal("cublasLtMatmulAlgoGetHeuristic refuses requestedAlgoCount 0", CUBLAS_STATUS_INVALID_VALUE,
                  "requestedAlgoCount 0",
                  [&] { return cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, ld, ld, pref, 0, &h, &found); });
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, ld, ld, pref, 4, &h, &found);
    CHECK(st == CUBLAS_STATUS_SUCCESS && found == 1 && h.state == CUBLAS_STATUS_SUCCESS && h.workspaceSize == 0,
          "cublasLtMatmulAlgoGetHeuristic returns one algorithm needing no workspace", "status %s, %d found",
          cublasLtGetStatusString(st), found);
    float alpha = 1.0f, beta = 0.0f;
    float *A = copy_of(A_N), *B = copy_of(B_N), *D = copy_of<float>({P, P, S, P, P, S, P, P});
    check_refusal("cublasLtMatmul refuses an algorithm chosen for another product", CUBLAS_STATUS_INVALID_VALUE,
                  "chosen for another product", [&] {
                      return cublasLtMatmul(lt, d, &alpha, A, la, B, lb, &beta, D, ld4, D, ld4, &h.algo, NULL, 0, NULL);
                  });
    check_refusal("cublasLtMatmul refuses a workspace not 256-byte aligned", CUBLAS_STATUS_INVALID_VALUE,
                  "not 256-byte aligned", [&] {
                      return cublasLtMatmul(lt, d, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &h.algo, (char *)D + 64,
                                            64, NULL);
                  });
    check_refusal(
        "cublasLtMatmul refuses algo NULL (an implicit heuristic query)", CUBLAS_STATUS_NOT_SUPPORTED, "algo NULL",
        [&] { return cublasLtMatmul(lt, d, &alpha, A, la, B, lb, &beta, D, ld, D, ld, NULL, NULL, 0, NULL); });
    // D over A: a race on the GPU, which no status reports; the layer stops (emu::fail)
    std::string err = stderr_of([&] {
        try {
            cublasLtMatmul(lt, d, &alpha, A, la, B, lb, &beta, A, ld, A, ld, &h.algo, NULL, 0, NULL);
        } catch (const std::runtime_error &) {
        }
    });
    CHECK(err.find("D [") != std::string::npos && err.find("overlaps A") != std::string::npos,
          "cublasLtMatmul stops when D overlaps A", "stderr: %s", err.c_str());
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutDestroy(ld4);
    cublasLtMatmulDescDestroy(d);
}

int main(void) {
    // cuBLAS's status values and names (cublas_api.h)
    CHECK(CUBLAS_STATUS_INVALID_VALUE == 7 && CUBLAS_STATUS_NOT_SUPPORTED == 15 &&
          strcmp(cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED") == 0 &&
          strcmp(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE") == 0,
          "cuBLAS status values and names", "they differ from cuBLAS's");
    cublasLtCreate(&lt);
    check_transposes();
    check_alpha_beta();
    check_bf16_inputs();
    check_bf16_rounding();
    check_fp16();
    check_order();
    check_streams();
    check_gemmex();
    check_lt_refusals();
    cublasLtDestroy(lt);
    for (void *p : allocations) free(p);
    return test_summary();
}
