// crossentropy_forward_backward (layers.cuh) against train_llama2.c's, row by
// row (the CPU returns the sum of its rows, so each row is one call), and
// global_sum of the per-row losses against the CPU's sum over all rows.
// About one target in five is -100 (no loss, zero gradient). With weights, each row's
// gradient is scaled by its own (preference tuning's per-token weights: signed, some 0).
#include "common.cuh"
#include "../../layers.cuh"

template <typename T> void check_crossentropy(int n, int V, float grad_scale, bool weighted, bool timed) {
    char shape[80];
    snprintf(shape, sizeof shape, "n=%d V=%d grad_scale=%g%s", n, V, grad_scale, weighted ? " weighted" : "");
    std::vector<float> logits = rounded<T>(random_vector((size_t)n * V, -8.0f, 8.0f)), losses(n);
    std::vector<int> targets = random_ints(n, 0, V);
    for (int i = 0; i < n; i++) if (rng_u32() % 5 == 0) targets[i] = -100;
    std::vector<float> weights = random_vector(n, -2.0f, 2.0f);
    for (int i = 0; i < n; i++) if (rng_u32() % 7 == 0) weights[i] = 0.0f;
    const float *w = weighted ? weights.data() : NULL, *d_w = weighted ? to_device<float>(weights) : NULL;
    T *d_logits = to_device<T>(logits);
    int *d_targets = to_device(targets);
    float *d_losses = device_poisoned<float>(n);
    double *d_sum = device_poisoned<double>(1), sum;
    std::vector<float> all = logits;
    double total = ref_crossentropy_forward_backward(all.data(), targets.data(), w, n, V, grad_scale);
    for (int i = 0; i < n; i++) // each row alone, for its loss; the gradient is the same either way
        losses[i] = (float)ref_crossentropy_forward_backward(logits.data() + (size_t)i * V, &targets[i], w ? w + i : NULL, 1, V, grad_scale);
    crossentropy_forward_backward(d_logits, d_losses, d_targets, d_w, n, V, grad_scale, 0);
    global_sum(d_sum, d_losses, n, 0);
    check("crossentropy_forward_backward", type_name<T>(), "losses", shape, to_host(d_losses, n), losses, 1e-5);
    if (grad_scale != 0.0f) // (without a gradient the logits are scratch on both sides)
        check("crossentropy_forward_backward", type_name<T>(), "dlogits", shape, to_host(d_logits, (size_t)n * V), all,
              tol<T>(1e-5, 4e-3));
    cudaCheck(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
    check("global_sum", type_name<T>(), "loss", shape, {(float)sum}, {(float)total}, 1e-6);
    if (timed) {
        float ms = time_ms([&] { crossentropy_forward_backward(d_logits, d_losses, d_targets, d_w, n, V, grad_scale, 0); });
        report_time("crossentropy_forward_backward", type_name<T>(), shape, ms, 2.0 * n * V * sizeof(T));
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    check_crossentropy<T>(7, 512, 1.0f / 7, false, false);  // the test fixtures' vocabulary
    check_crossentropy<T>(64, 32000, 0.0f, false, false);   // evaluation: loss only
    check_crossentropy<T>(64, 32000, 1.0f / 50, false, false);
    check_crossentropy<T>(3, 50257, 1.0f, false, false);    // a vocabulary that no block size divides
    check_crossentropy<T>(7, 512, 1.0f / 7, true, false);   // a weight per row (preference tuning)
    check_crossentropy<T>(64, 32000, 0.25f, true, false);
    if (!quick) check_crossentropy<T>(4096, 32000, 1.0f / 4096, false, true); // Llama-2-7B, 4 x 1024 tokens
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    return finish("crossentropy");
}
