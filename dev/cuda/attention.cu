// attention_forward / attention_backward (attention.cuh) against attention.h's,
// for whole sequences and chunks (t0 > 0, not tile aligned), GQA groups of 1 to 4,
// head dims from 16 to 256, causal and with sliding windows (W: one key, fewer
// than a tile's, a tile's, more; windows inside a long prefix), and with shifted
// sparse attention's groups (G: smaller than a tile, odd, a tile's, across tiles;
// in chunks; one KV head read by both halves of the query heads). Variants:
// fp32/simt, bf16/simt, bf16/tc (tensor cores), fp16/simt, fp16/tc. Inputs are
// bf16 values, so one CPU result serves every variant (fp16 holds them exactly but
// for those below 2^-14 in magnitude, which lose low bits in its subnormals: at
// most 2^-25 absolute, nothing next to the tolerances). Key and value rows past t0 + len are NaN
// on both sides, and so are those of the 64-key tiles before the window of the
// chunk's first query (in any head): a kernel that reads them (rather than skipping them) fails.
// dk, dv start from small random values (the dKV carry) that the backward must
// add to; rows no query sees (past t0 + len, before the first query's window)
// must come back unchanged, to the bit.
//
// --bench: after the small shapes' checks, the issue's shapes timed (no CPU twin:
// it would take minutes there), as markdown rows beside dev/bench_sdpa.py's.
#include "common.cuh"
#include "../../attention.cuh"

// W: the sliding window, G: shifted sparse attention's group size (0: none)
struct Shape { int B, T, t0, len, NH, NKV, hd, W, G = 0; };

Chunk chunk_of(Shape sh) { return {sh.B, sh.T, sh.t0, sh.len, sh.W, sh.G}; }

// Useful forward FLOPs: each (b, h) scores the visible query-key pairs (query i
// sees t0 + i + 1 keys, at most W, or those of its group: len * t0 + len (len + 1) / 2
// of them without a window or groups), each costing 2 products of 2 hd FLOPs. The
// backward counts 2.5 times that (5 products; our deterministic split does 7).
// dev/bench_sdpa.py counts the same (causal).
double attention_flops(Shape sh) {
    Chunk ch = chunk_of(sh);
    double pairs = 0;
    for (int h = 0; h < sh.NH; h++)
        for (int i = 0; i < sh.len; i++) pairs += sh.t0 + i + 1 - attention_first_key(&ch, sh.t0 + i, h, sh.NH);
    return 4.0 * pairs * sh.B * sh.hd;
}

// the first key a query of the chunk sees: rows before it are no query's
int first_seen(Shape sh) {
    Chunk ch = chunk_of(sh);
    return attention_chunk_first_key(&ch, sh.NH);
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
    // rows past the valid prefix are never read, nor the 64-key tiles (the CPU's, twice
    // the SIMT kernels', the tensor cores') wholly before the first query's window
    int skipped = first_seen(sh) / 64 * 64;
    size_t row = (size_t)NKV * hd;
    for (int b = 0; b < B; b++)
        for (int s = 0; s < Tn; s++)
            if (s < skipped || s >= t0 + len) {
                std::fill_n(r.k.begin() + ((size_t)b * Tn + s) * row, row, NAN);
                std::fill_n(r.v.begin() + ((size_t)b * Tn + s) * row, row, NAN);
            }
    r.out.resize(nq);
    r.lse.resize((size_t)B * NH * len);
    r.dq.resize(nq);
    ref_attention_forward(r.out.data(), r.lse.data(), r.q.data(), r.k.data(), r.v.data(), B, Tn, t0, len, sh.W, sh.G, NH,
                          NKV, hd);
    r.out_in = rounded<bf16>(r.out); // (the fp32 forward is checked against out itself)
    r.dk = r.dk0;
    r.dv = r.dv0;
    ref_attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), r.dout.data(), r.out_in.data(), r.lse.data(), r.q.data(),
                           r.k.data(), r.v.data(), B, Tn, t0, len, sh.W, sh.G, NH, NKV, hd);
    return r;
}

// the rows of a (B, T, NKV, hd) carry that a query of the chunk sees (seen: from
// the first query's first key to t0 + len), or the others
std::vector<float> seen_rows(const std::vector<float> &x, Shape sh, bool seen) {
    std::vector<float> rows;
    size_t row = (size_t)sh.NKV * sh.hd;
    for (int b = 0; b < sh.B; b++)
        for (int s = 0; s < sh.T; s++)
            if ((s >= first_seen(sh) && s < sh.t0 + sh.len) == seen)
                rows.insert(rows.end(), x.begin() + ((size_t)b * sh.T + s) * row, x.begin() + ((size_t)b * sh.T + s + 1) * row);
    return rows;
}

