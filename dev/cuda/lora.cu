// lora_dropout, lora_forward and lora_backward (lora.cuh) against lora.h's, for
// one adapted module (layer 0, q_proj) over a chunk of rows (B, T, t0, len),
// with and without dropout; DoRA's dora_norm, dora_forward and dora_backward; and IA3's ia3_forward and
// ia3_backward (a feedforward module and another). The dropout mask is lora.h's counter hash on both
// sides, so in fp32 lora_dropout must equal the CPU exactly (tolerance 0): the
// same mask and the same fp32 product per element.
#include "common.cuh"
#include "../../lora.cuh"
#include "../../peft/ia3.cuh"

// an adapter of one module with A (r, in) then B (out, r) in one flat buffer, as lora.h lays it out
// (dora: and its magnitude m (out) after B)
LoRA one_module(int r, int in, int out, float alpha, float p, int dora = 0) {
    int ins[LORA_N_TARGETS] = {in}, outs[LORA_N_TARGETS] = {out};
    LoRA l;
    lora_alloc(&l, 1, ins, outs, r, alpha, p, 0, dora, 1u << LORA_Q);
    return l;
}

struct Shape { int B, T, t0, len, in, out, r; };
const uint64_t KEY = 0x5eed;

void describe(char *buf, size_t n, const Shape &s, float p) {
    snprintf(buf, n, "B=%d T=%d t0=%d len=%d in=%d out=%d r=%d p=%g", s.B, s.T, s.t0, s.len, s.in, s.out, s.r, p);
}

template <typename T> void check_dropout(const Shape &s, float p, bool timed) {
    char shape[128];
    describe(shape, sizeof shape, s, p);
    size_t n = (size_t)s.B * s.len * s.in;
    std::vector<float> inp = rounded<T>(random_vector(n)), ref(n);
    ref_lora_dropout(ref.data(), inp.data(), s.in, s.B, s.T, s.t0, s.len, KEY, p);
    LoRA l = {};
    l.dropout = p;
    Chunk ch = {s.B, s.T, s.t0, s.len, 0, 0};
    T *d_inp = to_device<T>(inp), *out = device_poisoned<T>(n);
    lora_dropout(&l, out, d_inp, s.in, &ch, KEY, 0);
    // fp32: exact (above); bf16: the product rounded once, within 2^-9 of the largest value
    check("lora_dropout", type_name<T>(), "out", shape, to_host(out, n), ref, tol<T>(0.0, 4e-3));
    if (timed) {
        float ms = time_ms([&] { lora_dropout(&l, out, d_inp, s.in, &ch, KEY, 0); });
        report_time("lora_dropout", type_name<T>(), shape, ms, 2.0 * n * sizeof(T));
    }
    free_device();
}

// fp32: cuBLASLt and the CPU's gemm sum in different orders (as in matmul.cu, 1e-5).
// bf16: h, dh and the outputs are rounded to bf16 (2^-9 each), and the products
// of rounded intermediates add a few such errors: 1e-2 of the largest value.
template <typename T> double lora_tol() { return tol<T>(1e-5, 1e-2); }

