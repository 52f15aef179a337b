// adamw_update (layers.cuh) against train_llama2.c's, bit for bit (both step with
// support/optimizer.h's adamw_elem; --cpu_offload needs them equal), over a few steps with
// weight decay, without a copy of the parameters (E = float: none) and with the
// bf16 or the fp16 copy.
#include "common.cuh"
#include "../../layers.cuh"

template <typename E> void check_adamw(size_t n, bool timed) {
    char shape[64], variant[16];
    bool with_copy = !std::is_same<E, float>::value;
    snprintf(variant, sizeof variant, "fp32%s%s", with_copy ? "+" : "", with_copy ? type_name<E>() : "");
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    std::vector<float> params = random_vector(n), m(n, 0.0f), v(n, 0.0f);
    float *d_params = to_device<float>(params), *d_m = to_device<float>(m), *d_v = to_device<float>(v);
    E *d_copy = with_copy ? device_poisoned<E>(n) : NULL;
    for (int t = 1; t <= 3; t++) { // fresh gradients each step
        std::vector<float> grads = random_vector(n);
        float *d_grads = to_device<float>(grads);
        ref_adamw_update(params.data(), grads.data(), m.data(), v.data(), n, t, lr, beta1, beta2, eps, wd);
        adamw_update(d_params, d_grads, d_m, d_v, n, t, lr, beta1, beta2, eps, wd, d_copy, 0);
        snprintf(shape, sizeof shape, "n=%zu step=%d", n, t);
        check_bits("adamw_update", variant, "params", shape, to_host(d_params, n), params);
        check_bits("adamw_update", variant, "m", shape, to_host(d_m, n), m);
        check_bits("adamw_update", variant, "v", shape, to_host(d_v, n), v);
        // the copy is the parameters rounded once: half a unit in the last place, 2^-9 (bf16), 2^-12 (fp16)
        if (with_copy)
            check("adamw_update", variant, type_name<E>(), shape, to_host(d_copy, n), params, tol<E>(0, 4e-3, 5e-4));
        if (timed && t == 3) {
            float ms = time_ms([&] { adamw_update(d_params, d_grads, d_m, d_v, n, t, lr, beta1, beta2, eps, wd, d_copy, 0); });
            report_time("adamw_update", variant, shape, ms, n * (7.0 * sizeof(float) + (with_copy ? sizeof(E) : 0)));
        }
    }
    free_device();
}

template <typename E> void check_sizes(bool quick) {
    check_adamw<E>(1001, false);
    check_adamw<E>((size_t)1 << 20, false);
    if (!quick) check_adamw<E>((size_t)1 << 26, true); // 67M parameters: a full fine-tuning shard
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_sizes<float>(quick);
    check_sizes<__nv_bfloat16>(quick);
    check_sizes<__half>(quick);
    return finish("adamw");
}
