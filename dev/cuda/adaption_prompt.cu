// adaption_prompt_forward and adaption_prompt_backward (peft/adaption_prompt.cuh, llama_adapter's
// attention branch) against peft/adaption_prompt.h's, for chunks of queries with GQA (4 query heads
// on 2 KV heads, and 1 on 1) and prompts of 1, 10 and 40 rows: out, and dq, the prompt's and
// the gate's gradients, each added into. The gate and the gradients are fp32 (the masters).
#include "common.cuh"
#include "../../peft/adaption_prompt.cuh"

struct Shape { int N, D, NH, NKV, hd, A; };

void describe(char *buf, size_t n, const Shape &s) {
    snprintf(buf, n, "N=%d D=%d NH=%d NKV=%d hd=%d A=%d", s.N, s.D, s.NH, s.NKV, s.hd, s.A);
}

// fp32: cuBLASLt's Kp, Vp and the warps' sums add in other orders than the CPU's (1e-5).
// bf16: q, dout, the prompt and the weights are bf16 on both sides, but dq is stored in
// bf16 (2^-9) and so are the transposed dKp, dVp the prompt's gradient is made from:
// 1e-2 of the largest value.
template <typename T> double branch_tol() { return tol<T>(1e-5, 1e-2); }

template <typename T> void check_branch(const Shape &s, bool timed) {
    char shape[128];
    describe(shape, sizeof shape, s);
    size_t Q = (size_t)s.NH * s.hd, KV = (size_t)s.NKV * s.hd, NQ = (size_t)s.N * Q;
    std::vector<float> inp = rounded<T>(random_vector(NQ)), q = rounded<T>(random_vector(NQ, -2.0f, 2.0f));
    std::vector<float> prompt = rounded<T>(random_vector((size_t)s.A * s.D, -2.0f, 2.0f));
    std::vector<float> wk = rounded<T>(random_vector(KV * s.D)), wv = rounded<T>(random_vector(KV * s.D));
    std::vector<float> gate = random_vector(1, 0.3f, 0.9f), dout = rounded<T>(random_vector(NQ));
    std::vector<float> dq = rounded<T>(random_vector(NQ)), dprompt = random_vector((size_t)s.A * s.D);
    std::vector<float> dgate = random_vector(1), out(NQ), kpvp(2 * s.A * KV), dkv(2 * s.A * KV);
    std::vector<float> coef(2 * NQ / s.hd * s.A), gz(NQ / s.hd);
    T *d_inp = to_device<T>(inp), *d_q = to_device<T>(q), *d_prompt = to_device<T>(prompt), *d_wk = to_device<T>(wk);
    T *d_wv = to_device<T>(wv), *d_dout = to_device<T>(dout), *d_dq = to_device<T>(dq);
    T *d_out = device_poisoned<T>(NQ), *d_dkv = device_alloc<T>(2 * s.A * KV);
    float *d_gate = to_device<float>(gate), *d_dprompt = to_device<float>(dprompt), *d_dgate = to_device<float>(dgate);
    float *d_kpvp = device_alloc<float>(2 * s.A * KV), *d_coef = device_alloc<float>(coef.size());
    float *d_gz = device_alloc<float>(gz.size());
    ref_adaption_prompt_forward(out.data(), inp.data(), q.data(), prompt.data(), gate.data(), wk.data(), wv.data(),
                                kpvp.data(), s.N, s.D, s.NH, s.NKV, s.hd, s.A);
    ref_adaption_prompt_backward(dq.data(), dprompt.data(), dgate.data(), dout.data(), q.data(), prompt.data(), gate.data(),
                                 wk.data(), wv.data(), kpvp.data(), dkv.data(), coef.data(), gz.data(), s.N, s.D, s.NH,
                                 s.NKV, s.hd, s.A);
    auto forward = [&] {
        adaption_prompt_forward(d_out, d_inp, d_q, d_prompt, d_gate, d_wk, d_wv, d_kpvp, s.N, s.D, s.NH, s.NKV, s.hd, s.A, 0);
    };
    auto backward = [&] {
        adaption_prompt_backward(d_dq, d_dprompt, d_dgate, d_dout, d_q, d_prompt, d_gate, d_wk, d_wv, d_kpvp, d_dkv, d_coef,
                                 d_gz, s.N, s.D, s.NH, s.NKV, s.hd, s.A, 0);
    };
    forward();
    backward();
    check("adaption_prompt_forward", type_name<T>(), "out", shape, to_host(d_out, NQ), out, branch_tol<T>());
    check("adaption_prompt_backward", type_name<T>(), "dq", shape, to_host(d_dq, NQ), dq, branch_tol<T>());
    check("adaption_prompt_backward", type_name<T>(), "dprompt", shape, to_host(d_dprompt, dprompt.size()), dprompt,
          branch_tol<T>());
    check("adaption_prompt_backward", type_name<T>(), "dgate", shape, to_host(d_dgate, 1), dgate, branch_tol<T>());
    if (timed) {
        double flops = 4.0 * NQ * s.A; // scores and values, one multiply-add each
        report_time("adaption_prompt_forward", type_name<T>(), shape, time_ms(forward), 0, flops);
        report_time("adaption_prompt_backward", type_name<T>(), shape, time_ms(backward), 0, 3 * flops);
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    const Shape shapes[] = {{7, 64, 4, 2, 16, 3}, {12, 48, 3, 3, 16, 1}, {20, 96, 4, 1, 24, 40},
                            {4096, 4096, 32, 8, 128, 10}}; // the last: a Llama-3-8B layer, chunk of 4096
    int n = quick ? 3 : 4;
    for (int i = 0; i < n; i++) check_branch<T>(shapes[i], i == 3);
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    matmul_setup();
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    matmul_free();
    return finish("adaption_prompt");
}