template <typename T> void check_forward(const Shape &s, float p, bool timed) {
    char shape[128];
    describe(shape, sizeof shape, s, p);
    size_t N = (size_t)s.B * s.len;
    float alpha = 16.0f;
    std::vector<float> inp = rounded<T>(random_vector(N * s.in)), A = rounded<T>(random_vector((size_t)s.r * s.in));
    std::vector<float> Bw = rounded<T>(random_vector((size_t)s.out * s.r)), out = rounded<T>(random_vector(N * s.out));
    std::vector<float> h(N * s.r), w(A);
    w.insert(w.end(), Bw.begin(), Bw.end()); // lora.h's layout: A, then B
    T *d_out = to_device<T>(out), *d_inp = to_device<T>(inp), *d_w = to_device<T>(w);
    T *d_h = device_poisoned<T>(N * s.r), *d_xdrop = device_alloc<T>(N * s.in);
    ref_lora_forward(out.data(), inp.data(), h.data(), A.data(), Bw.data(), s.r, s.in, s.out, alpha, p, s.B, s.T, s.t0,
                     s.len, KEY);
    LoRA l = one_module(s.r, s.in, s.out, alpha, p);
    Chunk ch = {s.B, s.T, s.t0, s.len, 0, 0};
    auto run = [&] { lora_forward(&l, (const T *)d_w, 0, LORA_Q, d_out, d_inp, d_h, d_xdrop, &ch, KEY, 0); };
    run();
    check("lora_forward", type_name<T>(), "out", shape, to_host(d_out, N * s.out), out, lora_tol<T>());
    check("lora_forward", type_name<T>(), "h", shape, to_host(d_h, N * s.r), h, lora_tol<T>());
    if (timed) {
        float ms = time_ms(run);
        report_time("lora_forward", type_name<T>(), shape, ms, 0, 2.0 * N * s.r * (s.in + s.out));
    }
    lora_free(&l);
    free_device();
}

template <typename T> void check_backward(const Shape &s, float p, bool timed) {
    char shape[128];
    describe(shape, sizeof shape, s, p);
    size_t N = (size_t)s.B * s.len;
    float alpha = 16.0f;
    std::vector<float> dout = rounded<T>(random_vector(N * s.out)), inp = rounded<T>(random_vector(N * s.in));
    std::vector<float> h = rounded<T>(random_vector(N * s.r)), A = rounded<T>(random_vector((size_t)s.r * s.in));
    std::vector<float> Bw = rounded<T>(random_vector((size_t)s.out * s.r)), dinp = rounded<T>(random_vector(N * s.in));
    std::vector<float> dA = random_vector((size_t)s.r * s.in), dB = random_vector((size_t)s.out * s.r); // added into
    std::vector<float> w(A), g(dA);
    w.insert(w.end(), Bw.begin(), Bw.end());
    g.insert(g.end(), dB.begin(), dB.end());
    T *d_dinp = to_device<T>(dinp), *d_dout = to_device<T>(dout), *d_inp = to_device<T>(inp), *d_h = to_device<T>(h);
    T *d_w = to_device<T>(w), *d_dh = device_alloc<T>(N * s.r), *d_xdrop = device_alloc<T>(N * s.in);
    float *d_g = to_device<float>(g);
    ref_lora_backward(dinp.data(), dA.data(), dB.data(), dout.data(), inp.data(), h.data(), A.data(), Bw.data(), s.r,
                      s.in, s.out, alpha, p, s.B, s.T, s.t0, s.len, KEY);
    LoRA l = one_module(s.r, s.in, s.out, alpha, p);
    Chunk ch = {s.B, s.T, s.t0, s.len, 0, 0};
    auto run = [&] {
        lora_backward(&l, (const T *)d_w, d_g, 0, LORA_Q, d_dinp, d_dout, d_inp, d_h, d_dh, d_xdrop, &ch, KEY, 0);
    };
    run();
    std::vector<float> got_g = to_host(d_g, g.size());
    check("lora_backward", type_name<T>(), "dinp", shape, to_host(d_dinp, N * s.in), dinp, lora_tol<T>());
    check("lora_backward", type_name<T>(), "dA", shape, std::vector<float>(got_g.begin(), got_g.begin() + dA.size()),
          dA, lora_tol<T>());
    check("lora_backward", type_name<T>(), "dB", shape, std::vector<float>(got_g.begin() + dA.size(), got_g.end()),
          dB, lora_tol<T>());
    if (timed) {
        float ms = time_ms(run);
        report_time("lora_backward", type_name<T>(), shape, ms, 0, 4.0 * N * s.r * (s.in + s.out));
    }
    lora_free(&l);
    free_device();
}

