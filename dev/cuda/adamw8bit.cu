// adamw8bit_update and adamw_torchao_update (layers.cuh: torchao's AdamW8bit, its 8-bit
// and its fp32 path) against train_llama2.c's, over 3 steps from the zero state, with
// weight decay: parameters, codes, absmax and moments bit for bit (tolerance: none; the
// same fp32 operations in the same order, each rounding explicit), with no copy of the
// parameters (E = float) and with the bf16 or fp16 copy; betas 0.9, 0.999 and 0.3, 0.45
// (lerp weights above 0.5: torch's other formula). The 8-bit update runs whole and as
// two slices of whole blocks (a shard's), which must change nothing.
#include "common.cuh"
#include "../../layers.cuh"

// gradients of many magnitudes: block b of 256 scaled by 2^-(b % 24); the second block
// zero, with zero parameters (its absmax stays at torchao's 1e-12 floor)
static std::vector<float> gradients(size_t n) {
    std::vector<float> g = random_vector(n);
    for (size_t i = 0; i < n; i++) g[i] = i / 256 == 1 ? 0.0f : ldexpf(g[i], -(int)((i / 256) % 24));
    return g;
}

static float float_step(float x, int d) { // the float d steps of the last place away from x > 0
    int32_t b;
    memcpy(&b, &x, 4);
    b += d;
    memcpy(&x, &b, 4);
    return x;
}
// The first step's gradients of blocks 2 and 3 (from the zero state: m = w1 g, v = w2 g^2,
// one rounding each) put moments exactly on torchao's rounding ties, x - q[k] ==
// (q[k+1] - q[k]) / 2 in fp32, wherever a search finds a gradient for one: the tie
// rounds up, and the kernel must agree. Each block's largest gradient, 10, fixes its absmax.
static int put_ties(std::vector<float> &g, float w1, float w2) {
    int found = 0;
    for (int which = 0; which < 2; which++) { // exp_avg's signed map, exp_avg_sq's unsigned
        const float *q = which ? qmap8_unsigned : qmap8_signed;
        float *block = &g[(2 + which) * ADAMW8BIT_BLOCK];
        auto moment = [&](float x) { return which ? w2 * (x * x) : w1 * x; };
        block[0] = 10.0f;
        float absmax = moment(10.0f);
        for (int k = 130, j = 1; k < 254; k += 2, j++) { // codes of the upper half: positive in both maps
            float lo = q[k], half = (q[k + 1] - q[k]) * 0.5f, x = lo + half;
            if (x - lo != half) continue;
            float g0 = which ? sqrtf(x * absmax / w2) : x * absmax / w1;
            for (int d = 0; d <= 512; d++) {
                float gi = float_step(g0, d % 2 ? (d + 1) / 2 : -d / 2);
                if (moment(gi) / absmax == x) { block[j] = gi, found++; break; }
            }
        }
    }
    return found;
}

template <typename E> void check_8bit(size_t n, size_t slice_blocks, double beta1, double beta2, bool timed) {
    char shape[80], variant[32];
    bool with_copy = !std::is_same<E, float>::value;
    snprintf(variant, sizeof variant, "%s%s%s%s", slice_blocks ? "2slices" : "whole", beta1 < 0.5 ? "-b.3" : "",
             with_copy ? "+" : "", with_copy ? type_name<E>() : "");
    double lr = 1e-3, eps = 1e-8, wd = 0.1;
    size_t nb = n / ADAMW8BIT_BLOCK, cut = slice_blocks * ADAMW8BIT_BLOCK;
    std::vector<float> params = random_vector(n), m_absmax(nb, 0.0f), v_absmax(nb, 0.0f);
    for (size_t i = ADAMW8BIT_BLOCK; i < 2 * ADAMW8BIT_BLOCK && i < n; i++) params[i] = 0.0f;
    std::vector<uint8_t> m_codes(n, 0), v_codes(n, 0);
    float *d_params = to_device_raw(params), *d_m_absmax = to_device_raw(m_absmax), *d_v_absmax = to_device_raw(v_absmax);
    uint8_t *d_m_codes = to_device_raw(m_codes), *d_v_codes = to_device_raw(v_codes);
    E *d_copy = with_copy ? device_poisoned<E>(n) : NULL;
    for (int t = 1; t <= 3; t++) { // fresh gradients each step
        std::vector<float> grads = gradients(n);
        int ties = t == 1 && n >= 4 * ADAMW8BIT_BLOCK ? put_ties(grads, (float)(1.0 - beta1), (float)(1.0 - beta2)) : -1;
        if (ties >= 0 && ties < 40) { // (the search finds 56 at betas 0.9, 0.999, 60 at 0.3, 0.45)
            printf("FAIL adamw8bit_update %s: only %d moments on rounding ties n=%zu\n", variant, ties, n);
            failures++;
        }
        float *d_grads = to_device_raw(grads);
        ref_adamw8bit_update(params.data(), grads.data(), m_codes.data(), m_absmax.data(), v_codes.data(),
                             v_absmax.data(), n, t, lr, beta1, beta2, eps, wd);
        if (cut) adamw8bit_update(d_params, d_grads, d_m_codes, d_m_absmax, d_v_codes, d_v_absmax, cut, t, lr, beta1,
                                  beta2, eps, wd, d_copy, 0);
        adamw8bit_update(d_params + cut, d_grads + cut, d_m_codes + cut, d_m_absmax + slice_blocks, d_v_codes + cut,
                         d_v_absmax + slice_blocks, n - cut, t, lr, beta1, beta2, eps, wd, d_copy ? d_copy + cut : d_copy, 0);
        snprintf(shape, sizeof shape, "n=%zu step=%d", n, t);
        check_bits("adamw8bit_update", variant, "params", shape, to_host_raw(d_params, n), params);
        check_bits("adamw8bit_update", variant, "mcodes", shape, to_host_raw(d_m_codes, n), m_codes);
        check_bits("adamw8bit_update", variant, "mabsmx", shape, to_host_raw(d_m_absmax, nb), m_absmax);
        check_bits("adamw8bit_update", variant, "vcodes", shape, to_host_raw(d_v_codes, n), v_codes);
        check_bits("adamw8bit_update", variant, "vabsmx", shape, to_host_raw(d_v_absmax, nb), v_absmax);
        if (with_copy) check_bits("adamw8bit_update", variant, type_name<E>(), shape, to_host_raw(d_copy, n),
                                  to_host_raw(to_device<E>(params), n)); // the parameters rounded to nearest even
        if (timed && t == 3) { // reads params, grads and codes, writes params and codes (and the copy); absmax: 1/256
            float ms = time_ms([&] {
                adamw8bit_update(d_params, d_grads, d_m_codes, d_m_absmax, d_v_codes, d_v_absmax, n, t, lr, beta1,
                                 beta2, eps, wd, d_copy, 0);
            });
            report_time("adamw8bit_update", variant, shape, ms, n * (3.0 * sizeof(float) + 4 + (with_copy ? sizeof(E) : 0)));
        }
    }
    free_device();
}

