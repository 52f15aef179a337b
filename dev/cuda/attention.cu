// attention_forward / attention_backward (attention.cuh) against train_llama2.c's,
// for whole sequences and chunks (t0 > 0, not tile aligned), GQA groups of 1 to 4,
// head dims from 16 to 256. Variants: fp32/simt, bf16/simt, bf16/tc (tensor cores).
// Inputs are bf16 values, so one CPU result serves all three variants. Key and
// value rows past t0 + len are NaN on both sides: a kernel that reads them fails.
// dk, dv start from small random values (the dKV carry) that the backward must
// add to; rows past t0 + len must come back unchanged, to the bit.
//
// --bench: after the small shapes' checks, the issue's shapes timed (no CPU twin:
// it would take minutes there), as markdown rows beside dev/bench_sdpa.py's.
#include "common.cuh"
#include "../../attention.cuh"

struct Shape { int B, T, t0, len, NH, NKV, hd; };

// Useful forward FLOPs: each (b, h) scores len * t0 + len (len + 1) / 2 query-key
// pairs, each costing 2 products of 2 hd FLOPs. The backward counts 2.5 times that
// (5 products; our deterministic split does 7). dev/bench_sdpa.py counts the same.
double attention_flops(Shape sh) {
    double pairs = (double)sh.B * sh.NH * ((double)sh.len * sh.t0 + 0.5 * sh.len * (sh.len + 1));
    return 4.0 * pairs * sh.hd;
}

// inputs and the CPU twin's outputs for one shape, shared by every variant: the
// inputs are bf16 values (exact in fp32 too), and the backward of both sides
// starts from the forward's out rounded to bf16 (out_in), and its lse
struct Reference {
    std::vector<float> q, k, v, dout, dk0, dv0; // dk0, dv0: the carry before the backward
    std::vector<float> out, out_in, lse, dq, dk, dv;
};

Reference make_reference(Shape sh) {
    int B = sh.B, Tn = sh.T, t0 = sh.t0, len = sh.len, NH = sh.NH, NKV = sh.NKV, hd = sh.hd;
    size_t nq = (size_t)B * len * NH * hd, nkv = (size_t)B * Tn * NKV * hd;
    typedef __nv_bfloat16 bf16;
    Reference r;
    // scores of spread ~1.3 (not a near-uniform softmax); a carry small next to what the backward adds
    r.q = rounded<bf16>(random_vector(nq, -2.0f, 2.0f));
    r.k = rounded<bf16>(random_vector(nkv, -2.0f, 2.0f));
    r.v = rounded<bf16>(random_vector(nkv));
    r.dout = rounded<bf16>(random_vector(nq));
    r.dk0 = rounded<bf16>(random_vector(nkv, -0.1f, 0.1f));
    r.dv0 = rounded<bf16>(random_vector(nkv, -0.1f, 0.1f));
    for (int b = 0; b < B; b++) // rows past the valid prefix are never read
        for (size_t i = ((size_t)b * Tn + t0 + len) * NKV * hd; i < (size_t)(b + 1) * Tn * NKV * hd; i++)
            r.k[i] = r.v[i] = NAN;
    r.out.resize(nq);
    r.lse.resize((size_t)B * NH * len);
    r.dq.resize(nq);
    ref_attention_forward(r.out.data(), r.lse.data(), r.q.data(), r.k.data(), r.v.data(), B, Tn, t0, len, NH, NKV, hd);
    r.out_in = rounded<bf16>(r.out); // (the fp32 forward is checked against out itself)
    r.dk = r.dk0;
    r.dv = r.dv0;
    ref_attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), r.dout.data(), r.out_in.data(), r.lse.data(), r.q.data(),
                           r.k.data(), r.v.data(), B, Tn, t0, len, NH, NKV, hd);
    return r;
}

// the rows of a (B, T, NKV, hd) carry before t0 + len (prefix), or from there on
std::vector<float> prefix_rows(const std::vector<float> &x, Shape sh, bool prefix) {
    std::vector<float> rows;
    size_t row = (size_t)sh.NKV * sh.hd;
    for (int b = 0; b < sh.B; b++)
        for (int s = 0; s < sh.T; s++)
            if ((s < sh.t0 + sh.len) == prefix)
                rows.insert(rows.end(), x.begin() + ((size_t)b * sh.T + s) * row, x.begin() + ((size_t)b * sh.T + s + 1) * row);
    return rows;
}

