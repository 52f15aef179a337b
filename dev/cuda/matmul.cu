// matmul_forward / matmul_backward (matmul.cuh) against support/matmul.h's.
// Variants: fp32 (true fp32, no TF32), bf16 (bf16 in and out), bf16>fp32 (bf16
// in, fp32 out: logits for the loss, fp32 weight gradients), each also as
// .../gemmex with every product forced through matmul.cuh's fallback
// (cublasGemmEx), which otherwise runs only where cuBLASLt's heuristic finds no
// kernel. The shapes include LoRA's r = 4 products (8-byte rows in bf16) and
// operands one element off alignment, where that may happen; each line's shape
// ends with the path its products took unforced: path=cublasLt, gemmex or both.
#include "common.cuh"
#include "../../support/matmul.cuh"

struct Shape { int N, I, O, offset; }; // offset: operands placed this many elements past an aligned address

// the variant's name: the storage types, and /gemmex when the fallback is forced
template <typename T, typename TO> const char *variant(bool forced) {
    static char name[32];
    snprintf(name, sizeof name, "%s%s", std::is_same<T, TO>::value ? type_name<T>() : "bf16>fp32",
             forced ? "/gemmex" : "");
    return name;
}

// device copies offset elements past an aligned address (offset 1: aligned to one
// element only, as a view into a bigger buffer may be)
template <typename T> T *placed(const std::vector<float> &x, int offset) {
    std::vector<float> padded(offset, 0.0f);
    padded.insert(padded.end(), x.begin(), x.end());
    return to_device<T>(padded) + offset;
}
template <typename T> T *placed_poisoned(size_t n, int offset) { return device_poisoned<T>(n + offset) + offset; }

// runs f (products cuBLAS calls), with the fallback forced or not; returns the path they took
template <typename F> const char *run_path(F f, int products, bool forced) {
    long before = matmul_fallback_calls;
    matmul_force_fallback = forced;
    f();
    matmul_force_fallback = false;
    long fell = matmul_fallback_calls - before;
    return fell == 0 ? "cublasLt" : fell == products ? "gemmex" : "both";
}

// out (N, O) = [out +] alpha * inp (N, I) @ weight (O, I)^T
template <typename T, typename TO>
void check_forward(Shape s, float alpha, int accumulate, bool forced, bool timed) {
    int N = s.N, I = s.I, O = s.O;
    std::vector<float> inp = rounded<T>(random_vector((size_t)N * I)), w = rounded<T>(random_vector((size_t)O * I));
    std::vector<float> ref = rounded<TO>(random_vector((size_t)N * O)); // what out holds before
    TO *out = accumulate ? placed<TO>(ref, s.offset) : placed_poisoned<TO>((size_t)N * O, s.offset);
    T *d_inp = placed<T>(inp, s.offset), *d_w = placed<T>(w, s.offset);
    ref_matmul_forward(ref.data(), inp.data(), w.data(), N, I, O, alpha, accumulate);
    auto run = [&] { matmul_forward(out, d_inp, d_w, N, I, O, alpha, accumulate); };
    const char *path = run_path(run, 1, forced);
    char shape[128];
    snprintf(shape, sizeof shape, "N=%d I=%d O=%d offset=%d alpha=%g accumulate=%d path=%s", N, I, O, s.offset, alpha,
             accumulate, path);
    // bf16 outputs are rounded once at the end: 2^-8 of the largest value covers it
    check("matmul_forward", variant<T, TO>(forced), "out", shape, to_host(out, (size_t)N * O), ref,
          std::is_same<TO, float>::value ? 1e-5 : 4e-3);
    if (timed) {
        float ms = time_ms(run);
        report_time("matmul_forward", variant<T, TO>(forced), shape, ms, 0, 2.0 * N * I * O);
    }
    free_device();
}

// dinp (N, I) += alpha * dout @ weight; dweight (O, I, fp32) += alpha * dout^T @ inp; either may be NULL
template <typename T>
void check_backward(Shape s, float alpha, bool want_dinp, bool want_dweight, bool forced, bool timed) {
    int N = s.N, I = s.I, O = s.O;
    std::vector<float> dout = rounded<T>(random_vector((size_t)N * O)), inp = rounded<T>(random_vector((size_t)N * I));
    std::vector<float> w = rounded<T>(random_vector((size_t)O * I));
    std::vector<float> dinp = rounded<T>(random_vector((size_t)N * I)), dw = random_vector((size_t)O * I); // added into
    T *d_dinp = placed<T>(dinp, s.offset), *d_dout = placed<T>(dout, s.offset), *d_inp = placed<T>(inp, s.offset);
    T *d_w = placed<T>(w, s.offset);
    float *d_dw = placed<float>(dw, s.offset);
    ref_matmul_backward(want_dinp ? dinp.data() : NULL, want_dweight ? dw.data() : NULL, dout.data(), inp.data(),
                        w.data(), N, I, O, alpha);
    auto run = [&] {
        matmul_backward(want_dinp ? d_dinp : NULL, want_dweight ? d_dw : NULL, d_dout, want_dweight ? d_inp : NULL,
                        want_dinp ? d_w : NULL, N, I, O, alpha);
    };
    const char *path = run_path(run, want_dinp + want_dweight, forced);
    char shape[128];
    snprintf(shape, sizeof shape, "N=%d I=%d O=%d offset=%d alpha=%g%s%s path=%s", N, I, O, s.offset, alpha,
             want_dinp ? "" : " dinp=NULL", want_dweight ? "" : " dweight=NULL", path);
    check("matmul_backward", variant<T, T>(forced), "dinp", shape, to_host(d_dinp, (size_t)N * I), dinp,
          tol<T>(1e-5, 4e-3));
    check("matmul_backward", variant<T, T>(forced), "dweight", shape, to_host(d_dw, (size_t)O * I), dw, 1e-5);
    if (timed) {
        float ms = time_ms(run);
        report_time("matmul_backward", variant<T, T>(forced), shape, ms, 0,
                    2.0 * N * I * O * (want_dinp + want_dweight));
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    // small and odd shapes; LoRA's rank-8 products, and its rank-4 ones (A's output and
    // B's input rows 8 bytes in bf16, where cuBLASLt may have no kernel); the first
    // shape again with every operand one element off alignment; a larger one; then a
    // Llama-2-7B MLP product (N = 4 x 1024 tokens), the only one timed and not forced
    Shape shapes[] = {{37, 48, 80, 0}, {64, 64, 8, 0}, {64, 8, 96, 0}, {64, 64, 4, 0}, {61, 4, 96, 0},
                      {37, 48, 80, 1}, {256, 512, 384, 0}, {4096, 4096, 11008, 0}};
    int n = sizeof shapes / sizeof shapes[0];
    if (quick) n -= 2;
    for (int i = 0; i < n; i++) {
        bool big = shapes[i].N == 4096, timed = big && !quick;
        for (int forced = 0; forced < (big ? 1 : 2); forced++) {
            check_forward<T, T>(shapes[i], 1.0f, 0, forced, timed);
            check_forward<T, T>(shapes[i], 0.5f, 1, forced, false);
            if (std::is_same<T, __nv_bfloat16>::value) check_forward<T, float>(shapes[i], 1.0f, 0, forced, timed);
            check_backward<T>(shapes[i], 1.0f, true, true, forced, timed);
            check_backward<T>(shapes[i], 2.0f, true, false, forced, false);
            check_backward<T>(shapes[i], 2.0f, false, true, forced, false);
        }
    }
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    matmul_free();
    return finish("matmul");
}
