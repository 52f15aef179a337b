// accumulate and convert (layers.cuh). Their CPU twins are one-line loops in
// train_llama2.c (the residual adds `mid[i] += x[i]`), so the reference is that
// loop here, with the same fp32 arithmetic and the same rounding to bf16
// (round to nearest even on both sides): results must be equal (tolerance 0).
// --pure_bf16's round_bf16 and grads_bf16_add: train_llama2.c's round_bf16 and
// grads_bf16_end loops, on support/optimizer.h's bf16_round and bf16_grad_add (host); and
// grads_bf16_add's host loop (--cpu_offload's) against the same.
#include "common.cuh"
#include "../../layers.cuh"

// out (T) += x (X): X = T, or fp32 sums into a bf16 out (context parallelism's dKV carry, one rounding)
template <typename T, typename X = T> void check_accumulate(size_t n, bool timed) {
    char shape[64], types[32];
    snprintf(shape, sizeof shape, "n=%zu", n);
    snprintf(types, sizeof types, "%s+%s", type_name<T>(), type_name<X>());
    std::vector<float> out = rounded<T>(random_vector(n)), x = rounded<X>(random_vector(n));
    T *d_out = to_device<T>(out);
    X *d_x = to_device<X>(x);
    for (size_t i = 0; i < n; i++) out[i] = to_float(from_float<T>(out[i] + x[i]));
    accumulate(d_out, d_x, n, 0);
    check("accumulate", types, "out", shape, to_host(d_out, n), out, 0.0);
    if (timed) {
        float ms = time_ms([&] { accumulate(d_out, d_x, n, 0); });
        report_time("accumulate", types, shape, ms, (2.0 * sizeof(T) + sizeof(X)) * n);
    }
    free_device();
}

// fp32 -> bf16 (the weights' upload, the logits' gradient) and back
void check_convert(size_t n, bool timed) {
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    std::vector<float> x = random_vector(n, -100.0f, 100.0f), want = rounded<__nv_bfloat16>(x);
    float *d_x = to_device<float>(x), *d_back = device_poisoned<float>(n);
    __nv_bfloat16 *d_y = device_poisoned<__nv_bfloat16>(n);
    convert(d_y, d_x, n, 0);
    check("convert", "fp32>bf16", "out", shape, to_host(d_y, n), want, 0.0);
    convert(d_back, d_y, n, 0);
    check("convert", "bf16>fp32", "out", shape, to_host(d_back, n), want, 0.0);
    if (timed) {
        float ms = time_ms([&] { convert(d_y, d_x, n, 0); });
        report_time("convert", "fp32>bf16", shape, ms, 6.0 * n);
    }
    free_device();
}

// --pure_bf16's gradient rounding: a rank's part rounded in place (round_bf16), a micro-batch's fp32
// gradient added into the step's bf16 one (grads_bf16_add); every 7th value a tie (half a bf16 ulp
// below 0x8000 in its low bits), which rounds to even
void check_pure_bf16(size_t n, bool timed) {
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    std::vector<float> g = random_vector(n), acc = rounded<__nv_bfloat16>(random_vector(n));
    for (size_t i = 0; i < n; i += 7) {
        uint32_t u;
        memcpy(&u, &g[i], 4);
        u = (u & 0xffff0000u) | 0x8000u;
        memcpy(&g[i], &u, 4);
    }
    std::vector<float> rounded_g(n), added(n);
    for (size_t i = 0; i < n; i++) rounded_g[i] = bf16_round(g[i]), added[i] = bf16_grad_add(acc[i], g[i]);
    float *d_g = to_device<float>(g);
    __nv_bfloat16 *d_acc = to_device<__nv_bfloat16>(acc);
    grads_bf16_add(d_acc, d_g, n, 0);
    check("grads_bf16_add", "bf16+fp32", "acc", shape, to_host(d_acc, n), added, 0.0);
    std::vector<__nv_bfloat16> host_acc(n); // the host's (--cpu_offload)
    std::vector<float> host_added(n);
    for (size_t i = 0; i < n; i++) host_acc[i] = __float2bfloat16(acc[i]);
    grads_bf16_add(host_acc.data(), g.data(), n);
    for (size_t i = 0; i < n; i++) host_added[i] = __bfloat162float(host_acc[i]);
    check("grads_bf16_add (host)", "bf16+fp32", "acc", shape, host_added, added, 0.0);
    round_bf16(d_g, n, 0);
    check("round_bf16", "fp32", "x", shape, to_host(d_g, n), rounded_g, 0.0);
    if (timed) {
        float ms = time_ms([&] { grads_bf16_add(d_acc, d_g, n, 0); });
        report_time("grads_bf16_add", "bf16+fp32", shape, ms, 8.0 * n);
    }
    free_device();
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    size_t sizes[] = {1, 1000, (size_t)1 << 20, (size_t)1 << 26};
    int n = quick ? 3 : 4;
    for (int i = 0; i < n; i++) {
        bool timed = i == 3;
        check_accumulate<float>(sizes[i], timed);
        check_accumulate<__nv_bfloat16>(sizes[i], timed);
        check_accumulate<__nv_bfloat16, float>(sizes[i], timed);
        check_convert(sizes[i], timed);
        check_pure_bf16(sizes[i], timed);
    }
    return finish("elementwise");
}