template <typename T>
void check_attention(Shape sh, const Reference &r, bool tensor_cores, bool timed) {
    int B = sh.B, Tn = sh.T, t0 = sh.t0, len = sh.len, NH = sh.NH, NKV = sh.NKV, hd = sh.hd;
    Chunk ch = chunk_of(sh);
    char shape[128], variant[32];
    snprintf(shape, sizeof shape, "B=%d T=%d t0=%d len=%d NH=%d NKV=%d hd=%d W=%d G=%d", B, Tn, t0, len, NH, NKV, hd, sh.W,
             sh.G);
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
    // bf16: P is rounded to bf16 for its product with V, and out once more at the end; fp16 the
    // same with 3 more significant bits (2^-12 relative, 8 times finer): 3e-3, not 2e-2 / 8
    // (the inputs and out_in are bf16 values: their errors do not shrink)
    check("attention_forward", variant, "out", shape, to_host(out, nq), r.out, tol<T>(1e-5, 2e-2, 3e-3));
    check("attention_forward", variant, "lse", shape, to_host(lse, nlse), r.lse, 1e-5);

    T *out_in = to_device<T>(r.out_in), *dk = to_device<T>(r.dk0), *dv = to_device<T>(r.dv0);
    float *lse_in = to_device<float>(r.lse);
    attention_backward(dq, dk, dv, dout, out_in, lse_in, q, k, v, &ch, NH, NKV, hd, 0);
    // bf16: dS and P are rounded to bf16 for their products, and dk, dv once more when added to the carry
    check("attention_backward", variant, "dq", shape, to_host(dq, nq), r.dq, tol<T>(1e-5, 2e-2, 3e-3));
    std::vector<float> gpu_dk = to_host(dk, nkv), gpu_dv = to_host(dv, nkv);
    check("attention_backward", variant, "dk", shape, seen_rows(gpu_dk, sh, true), seen_rows(r.dk, sh, true),
          tol<T>(1e-5, 2e-2, 3e-3));
    check("attention_backward", variant, "dv", shape, seen_rows(gpu_dv, sh, true), seen_rows(r.dv, sh, true),
          tol<T>(1e-5, 2e-2, 3e-3));
    if (first_seen(sh) > 0 || t0 + len < Tn) { // the carry's rows no query sees are not the backward's: unchanged, to the
        // bit (as T holds them: fp16 keeps the bf16 carry's values below 2^-14 to its subnormals' 2^-24 only)
        check("attention_backward", variant, "dk=", shape, seen_rows(gpu_dk, sh, false), seen_rows(rounded<T>(r.dk), sh, false), 0);
        check("attention_backward", variant, "dv=", shape, seen_rows(gpu_dv, sh, false), seen_rows(rounded<T>(r.dv), sh, false), 0);
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
    check_attention<__half>(sh, r, false, timed);
    if (sh.hd == 64 || sh.hd == 128) {
        check_attention<__nv_bfloat16>(sh, r, true, timed);
        check_attention<__half>(sh, r, true, timed);
    }
}

// one markdown row of the forward and backward times at a shape too large for the
// CPU twin: random bf16 inputs, the path the trainer takes (tensor cores at hd 64, 128)
void bench_shape(Shape sh) {
    typedef __nv_bfloat16 bf16;
    size_t nq = (size_t)sh.B * sh.len * sh.NH * sh.hd, nkv = (size_t)sh.B * sh.T * sh.NKV * sh.hd;
    Chunk ch = chunk_of(sh);
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
    printf("| attention.cuh | %s | %d | %d | %d | %d | %d | %d | %d | %.3f | %.1f | %.3f | %.1f | %.1f |%s\n",
           attention_tensor_cores<bf16>(sh.hd, out, q, k, v) ? "bf16 tensor cores" : "bf16 simt", sh.B, sh.NH, sh.len,
           sh.t0 + sh.len, sh.hd, sh.W, sh.G, fwd, flops / fwd / 1e9, bwd, 2.5 * flops / bwd / 1e9, 3.5 * flops / (fwd + bwd) / 1e9,
           bad ? " NaN or inf in the outputs" : "");
    if (bad) failures++;
    free_device();
}

int main(int argc, char **argv) {
    bool bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
    bool quick = quick_mode(argc, argv) || bench;
    Shape small[] = {
        {2, 40, 0, 40, 4, 2, 16, 0},    // test/fixtures/tiny_gqa's heads, whole sequence
        {2, 40, 24, 16, 3, 3, 16, 0},   // tiny_tied's heads, the last chunk of 16
        {2, 100, 37, 29, 4, 1, 64, 0},  // a chunk that starts and ends inside tiles, GQA group 4
        {1, 200, 130, 70, 8, 2, 128, 0},// a chunk over several key tiles, hd 128
        // sliding windows (tiles: 32 keys SIMT, 64 tensor cores): of one key; fewer keys than a
        // tile's, whole; a tile's and more, in chunks whose first key tiles are skipped
        {2, 100, 0, 100, 4, 2, 16, 1},
        {1, 150, 0, 150, 4, 1, 64, 20},
        {1, 300, 171, 129, 4, 2, 64, 64},
        {1, 260, 190, 70, 2, 1, 128, 100},
        {1, 300, 62, 238, 2, 1, 64, 128}, // the last query to see a key tile starts a query tile (W - t0 - 2 = 64)
        // shifted sparse attention, groups of G = T / 4 (SIMT tiles of 32, tensor-core and CPU tiles of 64):
        // G smaller than a tile, whole (the first half-group a group of its own), one KV head for both
        // halves of the query heads, on both kernels; G odd (half-groups of 37) in a chunk off the tile
        // grid; G a tile's, in the last chunk (key tiles before its groups skipped)
        {2, 96, 0, 96, 4, 1, 64, 0, 24},
        {1, 300, 171, 129, 4, 2, 64, 0, 75},
        {1, 256, 160, 96, 2, 1, 128, 0, 64},
    };
    Shape larger[] = {
        {1, 300, 0, 300, 4, 2, 128, 0},     // whole, a partial last tile
        {1, 50, 10, 40, 2, 1, 80, 0},       // hd 80: the generic SIMT path
        {1, 64, 0, 64, 2, 2, 256, 0},       // hd 256: the largest SIMT tiles
        {2, 1024, 512, 512, 8, 2, 128, 0},  // the second of two chunks of 512
        {1, 400, 250, 150, 4, 2, 80, 33},   // a window on the generic SIMT path
        {2, 1024, 512, 512, 8, 2, 128, 300},// a window of 300 in the second of two chunks of 512
        {1, 1024, 1023, 1, 4, 4, 64, 200},  // one query (generation) with its window inside the prefix
        {2, 1024, 512, 512, 8, 2, 128, 0, 256}, // shifted sparse groups of 256 in the second of two chunks of 512
    };
    for (Shape sh : small) check_shape(sh, false);
    if (bench) {
        // Llama-2-7B's attention (32 heads of 128): square causal at 16k tokens a batch, then a chunk of
        // 1024 queries against a longer KV prefix (the last chunk of a sequence); dev/bench_sdpa.py's shapes
        printf("| impl | variant | B | NH | q len | kv len | hd | W | G | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd TFLOP/s |\n");
        printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for (int T : {512, 1024, 2048, 4096}) bench_shape({16384 / T, T, 0, T, 32, 32, 128, 0});
        for (int T : {4096, 8192, 16384, 32768}) bench_shape({1, T, T - 1024, 1024, 32, 32, 128, 0});
        // Mistral-7B's window (4096) on a whole 16k sequence and on the last chunk of 32k:
        // the time follows the window, not the position
        bench_shape({1, 16384, 0, 16384, 32, 8, 128, 0});
        bench_shape({1, 16384, 0, 16384, 32, 8, 128, 4096});
        bench_shape({1, 32768, 31744, 1024, 32, 8, 128, 4096});
        // LongLoRA's shifted sparse attention on the same 16k sequence: groups of 4096, the work of a quarter
        bench_shape({1, 16384, 0, 16384, 32, 8, 128, 0, 4096});
    }
    if (!quick) {
        for (Shape sh : larger) check_shape(sh, false);
        // Llama-2-7B's attention (32 heads of 128): 4 x 1024 tokens whole, and the last of 4 chunks of 1024;
        // the latter with a window of 1024 (Mistral's heads: 32 of 128, 8 KV heads), against the same without
        Shape timed[] = {{4, 1024, 0, 1024, 32, 32, 128, 0}, {2, 4096, 3072, 1024, 32, 32, 128, 0},
                         {2, 4096, 3072, 1024, 32, 8, 128, 0}, {2, 4096, 3072, 1024, 32, 8, 128, 1024}};
        for (Shape sh : timed) check_shape(sh, true);
    }
    return finish("attention");
}