// DoRA: a module whose base weight is W (out, in), with A, B, a magnitude near the row
// norms, and those norms (the CPU's, as the trainers keep them between forward and backward)
struct DoraModule {
    static constexpr float alpha = 16.0f;
    std::vector<float> W, A, Bw, mag, flat, norm, mag_init; // flat: lora.h's layout, A then B then m
    DoraModule(const Shape &s, bool bf16) : norm(s.out), mag_init(s.out) {
        auto round = [&](std::vector<float> v) { return bf16 ? rounded<__nv_bfloat16>(v) : v; };
        W = round(random_vector((size_t)s.out * s.in)); A = round(random_vector((size_t)s.r * s.in));
        Bw = round(random_vector((size_t)s.out * s.r)); mag = random_vector(s.out);
        for (float &m : mag) m = sqrtf((float)s.in) * (1.0f + 0.5f * m); // rows of W have norm ~ sqrt(in / 3)
        flat = A;
        flat.insert(flat.end(), Bw.begin(), Bw.end());
        flat.insert(flat.end(), mag.begin(), mag.end());
        ref_dora_norm(norm.data(), mag_init.data(), W.data(), A.data(), Bw.data(), s.r, s.in, s.out, alpha);
    }
};

// the norms sum r products per element and in elements per row: fp32 from the same
// (rounded) inputs on both sides, the CPU's sum in double, so 1e-5 in either type
template <typename T> void check_dora_norm(const Shape &s, bool timed) {
    char shape[128];
    describe(shape, sizeof shape, s, 0.0f);
    DoraModule d(s, !std::is_same<T, float>::value);
    LoRA l = one_module(s.r, s.in, s.out, d.alpha, 0.0f, 1);
    l.mag_unset[LORA_Q] = 1;
    T *d_w = to_device<T>(d.flat), *d_W = to_device<T>(d.W);
    float *d_params = to_device<float>(d.flat), *d_norm = device_poisoned<float>(s.out);
    dora_norm(&l, (const T *)d_w, d_params, 0, LORA_Q, d_norm, (const T *)d_W, 0);
    check("dora_norm", type_name<T>(), "norm", shape, to_host(d_norm, s.out), d.norm, 1e-5);
    std::vector<float> params = to_host(d_params, d.flat.size());
    check("dora_norm", type_name<T>(), "m set to the norm", shape,
          std::vector<float>(params.end() - s.out, params.end()), d.mag_init, 1e-5);
    if (timed) {
        float ms = time_ms([&] { dora_norm(&l, (const T *)d_w, d_params, 0, LORA_Q, d_norm, (const T *)d_W, 0); });
        report_time("dora_norm", type_name<T>(), shape, ms, 0, 2.0 * s.out * s.in * (s.r + 1));
    }
    lora_free(&l);
    free_device();
}

// out starts as x W^T (as linear_forward leaves it); DoRA adds its terms: lora_tol
template <typename T> void check_dora_forward(const Shape &s, float p, bool timed) {
    char shape[128];
    describe(shape, sizeof shape, s, p);
    size_t N = (size_t)s.B * s.len;
    DoraModule d(s, !std::is_same<T, float>::value);
    std::vector<float> inp = rounded<T>(random_vector(N * s.in)), out = rounded<T>(random_vector(N * s.out)), h(N * s.r);
    T *d_out = to_device<T>(out), *d_inp = to_device<T>(inp), *d_w = to_device<T>(d.flat), *d_W = to_device<T>(d.W);
    T *d_h = device_poisoned<T>(N * s.r), *d_xdrop = device_alloc<T>(N * s.in), *d_pre = device_alloc<T>(N * s.out);
    float *d_params = to_device<float>(d.flat), *d_norm = to_device<float>(d.norm);
    ref_dora_forward(out.data(), inp.data(), d.W.data(), h.data(), d.A.data(), d.Bw.data(), d.mag.data(), d.norm.data(),
                     s.r, s.in, s.out, d.alpha, p, s.B, s.T, s.t0, s.len, KEY);
    LoRA l = one_module(s.r, s.in, s.out, d.alpha, p, 1);
    Chunk ch = {s.B, s.T, s.t0, s.len, 0, 0};
    auto run = [&] {
        dora_forward(&l, (const T *)d_w, d_params, 0, LORA_Q, d_out, d_inp, (const T *)d_W, d_h, d_xdrop, d_pre, d_norm,
                     &ch, KEY, 0);
    };
    run();
    check("dora_forward", type_name<T>(), "out", shape, to_host(d_out, N * s.out), out, lora_tol<T>());
    check("dora_forward", type_name<T>(), "h", shape, to_host(d_h, N * s.r), h, lora_tol<T>());
    if (timed) {
        float ms = time_ms(run);
        report_time("dora_forward", type_name<T>(), shape, ms, 0, 2.0 * N * (s.r * (s.in + s.out) + (p > 0) * s.in * s.out));
    }
    lora_free(&l);
    free_device();
}

