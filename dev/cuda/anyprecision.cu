// anyprecision_update (layers.cuh: llama-recipes' AnyPrecisionAdamW, bf16 parameters,
// gradients, moments and compensation) against train_llama2.c's, over 3 steps from the
// zero state, with weight decay, with and without Kahan summation: every bf16 tensor bit
// for bit (tolerance: none; the same fp32 operations and bf16 roundings in the same order).
#include "common.cuh"
#include "../../layers.cuh"

// n random values of magnitudes 2^0 .. 2^-23 (by blocks of 256), rounded to bf16, as the
// bits the CPU twin takes
static std::vector<uint16_t> bf16_vector(size_t n, float scale) {
    std::vector<float> x = random_vector(n);
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; i++) b[i] = bf16_from_f32(ldexpf(x[i] * scale, -(int)((i / 256) % 24)));
    return b;
}
// the same bits on the device, as __nv_bfloat16
static __nv_bfloat16 *to_device_bf16(const std::vector<uint16_t> &b) {
    return (__nv_bfloat16 *)to_device_raw(b);
}
static std::vector<uint16_t> bf16_to_host(const __nv_bfloat16 *d, size_t n) {
    return to_host_raw((const uint16_t *)d, n);
}

void check_anyprecision(size_t n, bool kahan, bool timed) {
    char shape[80];
    const char *variant = kahan ? "kahan" : "plain";
    double lr = 9e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.7;
    std::vector<uint16_t> p = bf16_vector(n, 0.1f), m(n, 0), v(n, 0), c(n, 0);
    __nv_bfloat16 *d_p = to_device_bf16(p), *d_m = to_device_bf16(m), *d_v = to_device_bf16(v);
    __nv_bfloat16 *d_c = kahan ? to_device_bf16(c) : NULL;
    for (int t = 1; t <= 3; t++) { // fresh gradients each step
        std::vector<uint16_t> g = bf16_vector(n, 1.0f);
        __nv_bfloat16 *d_g = to_device_bf16(g);
        ref_anyprecision_update(p.data(), g.data(), m.data(), v.data(), kahan ? c.data() : NULL, n, t, lr, beta1,
                                beta2, eps, wd);
        anyprecision_update(d_p, d_g, d_m, d_v, d_c, n, t, lr, beta1, beta2, eps, wd, 0);
        snprintf(shape, sizeof shape, "n=%zu step=%d", n, t);
        check_bits("anyprecision_update", variant, "params", shape, bf16_to_host(d_p, n), p);
        check_bits("anyprecision_update", variant, "m", shape, bf16_to_host(d_m, n), m);
        check_bits("anyprecision_update", variant, "v", shape, bf16_to_host(d_v, n), v);
        if (kahan) check_bits("anyprecision_update", variant, "comp", shape, bf16_to_host(d_c, n), c);
        if (timed && t == 3) { // reads params, grads, m, v (comp), writes params, m, v (comp): bf16 each
            float ms = time_ms([&] { anyprecision_update(d_p, d_g, d_m, d_v, d_c, n, t, lr, beta1, beta2, eps, wd, 0); });
            report_time("anyprecision_update", variant, shape, ms, n * 2.0 * (kahan ? 9 : 7));
        }
    }
    free_device();
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    for (int kahan = 0; kahan < 2; kahan++) {
        check_anyprecision(1001, kahan, false);
        check_anyprecision((size_t)1 << 20, kahan, false);
        if (!quick) check_anyprecision((size_t)1 << 26, kahan, true); // 67M parameters: a full fine-tuning shard
    }
    return finish("anyprecision");
}