template <typename E> void check_fp32_path(size_t n, double beta1, double beta2, bool timed) {
    char shape[80], variant[32];
    bool with_copy = !std::is_same<E, float>::value;
    snprintf(variant, sizeof variant, "fp32%s%s%s", beta1 < 0.5 ? "-b.3" : "", with_copy ? "+" : "",
             with_copy ? type_name<E>() : "");
    double lr = 1e-3, eps = 1e-8, wd = 0.1;
    std::vector<float> params = random_vector(n), m(n, 0.0f), v(n, 0.0f);
    float *d_params = to_device_raw(params), *d_m = to_device_raw(m), *d_v = to_device_raw(v);
    E *d_copy = with_copy ? device_poisoned<E>(n) : NULL;
    for (int t = 1; t <= 3; t++) {
        std::vector<float> grads = gradients(n);
        float *d_grads = to_device_raw(grads);
        ref_adamw_torchao_update(params.data(), grads.data(), m.data(), v.data(), n, t, lr, beta1, beta2, eps, wd);
        adamw_torchao_update(d_params, d_grads, d_m, d_v, n, t, lr, beta1, beta2, eps, wd, d_copy, 0);
        snprintf(shape, sizeof shape, "n=%zu step=%d", n, t);
        check_bits("adamw_torchao_update", variant, "params", shape, to_host_raw(d_params, n), params);
        check_bits("adamw_torchao_update", variant, "m", shape, to_host_raw(d_m, n), m);
        check_bits("adamw_torchao_update", variant, "v", shape, to_host_raw(d_v, n), v);
        if (with_copy) check_bits("adamw_torchao_update", variant, type_name<E>(), shape, to_host_raw(d_copy, n),
                                  to_host_raw(to_device<E>(params), n));
        if (timed && t == 3) {
            float ms = time_ms([&] { adamw_torchao_update(d_params, d_grads, d_m, d_v, n, t, lr, beta1, beta2, eps, wd, d_copy, 0); });
            report_time("adamw_torchao_update", variant, shape, ms, n * (7.0 * sizeof(float) + (with_copy ? sizeof(E) : 0)));
        }
    }
    free_device();
}

// (--quick: 256 blocks of 256 at most, a block's threads being fibers in the emulated build)
template <typename E> void check_sizes(bool quick) {
    for (int low = 0; low < 2; low++) {
        double beta1 = low ? 0.3 : 0.9, beta2 = low ? 0.45 : 0.999;
        check_8bit<E>(5 * ADAMW8BIT_BLOCK, 0, beta1, beta2, false);
        check_8bit<E>(5 * ADAMW8BIT_BLOCK, 2, beta1, beta2, false);
        check_8bit<E>((size_t)1 << 16, 100, beta1, beta2, false);
        check_fp32_path<E>(1001, beta1, beta2, false);
        check_fp32_path<E>((size_t)1 << 20, beta1, beta2, false);
    }
    if (!quick) {
        check_8bit<E>((size_t)1 << 20, 0, 0.9, 0.999, false);
        check_8bit<E>((size_t)1 << 20, 1000, 0.9, 0.999, false);
        check_8bit<E>((size_t)1 << 26, 0, 0.9, 0.999, true); // 67M parameters: a full fine-tuning shard
        check_fp32_path<E>((size_t)1 << 26, 0.9, 0.999, true);
    }
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_sizes<float>(quick);
    check_sizes<__nv_bfloat16>(quick);
    check_sizes<__half>(quick);
    return finish("adamw8bit");
}