// dinp, dA, dB and dm, each added into: lora_tol
template <typename T> void check_dora_backward(const Shape &s, float p, bool timed) {
    char shape[128];
    describe(shape, sizeof shape, s, p);
    size_t N = (size_t)s.B * s.len;
    DoraModule d(s, !std::is_same<T, float>::value);
    std::vector<float> dout = rounded<T>(random_vector(N * s.out)), inp = rounded<T>(random_vector(N * s.in));
    std::vector<float> h = rounded<T>(random_vector(N * s.r)), dinp = rounded<T>(random_vector(N * s.in));
    std::vector<float> g = random_vector(d.flat.size()); // the gradients are added into
    T *d_dinp = to_device<T>(dinp), *d_dout = to_device<T>(dout), *d_inp = to_device<T>(inp), *d_h = to_device<T>(h);
    T *d_w = to_device<T>(d.flat), *d_W = to_device<T>(d.W), *d_dh = device_alloc<T>(N * s.r);
    T *d_xdrop = device_alloc<T>(N * s.in), *d_pre = device_alloc<T>(N * s.out);
    float *d_g = to_device<float>(g), *d_params = to_device<float>(d.flat), *d_norm = to_device<float>(d.norm);
    size_t nA = (size_t)s.r * s.in, nB = (size_t)s.out * s.r;
    ref_dora_backward(dinp.data(), g.data(), g.data() + nA, g.data() + nA + nB, dout.data(), inp.data(), d.W.data(),
                      h.data(), d.A.data(), d.Bw.data(), d.mag.data(), d.norm.data(), s.r, s.in, s.out, d.alpha, p, s.B,
                      s.T, s.t0, s.len, KEY);
    LoRA l = one_module(s.r, s.in, s.out, d.alpha, p, 1);
    Chunk ch = {s.B, s.T, s.t0, s.len, 0, 0};
    auto run = [&] {
        dora_backward(&l, (const T *)d_w, d_params, d_g, 0, LORA_Q, d_dinp, d_dout, d_inp, (const T *)d_W, d_h, d_dh,
                      d_xdrop, d_pre, d_norm, &ch, KEY, 0);
    };
    run();
    std::vector<float> got = to_host(d_g, g.size());
    check("dora_backward", type_name<T>(), "dinp", shape, to_host(d_dinp, N * s.in), dinp, lora_tol<T>());
    const char *names[3] = {"dA", "dB", "dm"};
    size_t from[4] = {0, nA, nA + nB, g.size()};
    for (int k = 0; k < 3; k++)
        check("dora_backward", type_name<T>(), names[k], shape,
              std::vector<float>(got.begin() + from[k], got.begin() + from[k + 1]),
              std::vector<float>(g.begin() + from[k], g.begin() + from[k + 1]), lora_tol<T>());
    if (timed) {
        float ms = time_ms(run);
        report_time("dora_backward", type_name<T>(), shape, ms, 0, 2.0 * N * (2 * s.r * (s.in + s.out) + 2 * s.in * s.out));
    }
    lora_free(&l);
    free_device();
}

