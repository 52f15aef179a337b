// adamw_update (layers.cuh) against train_llama2.c's, over a few steps with
// weight decay, with and without the bf16 copy of the parameters.
#include "common.cuh"
#include "../../layers.cuh"

void check_adamw(size_t n, bool with_copy, bool timed) {
    char shape[64];
    const char *variant = with_copy ? "fp32+bf16" : "fp32";
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    std::vector<float> params = random_vector(n), m(n, 0.0f), v(n, 0.0f);
    float *d_params = to_device<float>(params), *d_m = to_device<float>(m), *d_v = to_device<float>(v);
    __nv_bfloat16 *d_copy = with_copy ? device_poisoned<__nv_bfloat16>(n) : NULL;
    for (int t = 1; t <= 3; t++) { // fresh gradients each step
        std::vector<float> grads = random_vector(n);
        float *d_grads = to_device<float>(grads);
        ref_adamw_update(params.data(), grads.data(), m.data(), v.data(), n, t, lr, beta1, beta2, eps, wd);
        adamw_update(d_params, d_grads, d_m, d_v, n, t, lr, beta1, beta2, eps, wd, d_copy, 0);
        snprintf(shape, sizeof shape, "n=%zu step=%d", n, t);
        check("adamw_update", variant, "params", shape, to_host(d_params, n), params, 1e-5);
        check("adamw_update", variant, "m", shape, to_host(d_m, n), m, 1e-5);
        check("adamw_update", variant, "v", shape, to_host(d_v, n), v, 1e-5);
        if (with_copy) check("adamw_update", variant, "bf16", shape, to_host(d_copy, n), params, 4e-3);
        if (timed && t == 3) {
            float ms = time_ms([&] { adamw_update(d_params, d_grads, d_m, d_v, n, t, lr, beta1, beta2, eps, wd, d_copy, 0); });
            report_time("adamw_update", variant, shape, ms, n * (7.0 * sizeof(float) + (with_copy ? 2 : 0)));
        }
    }
    free_device();
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    for (int copy = 0; copy < 2; copy++) {
        check_adamw(1001, copy, false);
        check_adamw((size_t)1 << 20, copy, false);
        if (!quick) check_adamw((size_t)1 << 26, copy, true); // 67M parameters: a full fine-tuning shard
    }
    return finish("adamw");
}