template <typename T>
void check_attention(Shape sh, const Reference &r, bool tensor_cores, bool timed) {
    int B = sh.B, Tn = sh.T, t0 = sh.t0, len = sh.len, NH = sh.NH, NKV = sh.NKV, hd = sh.hd;
    Chunk ch = {B, Tn, t0, len};
    char shape[128], variant[32];
    snprintf(shape, sizeof shape, "B=%d T=%d t0=%d len=%d NH=%d NKV=%d hd=%d", B, Tn, t0, len, NH, NKV, hd);
    snprintf(variant, sizeof variant, "%s/%s", type_name<T>(), tensor_cores ? "tc" : "simt");
    attention_force_simt = !tensor_cores;
    size_t nq = r.q.size(), nkv = r.k.size(), nlse = r.lse.size();
    T *q = to_device<T>(r.q), *k = to_device<T>(r.k), *v = to_device<T>(r.v), *dout = to_device<T>(r.dout);
    T *out = device_poisoned<T>(nq), *dq = device_poisoned<T>(nq);
    float *lse = device_poisoned<float>(nlse);
    if (tensor_cores && !attention_tensor_cores<T>(hd, out, q, k, v)) {
        printf("FAIL attention_forward %-10s the tensor-core path would not run %s\n", variant, shape);
        failures++;
    }
    attention_forward(out, lse, q, k, v, &ch, NH, NKV, hd, 0);
    // bf16: P is rounded to bf16 for its product with V, and out once more at the end
    check("attention_forward", variant, "out", shape, to_host(out, nq), r.out, tol<T>(1e-5, 2e-2));
    check("attention_forward", variant, "lse", shape, to_host(lse, nlse), r.lse, 1e-5);

    T *out_in = to_device<T>(r.out_in), *dk = to_device<T>(r.dk0), *dv = to_device<T>(r.dv0);
    float *lse_in = to_device<float>(r.lse);
    attention_backward(dq, dk, dv, dout, out_in, lse_in, q, k, v, &ch, NH, NKV, hd, 0);
    // bf16: dS and P are rounded to bf16 for their products, and dk, dv once more when added to the carry
    check("attention_backward", variant, "dq", shape, to_host(dq, nq), r.dq, tol<T>(1e-5, 2e-2));
    std::vector<float> gpu_dk = to_host(dk, nkv), gpu_dv = to_host(dv, nkv);
    check("attention_backward", variant, "dk", shape, prefix_rows(gpu_dk, sh, true), prefix_rows(r.dk, sh, true),
          tol<T>(1e-5, 2e-2));
    check("attention_backward", variant, "dv", shape, prefix_rows(gpu_dv, sh, true), prefix_rows(r.dv, sh, true),
          tol<T>(1e-5, 2e-2));
    if (t0 + len < Tn) { // the carry's rows past the prefix are not the backward's: unchanged, to the bit
        check("attention_backward", variant, "dk>", shape, prefix_rows(gpu_dk, sh, false), prefix_rows(r.dk, sh, false), 0);
        check("attention_backward", variant, "dv>", shape, prefix_rows(gpu_dv, sh, false), prefix_rows(r.dv, sh, false), 0);
    }

    if (timed) {
        double flops = attention_flops(sh);
        float ms = time_ms([&] { attention_forward(out, lse, q, k, v, &ch, NH, NKV, hd, 0); });
        report_time("attention_forward", variant, shape, ms, 0, flops);
        ms = time_ms([&] { attention_backward(dq, dk, dv, dout, out_in, lse_in, q, k, v, &ch, NH, NKV, hd, 0); });
        report_time("attention_backward", variant, shape, ms, 0, 2.5 * flops);
    }
    attention_force_simt = false;
    free_device();
}

void check_shape(Shape sh, bool timed) {
    Reference r = make_reference(sh);
    check_attention<float>(sh, r, false, timed);
    check_attention<__nv_bfloat16>(sh, r, false, timed);
    if (sh.hd == 64 || sh.hd == 128) check_attention<__nv_bfloat16>(sh, r, true, timed);
}

