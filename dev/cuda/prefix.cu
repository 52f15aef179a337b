// prefix_to_carry and prefix_backward (peft/prefix.cuh, prefix tuning's place in the KV carry)
// against peft/prefix.h's, for GQA's and plain shapes, one row and several: the carries' first P
// rows of every layer (the rest must stay as they were), and the prompt's gradient, added into.
#include "common.cuh"
#include "../../peft/prefix.cuh"

struct Shape { int L, B, P, T, KV; };

void describe(char *buf, size_t n, const Shape &s) {
    snprintf(buf, n, "L=%d B=%d P=%d T=%d KV=%d", s.L, s.B, s.P, s.T, s.KV);
}

template <typename T> void check_prefix(const Shape &s, bool timed) {
    char shape[128];
    describe(shape, sizeof shape, s);
    size_t KV = (size_t)s.KV, carry = (size_t)s.L * s.B * (s.P + s.T) * KV, np = (size_t)s.P * s.L * 2 * KV;
    // the prompt in T on both sides (the GPU reads the masters' copy in the compute type)
    std::vector<float> prompt = rounded<T>(random_vector(np, -2.0f, 2.0f));
    std::vector<float> k = rounded<T>(random_vector(carry)), v = rounded<T>(random_vector(carry));
    std::vector<float> dk = rounded<T>(random_vector(carry)), dv = rounded<T>(random_vector(carry));
    std::vector<float> dprompt = random_vector(np);
    T *d_prompt = to_device<T>(prompt), *d_k = to_device<T>(k), *d_v = to_device<T>(v);
    T *d_dk = to_device<T>(dk), *d_dv = to_device<T>(dv);
    float *d_dprompt = to_device<float>(dprompt);
    ref_prefix_to_carry(k.data(), v.data(), prompt.data(), s.L, s.B, s.P, s.T, KV);
    ref_prefix_backward(dprompt.data(), dk.data(), dv.data(), s.L, s.B, s.P, s.T, KV);
    auto to_carry = [&] { prefix_to_carry(d_k, d_v, d_prompt, s.L, s.B, s.P, s.T, KV, 0); };
    auto backward = [&] { prefix_backward(d_dprompt, d_dk, d_dv, s.L, s.B, s.P, s.T, KV, 0); };
    to_carry();
    backward();
    // copies, and fp32 sums of B terms in the CPU's order: the same bits
    check("prefix_to_carry", type_name<T>(), "k", shape, to_host(d_k, carry), k, 0.0);
    check("prefix_to_carry", type_name<T>(), "v", shape, to_host(d_v, carry), v, 0.0);
    check("prefix_backward", type_name<T>(), "dprompt", shape, to_host(d_dprompt, np), dprompt, 0.0);
    if (timed) {
        report_time("prefix_to_carry", type_name<T>(), shape, time_ms(to_carry), 2.0 * np * sizeof(T) * s.B, 0);
        report_time("prefix_backward", type_name<T>(), shape, time_ms(backward), np * (s.B * sizeof(T) + 2 * sizeof(float)), 0);
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    const Shape shapes[] = {{2, 2, 3, 24, 32}, {2, 1, 5, 7, 48}, {3, 3, 1, 5, 16},
                            {32, 4, 30, 4096, 1024}}; // the last: Llama-3-8B's 8 KV heads of 128, 30 virtual tokens
    int n = quick ? 3 : 4;
    for (int i = 0; i < n; i++) check_prefix<T>(shapes[i], i == 3);
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    return finish("prefix");
}
