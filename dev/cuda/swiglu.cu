// swiglu_forward / swiglu_backward (layers.cuh) against train_llama2.c's.
#include "common.cuh"
#include "../../layers.cuh"

template <typename T> void check_swiglu(size_t n, bool timed) {
    char shape[32];
    snprintf(shape, sizeof shape, "n=%zu", n);
    std::vector<float> gate = rounded<T>(random_vector(n, -6.0f, 6.0f)), up = rounded<T>(random_vector(n));
    std::vector<float> dout = rounded<T>(random_vector(n)), out(n), dgate(n), dup(n);
    T *d_gate = to_device<T>(gate), *d_up = to_device<T>(up), *d_dout = to_device<T>(dout);
    T *d_out = device_poisoned<T>(n), *d_dgate = device_poisoned<T>(n), *d_dup = device_poisoned<T>(n);
    ref_swiglu_forward(out.data(), gate.data(), up.data(), n);
    ref_swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
    swiglu_forward(d_out, d_gate, d_up, n, 0);
    swiglu_backward(d_dgate, d_dup, d_dout, d_gate, d_up, n, 0);
    check("swiglu_forward", type_name<T>(), "out", shape, to_host(d_out, n), out, tol<T>(1e-5, 4e-3));
    check("swiglu_backward", type_name<T>(), "dgate", shape, to_host(d_dgate, n), dgate, tol<T>(1e-5, 4e-3));
    check("swiglu_backward", type_name<T>(), "dup", shape, to_host(d_dup, n), dup, tol<T>(1e-5, 4e-3));
    if (timed) {
        float ms = time_ms([&] { swiglu_forward(d_out, d_gate, d_up, n, 0); });
        report_time("swiglu_forward", type_name<T>(), shape, ms, 3.0 * n * sizeof(T));
        ms = time_ms([&] { swiglu_backward(d_dgate, d_dup, d_dout, d_gate, d_up, n, 0); });
        report_time("swiglu_backward", type_name<T>(), shape, ms, 5.0 * n * sizeof(T));
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    check_swiglu<T>(1001, false);
    check_swiglu<T>((size_t)256 * 11008, false);
    if (!quick) check_swiglu<T>((size_t)4096 * 11008, true); // Llama-2-7B's MLP, 4 x 1024 tokens
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    return finish("swiglu");
}