// one markdown row of the forward and backward times at a shape too large for the
// CPU twin: random bf16 inputs, the path the trainer takes (tensor cores at hd 64, 128)
void bench_shape(Shape sh) {
    typedef __nv_bfloat16 bf16;
    size_t nq = (size_t)sh.B * sh.len * sh.NH * sh.hd, nkv = (size_t)sh.B * sh.T * sh.NKV * sh.hd;
    Chunk ch = {sh.B, sh.T, sh.t0, sh.len};
    bf16 *q = to_device<bf16>(random_vector(nq)), *k = to_device<bf16>(random_vector(nkv));
    bf16 *v = to_device<bf16>(random_vector(nkv)), *dout = to_device<bf16>(random_vector(nq));
    bf16 *out = device_poisoned<bf16>(nq), *dq = device_poisoned<bf16>(nq);
    bf16 *dk = to_device<bf16>(std::vector<float>(nkv)), *dv = to_device<bf16>(std::vector<float>(nkv));
    float *lse = device_poisoned<float>((size_t)sh.B * sh.NH * sh.len);
    float fwd = time_ms([&] { attention_forward(out, lse, q, k, v, &ch, sh.NH, sh.NKV, sh.hd, 0); });
    float bwd = time_ms([&] { attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &ch, sh.NH, sh.NKV, sh.hd, 0); });
    std::vector<float> outs[3] = {to_host(out, nq), to_host(dq, nq), to_host(dk, nkv)};
    size_t bad = 0; // unwritten (still NaN) or overflowed
    for (auto &x : outs) bad += std::count_if(x.begin(), x.end(), [](float f) { return !std::isfinite(f); });
    double flops = attention_flops(sh);
    printf("| attention.cuh | %s | %d | %d | %d | %d | %d | %.3f | %.1f | %.3f | %.1f | %.1f |%s\n",
           attention_tensor_cores<bf16>(sh.hd, out, q, k, v) ? "bf16 tensor cores" : "bf16 simt", sh.B, sh.NH, sh.len,
           sh.t0 + sh.len, sh.hd, fwd, flops / fwd / 1e9, bwd, 2.5 * flops / bwd / 1e9, 3.5 * flops / (fwd + bwd) / 1e9,
           bad ? " NaN or inf in the outputs" : "");
    if (bad) failures++;
    free_device();
}

int main(int argc, char **argv) {
    bool bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
    bool quick = quick_mode(argc, argv) || bench;
    Shape small[] = {
        {2, 40, 0, 40, 4, 2, 16},    // test/fixtures/tiny_gqa's heads, whole sequence
        {2, 40, 24, 16, 3, 3, 16},   // tiny_tied's heads, the last chunk of 16
        {2, 100, 37, 29, 4, 1, 64},  // a chunk that starts and ends inside tiles, GQA group 4
        {1, 200, 130, 70, 8, 2, 128} // a chunk over several key tiles, hd 128
    };
    Shape larger[] = {
        {1, 300, 0, 300, 4, 2, 128},     // whole, a partial last tile
        {1, 50, 10, 40, 2, 1, 80},       // hd 80: the generic SIMT path
        {1, 64, 0, 64, 2, 2, 256},       // hd 256: the largest SIMT tiles
        {2, 1024, 512, 512, 8, 2, 128},  // the second of two chunks of 512
    };
    for (Shape sh : small) check_shape(sh, false);
    if (bench) {
        // Llama-2-7B's attention (32 heads of 128): square causal at 16k tokens a batch, then a chunk of
        // 1024 queries against a longer KV prefix (the last chunk of a sequence); dev/bench_sdpa.py's shapes
        printf("| impl | variant | B | NH | q len | kv len | hd | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd TFLOP/s |\n");
        printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for (int T : {512, 1024, 2048, 4096}) bench_shape({16384 / T, T, 0, T, 32, 32, 128});
        for (int T : {4096, 8192, 16384, 32768}) bench_shape({1, T, T - 1024, 1024, 32, 32, 128});
    }
    if (!quick) {
        for (Shape sh : larger) check_shape(sh, false);
        // Llama-2-7B's attention (32 heads of 128): 4 x 1024 tokens whole, and the last of 4 chunks of 1024
        Shape timed[] = {{4, 1024, 0, 1024, 32, 32, 128}, {2, 4096, 3072, 1024, 32, 32, 128}};
        for (Shape sh : timed) check_shape(sh, true);
    }
    return finish("attention");
}
