// embedding_forward / embedding_backward (layers.cuh) against train_llama2.c's.
// Few distinct tokens, so rows repeat: the backward's sums over repeated tokens
// run in the CPU's order, so both outputs must match exactly (tolerance 0).
// And copy_rows, the embedding's lookup, as chunk_head moves the rows that have a
// target: gathered to the front of another buffer, then scattered back into a
// buffer that holds other rows. Its CPU twin moves the rows in place with memcpy
// (train_llama2.c's chunk_head), so the reference is that copy: tolerance 0.
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

// N rows of D, every third kept (and the last): gathered from (N, D), scattered back into (N, D)
template <typename T> void check_copy_rows(int N, int D, bool timed) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d D=%d", N, D);
    std::vector<int> kept;
    for (int i = 0; i < N; i++)
        if (i % 3 == 1 || i == N - 1) kept.push_back(i);
    int nk = (int)kept.size();
    std::vector<float> in = rounded<T>(random_vector((size_t)N * D)), held = rounded<T>(random_vector((size_t)N * D));
    std::vector<float> gathered((size_t)nk * D), scattered = held;
    for (int j = 0; j < nk; j++) {
        memcpy(&gathered[(size_t)j * D], &in[(size_t)kept[j] * D], D * sizeof(float));
        memcpy(&scattered[(size_t)kept[j] * D], &in[(size_t)kept[j] * D], D * sizeof(float));
    }
    int *d_kept = to_device(kept);
    T *d_in = to_device<T>(in), *d_rows = device_poisoned<T>((size_t)nk * D), *d_out = to_device<T>(held);
    copy_rows(d_rows, (const int *)NULL, d_in, d_kept, nk, D, 0);
    copy_rows(d_out, d_kept, d_rows, (const int *)NULL, nk, D, 0);
    check("copy_rows", type_name<T>(), "gathered", shape, to_host(d_rows, (size_t)nk * D), gathered, 0.0);
    check("copy_rows", type_name<T>(), "scattered", shape, to_host(d_out, (size_t)N * D), scattered, 0.0);
    if (timed) {
        float ms = time_ms([&] { copy_rows(d_out, d_kept, d_rows, (const int *)NULL, nk, D, 0); });
        report_time("copy_rows", type_name<T>(), shape, ms, 2.0 * nk * D * sizeof(T));
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    check_embedding<T>(300, 50, 96, false);
    check_embedding<T>(4096, 512, 64, false);
    if (!quick) check_embedding<T>(4096, 32000, 4096, true); // Llama-2-7B, 4 x 1024 tokens
    check_copy_rows<T>(1, 5, false);
    check_copy_rows<T>(100, 96, false);
    if (!quick) check_copy_rows<T>(4096, 4096, true); // a 7B chunk's rows, a third of them kept
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    return finish("embedding");
}