// IA3 (its vector scaling the input of a feedforward module, else the output): out, dinp and
// dvec, the last two added into. The vector is fp32 (the masters) on both sides: lora_tol
template <typename T> void check_ia3(const Shape &s, int feedforward, bool timed) {
    char shape[160];
    describe(shape, sizeof shape, s, 0.0f);
    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " %s", feedforward ? "feedforward" : "output");
    int N = s.B * s.len, nv = feedforward ? s.in : s.out;
    std::vector<float> inp = rounded<T>(random_vector((size_t)N * s.in)), W = rounded<T>(random_vector((size_t)s.out * s.in));
    std::vector<float> vec = random_vector(nv, 0.5f, 1.5f), dout = rounded<T>(random_vector((size_t)N * s.out));
    std::vector<float> out((size_t)N * s.out), dinp = rounded<T>(random_vector((size_t)N * s.in)), dvec = random_vector(nv);
    int ins[LORA_N_TARGETS] = {s.in}, outs[LORA_N_TARGETS] = {s.out};
    LoRA l;
    ia3_alloc(&l, 1, ins, outs, 1u << LORA_Q, feedforward ? 1u << LORA_Q : 0);
    T *d_inp = to_device<T>(inp), *d_W = to_device<T>(W), *d_dout = to_device<T>(dout), *d_dinp = to_device<T>(dinp);
    T *d_out = device_poisoned<T>((size_t)N * s.out), *d_xs = device_alloc<T>((size_t)N * s.in);
    T *d_pre = device_alloc<T>((size_t)N * s.out);
    float *d_vec = to_device<float>(vec), *d_dvec = to_device<float>(dvec);
    ref_ia3_forward(out.data(), inp.data(), W.data(), vec.data(), feedforward, s.in, s.out, N);
    ref_ia3_backward(dinp.data(), dvec.data(), dout.data(), inp.data(), W.data(), vec.data(), feedforward, s.in, s.out, N);
    auto forward = [&] { ia3_forward(&l, d_vec, 0, LORA_Q, d_out, d_inp, d_W, d_xs, N, 0); };
    auto backward = [&] { ia3_backward(&l, d_vec, d_dvec, 0, LORA_Q, d_dinp, d_dout, d_inp, d_W, d_xs, d_pre, N, 0); };
    forward();
    backward();
    check("ia3_forward", type_name<T>(), "out", shape, to_host(d_out, (size_t)N * s.out), out, lora_tol<T>());
    check("ia3_backward", type_name<T>(), "dinp", shape, to_host(d_dinp, (size_t)N * s.in), dinp, lora_tol<T>());
    check("ia3_backward", type_name<T>(), "dvec", shape, to_host(d_dvec, nv), dvec, lora_tol<T>());
    if (timed) {
        report_time("ia3_forward", type_name<T>(), shape, time_ms(forward), 0, 2.0 * N * s.in * s.out);
        report_time("ia3_backward", type_name<T>(), shape, time_ms(backward), 0, 2.0 * N * s.in * s.out * (feedforward ? 1 : 2));
    }
    lora_free(&l);
    free_device();
}

template <typename T> void check_all(bool quick) {
    // a chunk in the middle of its rows, a whole sequence, then Llama-2-7B's q_proj
    // with r = 16 over 4 x 1024 tokens (timed)
    Shape shapes[] = {{2, 24, 5, 7, 64, 48, 4}, {1, 40, 0, 40, 96, 80, 8}, {4, 1024, 0, 1024, 4096, 4096, 16}};
    int n = quick ? 2 : 3;
    for (int i = 0; i < n; i++)
        for (float p : {0.0f, 0.1f}) {
            bool timed = i == 2 && p > 0;
            if (p > 0) check_dropout<T>(shapes[i], p, timed);
            check_forward<T>(shapes[i], p, timed);
            check_backward<T>(shapes[i], p, timed);
            if (p == 0) check_dora_norm<T>(shapes[i], i == 2);
            check_dora_forward<T>(shapes[i], p, timed);
            check_dora_backward<T>(shapes[i], p, timed);
            if (p == 0)
                for (int ff = 0; ff < 2; ff++) check_ia3<T>(shapes[i], ff, i == 2);
        }
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    matmul_free();
    return finish("lora");
}
