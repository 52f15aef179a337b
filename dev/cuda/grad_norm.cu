// grad_norm, grad_sumsq (its square, which sharded ranks add up) and clip_grads (with a loss scale's unscaling)
// (layers.cuh) against train_llama2.c's. The GPU sums in fp64 like the CPU, in another
// fixed order, so the norm agrees to ~1e-12; compared as floats, to 1e-6. sum_host
// (--cpu_offload's sum on the host, in the GPU's order) and clip_grads: bit for bit.
// --pure_bf16's bf16 gradients: the sum of squares of their values (exact in double) as
// the CPU's of the same values in floats (and sum_host's of them in bf16 storage), and
// clip_grads as the CPU's followed by its round_bf16 (bf16_round), bit for bit.
#include "common.cuh"
#include "../../layers.cuh"

void check_grad_norm(size_t n, bool timed) {
    char shape[32];
    snprintf(shape, sizeof shape, "n=%zu", n);
    std::vector<float> g = random_vector(n, -0.01f, 0.01f);
    float *d_g = to_device<float>(g);
    double *d_norm = device_poisoned<double>(1), norm, ref = ref_grad_norm(g.data(), n);
    grad_sumsq(d_norm, d_g, n, false, 0);
    cudaCheck(cudaMemcpy(&norm, d_norm, sizeof norm, cudaMemcpyDeviceToHost));
    check("grad_sumsq", "fp32", "sumsq", shape, {(float)norm}, {(float)(ref * ref)}, 1e-6);
    check_bits("sum_host", "fp32", "sumsq", shape, std::vector<double>{sum_host<true>(g.data(), n)}, std::vector<double>{norm});
    global_sum(d_norm, d_g, n, 0);
    cudaCheck(cudaMemcpy(&norm, d_norm, sizeof norm, cudaMemcpyDeviceToHost));
    check_bits("sum_host", "fp32", "sum", shape, std::vector<double>{sum_host<false>(g.data(), n)}, std::vector<double>{norm});
    cudaCheck(cudaMemset(d_norm, 0xFF, sizeof(double))); // NaN again
    grad_norm(d_norm, d_g, n, 0);
    cudaCheck(cudaMemcpy(&norm, d_norm, sizeof norm, cudaMemcpyDeviceToHost));
    check("grad_norm", "fp32", "norm", shape, {(float)norm}, {(float)ref}, 1e-6);
    // max_norm above the norm leaves g alone; below, scales it; with a loss scale
    // (inv_scale 2^-10) g is unscaled too, clipped or not, against the unscaled norm
    const double cases[][2] = {{2.0, 1.0}, {0.5, 1.0}, {2.0, 1.0 / 1024}, {0.5, 1.0 / 1024}}; // (ratio, inv_scale)
    for (const double *c : cases) {
        double unscaled = ref * c[1];
        float max_norm = (float)(unscaled * c[0]);
        std::vector<float> clipped = g;
        ref_clip_grads(clipped.data(), n, unscaled, max_norm, (float)c[1]);
        cudaCheck(cudaMemcpy(d_norm, &unscaled, sizeof unscaled, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_g, g.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        clip_grads(d_g, n, d_norm, max_norm, (float)c[1], 0);
        check_bits("clip_grads", "fp32", c[0] > 1 ? (c[1] < 1 ? "unscaled" : "unclipped") : (c[1] < 1 ? "unscaled+clipped" : "clipped"),
                   shape, to_host(d_g, n), clipped);
    }
    cudaCheck(cudaMemcpy(d_norm, &ref, sizeof ref, cudaMemcpyHostToDevice));
    if (timed) {
        float ms = time_ms([&] { grad_norm(d_norm, d_g, n, 0); });
        report_time("grad_norm", "fp32", shape, ms, n * sizeof(float));
        float max_norm = (float)(ref * 0.999); // scales every time, by little (never time on zeros)
        ms = time_ms([&] { clip_grads(d_g, n, d_norm, max_norm, 1.0f, 0); });
        report_time("clip_grads", "fp32", shape, ms, 2.0 * n * sizeof(float));
    }
    free_device();
}

void check_grad_norm_bf16(size_t n) {
    char shape[32];
    snprintf(shape, sizeof shape, "n=%zu", n);
    std::vector<float> g = rounded<__nv_bfloat16>(random_vector(n, -0.01f, 0.01f));
    __nv_bfloat16 *d_g = to_device<__nv_bfloat16>(g);
    double *d_norm = device_poisoned<double>(1), sumsq, ref = ref_grad_norm(g.data(), n);
    grad_sumsq(d_norm, d_g, n, false, 0);
    cudaCheck(cudaMemcpy(&sumsq, d_norm, sizeof sumsq, cudaMemcpyDeviceToHost));
    check_bits("grad_sumsq", "bf16", "sumsq", shape, std::vector<double>{sum_host<true>(g.data(), n)}, std::vector<double>{sumsq});
    std::vector<__nv_bfloat16> gb(n); // sum_host of bf16 storage (--cpu_offload's --pure_bf16 gradients)
    for (size_t i = 0; i < n; i++) gb[i] = __float2bfloat16(g[i]);
    check_bits("sum_host", "bf16", "sumsq", shape, std::vector<double>{sum_host<true>(gb.data(), n)}, std::vector<double>{sumsq});
    double unscaled = ref / 1024; // clipped to half and unscaled by 2^-10, as a loss-scaled step
    std::vector<float> clipped = g;
    ref_clip_grads(clipped.data(), n, unscaled, (float)(unscaled * 0.5), 1.0f / 1024);
    for (float &x : clipped) x = bf16_round(x);
    cudaCheck(cudaMemcpy(d_norm, &unscaled, sizeof unscaled, cudaMemcpyHostToDevice));
    clip_grads(d_g, n, d_norm, (float)(unscaled * 0.5), 1.0f / 1024, 0);
    check_bits("clip_grads", "bf16", "unscaled+clipped", shape, to_host(d_g, n), clipped);
    free_device();
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_grad_norm(1, false);
    check_grad_norm(1001, false);
    check_grad_norm(((size_t)1 << 24) + 7, false);
    if (!quick) check_grad_norm((size_t)1 << 27, true); // 134M gradients
    check_grad_norm_bf16(1001);
    check_grad_norm_bf16(((size_t)1 << 20) + 7);
    return finish("grad_norm");
}
