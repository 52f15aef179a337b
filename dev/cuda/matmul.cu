// matmul_forward / matmul_backward (matmul.cuh, cuBLASLt) against train_llama2.c's.
// Variants: fp32 (true fp32, no TF32), bf16 (bf16 in and out), bf16>fp32 (bf16
// in, fp32 out: logits for the loss, fp32 weight gradients).
#include "common.cuh"
#include "../../matmul.cuh"

template <typename T, typename TO> const char *variant() {
    return std::is_same<T, TO>::value ? type_name<T>() : "bf16>fp32";
}

// out (N, O) = [out +] alpha * inp (N, I) @ weight (O, I)^T
template <typename T, typename TO>
void check_forward(int N, int I, int O, float alpha, int accumulate, bool timed) {
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d I=%d O=%d alpha=%g accumulate=%d", N, I, O, alpha, accumulate);
    std::vector<float> inp = rounded<T>(random_vector((size_t)N * I)), w = rounded<T>(random_vector((size_t)O * I));
    std::vector<float> ref = rounded<TO>(random_vector((size_t)N * O)); // what out holds before
    TO *out = accumulate ? to_device<TO>(ref) : device_poisoned<TO>((size_t)N * O);
    T *d_inp = to_device<T>(inp), *d_w = to_device<T>(w);
    ref_matmul_forward(ref.data(), inp.data(), w.data(), N, I, O, alpha, accumulate);
    matmul_forward(out, d_inp, d_w, N, I, O, alpha, accumulate);
    // bf16 outputs are rounded once at the end: 2^-8 of the largest value covers it
    check("matmul_forward", variant<T, TO>(), "out", shape, to_host(out, (size_t)N * O), ref,
          std::is_same<TO, float>::value ? 1e-5 : 4e-3);
    if (timed) {
        float ms = time_ms([&] { matmul_forward(out, d_inp, d_w, N, I, O, alpha, accumulate); });
        report_time("matmul_forward", variant<T, TO>(), shape, ms, 0, 2.0 * N * I * O);
    }
    free_device();
}

// dinp (N, I) += alpha * dout @ weight; dweight (O, I, fp32) += alpha * dout^T @ inp; either may be NULL
template <typename T>
void check_backward(int N, int I, int O, float alpha, bool want_dinp, bool want_dweight, bool timed) {
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d I=%d O=%d alpha=%g%s%s", N, I, O, alpha, want_dinp ? "" : " dinp=NULL",
             want_dweight ? "" : " dweight=NULL");
    std::vector<float> dout = rounded<T>(random_vector((size_t)N * O)), inp = rounded<T>(random_vector((size_t)N * I));
    std::vector<float> w = rounded<T>(random_vector((size_t)O * I));
    std::vector<float> dinp = rounded<T>(random_vector((size_t)N * I)), dw = random_vector((size_t)O * I); // added into
    T *d_dinp = to_device<T>(dinp), *d_dout = to_device<T>(dout), *d_inp = to_device<T>(inp), *d_w = to_device<T>(w);
    float *d_dw = to_device<float>(dw);
    ref_matmul_backward(want_dinp ? dinp.data() : NULL, want_dweight ? dw.data() : NULL, dout.data(), inp.data(),
                        w.data(), N, I, O, alpha);
    auto run = [&] {
        matmul_backward(want_dinp ? d_dinp : NULL, want_dweight ? d_dw : NULL, d_dout, want_dweight ? d_inp : NULL,
                        want_dinp ? d_w : NULL, N, I, O, alpha);
    };
    run();
    check("matmul_backward", type_name<T>(), "dinp", shape, to_host(d_dinp, (size_t)N * I), dinp, tol<T>(1e-5, 4e-3));
    check("matmul_backward", type_name<T>(), "dweight", shape, to_host(d_dw, (size_t)O * I), dw, 1e-5);
    if (timed) {
        float ms = time_ms(run);
        report_time("matmul_backward", type_name<T>(), shape, ms, 0, 2.0 * N * I * O * (want_dinp + want_dweight));
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    // small and odd shapes, LoRA's rank-8 products, then a Llama-2-7B MLP product (N = 4 x 1024 tokens)
    int shapes[][3] = {{37, 48, 80}, {64, 64, 8}, {64, 8, 96}, {256, 512, 384}, {4096, 4096, 11008}};
    int n = quick ? 3 : 5;
    for (int s = 0; s < n; s++) {
        int N = shapes[s][0], I = shapes[s][1], O = shapes[s][2];
        bool timed = !quick && s == n - 1;
        check_forward<T, T>(N, I, O, 1.0f, 0, timed);
        check_forward<T, T>(N, I, O, 0.5f, 1, false);
        if (std::is_same<T, __nv_bfloat16>::value) check_forward<T, float>(N, I, O, 1.0f, 0, timed);
        check_backward<T>(N, I, O, 1.0f, true, true, timed);
        check_backward<T>(N, I, O, 2.0f, true, false, false);
        check_backward<T>(N, I, O, 2.0f, false, true, false);
    }
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    return finish("matmul");
}
