// embedding_forward / embedding_backward (layers.cuh) against train_llama2.c's.
// Few distinct tokens, so rows repeat: the backward's sums over repeated tokens
// run in the CPU's order, so both outputs must match exactly (tolerance 0).
#include "common.cuh"
#include "../../layers.cuh"

template <typename T> void check_embedding(int N, int V, int D, bool timed) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d V=%d D=%d", N, V, D);
    std::vector<int> tokens = random_ints(N, 0, V);
    std::vector<float> embed = rounded<T>(random_vector((size_t)V * D)), dout = rounded<T>(random_vector((size_t)N * D));
    std::vector<float> out((size_t)N * D), dembed = random_vector((size_t)V * D); // the gradient is added into
    int *d_tokens = to_device(tokens);
    T *d_embed = to_device<T>(embed), *d_out = device_poisoned<T>((size_t)N * D), *d_dout = to_device<T>(dout);
    float *d_dembed = to_device<float>(dembed);
    ref_embedding_forward(out.data(), tokens.data(), embed.data(), N, D);
    ref_embedding_backward(dembed.data(), dout.data(), tokens.data(), N, D);
    embedding_forward(d_out, d_tokens, d_embed, N, D, 0);
    embedding_backward(d_dembed, d_dout, d_tokens, N, D, 0);
    check("embedding_forward", type_name<T>(), "out", shape, to_host(d_out, (size_t)N * D), out, 0.0);
    check("embedding_backward", type_name<T>(), "dembed", shape, to_host(d_dembed, (size_t)V * D), dembed, 0.0);
    if (timed) {
        double rows = (double)N * D * sizeof(T);
        float ms = time_ms([&] { embedding_forward(d_out, d_tokens, d_embed, N, D, 0); });
        report_time("embedding_forward", type_name<T>(), shape, ms, 2 * rows);
        ms = time_ms([&] { embedding_backward(d_dembed, d_dout, d_tokens, N, D, 0); });
        report_time("embedding_backward", type_name<T>(), shape, ms, rows + 2.0 * N * D * sizeof(float));
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    check_embedding<T>(300, 50, 96, false);
    check_embedding<T>(4096, 512, 64, false);
    if (!quick) check_embedding<T>(4096, 32000, 4096, true); // Llama-2-7B, 4 x 1024 tokens
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    return finish("embedding");
}
