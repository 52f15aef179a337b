// sgd_update (layers.cuh) against train_llama2.c's, bit for bit (both step with
// support/optimizer.h's sgd_elem; --cpu_offload needs them equal), over a few steps with weight
// decay: plain SGD (no buffer), momentum, and Nesterov momentum, each with and
// without the bf16 copy of the parameters. Step 1 checks that the momentum buffer
// starts as the gradient, the later steps its decay.
#include "common.cuh"
#include "../../layers.cuh"

void check_sgd(size_t n, float momentum, int nesterov, bool with_copy, bool timed) {
    char shape[64], variant[32];
    snprintf(variant, sizeof variant, "%s%s", momentum == 0 ? "plain" : nesterov ? "nesterov" : "momentum",
             with_copy ? "+bf16" : "");
    float lr = 1e-2f, wd = 0.1f;
    std::vector<float> params = random_vector(n), buf(n, 0.0f);
    float *d_params = to_device<float>(params);
    float *d_buf = momentum != 0 ? device_poisoned<float>(n) : NULL; // step 1 must overwrite it, not read it
    __nv_bfloat16 *d_copy = with_copy ? device_poisoned<__nv_bfloat16>(n) : NULL;
    for (int t = 1; t <= 3; t++) { // fresh gradients each step
        std::vector<float> grads = random_vector(n);
        float *d_grads = to_device<float>(grads);
        ref_sgd_update(params.data(), grads.data(), d_buf ? buf.data() : NULL, n, t, lr, momentum, nesterov, wd);
        sgd_update(d_params, d_grads, d_buf, n, t, lr, momentum, nesterov, wd, d_copy, 0);
        snprintf(shape, sizeof shape, "n=%zu step=%d", n, t);
        // the same fp32 operations on both sides; only a fused multiply-add may round
        // differently (an ulp or two of values up to ~3): 1e-6 of the largest
        check_bits("sgd_update", variant, "params", shape, to_host(d_params, n), params);
        if (d_buf) check_bits("sgd_update", variant, "buf", shape, to_host(d_buf, n), buf);
        if (with_copy) check("sgd_update", variant, "bf16", shape, to_host(d_copy, n), params, 4e-3);
        if (timed && t == 3) { // reads params, grads (and buf), writes params (and buf, and the copy)
            float ms = time_ms([&] { sgd_update(d_params, d_grads, d_buf, n, t, lr, momentum, nesterov, wd, d_copy, 0); });
            report_time("sgd_update", variant, shape, ms, n * ((d_buf ? 5.0 : 3.0) * sizeof(float) + (with_copy ? 2 : 0)));
        }
    }
    free_device();
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    const float momenta[3] = {0.0f, 0.9f, 0.9f};
    for (int copy = 0; copy < 2; copy++)
        for (int k = 0; k < 3; k++) {
            int nesterov = k == 2;
            check_sgd(1001, momenta[k], nesterov, copy, false);
            check_sgd((size_t)1 << 20, momenta[k], nesterov, copy, false);
            if (!quick) check_sgd((size_t)1 << 26, momenta[k], nesterov, copy, true); // 67M parameters: a full fine-tuning shard
        }
    return finish("sgd");
}
