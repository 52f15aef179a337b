// rmsnorm_forward / rmsnorm_backward (layers.cuh) against train_llama2.c's
// (which keeps its statistics in double; the GPU's are fp32).
#include "common.cuh"
#include "../../layers.cuh"

template <typename T> void check_rmsnorm(int N, int D, bool timed) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d D=%d", N, D);
    size_t n = (size_t)N * D;
    float eps = 1e-5f;
    std::vector<float> inp = rounded<T>(random_vector(n, -2.0f, 2.0f)), w = rounded<T>(random_vector(D, 0.5f, 1.5f));
    std::vector<float> dout = rounded<T>(random_vector(n)), out(n), rstd(N);
    std::vector<float> dinp = rounded<T>(random_vector(n)), dw = random_vector(D); // both added into
    T *d_inp = to_device<T>(inp), *d_w = to_device<T>(w), *d_dout = to_device<T>(dout), *d_dinp = to_device<T>(dinp);
    T *d_out = device_poisoned<T>(n);
    float *d_rstd = device_poisoned<float>(N), *d_dw = to_device<float>(dw);
    ref_rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, D, eps);
    ref_rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, D);
    rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, D, eps, 0);
    rmsnorm_backward(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, D, 0);
    // bf16 outputs: one rounding, 2^-8 of the largest value
    check("rmsnorm_forward", type_name<T>(), "out", shape, to_host(d_out, n), out, tol<T>(1e-5, 4e-3));
    check("rmsnorm_forward", type_name<T>(), "rstd", shape, to_host(d_rstd, N), rstd, 1e-5);
    check("rmsnorm_backward", type_name<T>(), "dinp", shape, to_host(d_dinp, n), dinp, tol<T>(1e-5, 4e-3));
    check("rmsnorm_backward", type_name<T>(), "dw", shape, to_host(d_dw, D), dw, 1e-5);
    if (timed) {
        double bytes = n * sizeof(T);
        float ms = time_ms([&] { rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, D, eps, 0); });
        report_time("rmsnorm_forward", type_name<T>(), shape, ms, 2 * bytes);
        ms = time_ms([&] { rmsnorm_backward(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, D, 0); });
        report_time("rmsnorm_backward", type_name<T>(), shape, ms, 4 * bytes); // dinp, dw: 2 passes over dout, inp
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    check_rmsnorm<T>(37, 48, false);
    check_rmsnorm<T>(256, 4096, false);
    if (!quick) check_rmsnorm<T>(4096, 4096, true); // Llama-2-7B, 4 x 1024 tokens
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    return finish("rmsnorm");
}
