// Chunked training with a KV carry equals whole-sequence training.
//
// test/test_llama2.c anchors the whole-sequence run to Hugging Face transformers
// + peft; this file checks the chunked runs against that whole-sequence run:
// the loss, the logits and every trainable gradient, for several chunk sizes
// (1, sizes that do not divide T, T itself), both memory modes, GQA and tied
// models, LoRA (with dropout, whose masks must not depend on the chunking; and
// DoRA, whose row norms the first chunk computes for all), IA3 (every module, two
// of them feedforward), llama_adapter (a prompt in every layer), prefix (4 virtual
// positions ahead of the carry, whose gradients every chunk's dK, dV add to) and
// full fine-tuning, and with sliding windows (Mistral's sliding_window) of one
// key, of a chunk's length and of more or fewer than a chunk's, so that windows
// cross chunk boundaries, and with --s2_attn's shifted sparse groups (of 6 positions,
// half-groups of 3: cut by every chunk size but 24, and the carry seen only within
// a group); then 30 training steps whole against chunked. Each of those
// runs again with --activation_checkpointing (every layer's forward re-run from
// its input before its backward), which must give the same bits: the same
// operations in the same order, so no tolerance (loss, logits, every gradient,
// the 30 losses and the trained adapter file); and its activation bytes must
// shrink by what the formula in test_checkpointing_memory says.
//
// Tolerances. A chunked run does the same arithmetic in a different order only
// where it sums over positions: weight gradients add up chunk by chunk, and
// dK/dV add the contributions of later chunks first. Everything else is
// bit-identical. So the loss and logits are compared at 1e-6 relative (they
// pass bit-exact today; 1e-6 leaves room for a compiler reordering), gradients
// at 1e-5 of each tensor's largest magnitude (measured up to ~1e-6: fp32
// reordering of sums of a few hundred terms), and the 30-step loss trajectory
// at 1e-5 relative (AdamW's m / sqrt(v) amplifies gradient rounding a little
// each step; measured ~1e-6).
#define TESTING
#include "../train_llama2.c"
#include "test_common.h"

enum { B = 2, T = 24 };

// the adapter of the runs that are not full fine-tuning: lora, dora, ia3, llama_adapter or prefix (main sets it
// for a pass of test_equal)
static const char *adapter_kind = "lora";
// training runs with --s2_attn 1 (main sets it for a pass of test_equal)
static int s2_runs;

// window: the config's sliding_window, set after loading (-1: the fixture's own)
static void setup(Model *m, const char *model, int full, int chunk, const char *mem, int out_chunks, int ckpt, int window) {
    TrainConfig tc;
    char path[256], cs[16], oc[16];
    snprintf(path, sizeof path, "test/fixtures/%s", model);
    snprintf(cs, sizeof cs, "%d", chunk);
    snprintf(oc, sizeof oc, "%d", out_chunks);
    char *argv[32] = {"x", "--model", path, "--data", "unused", "--max_seq_len", "24", "--chunk_size", cs,
                      "--chunk_memory", (char *)mem, "--num_output_chunks", oc, full ? "--full_finetune" : "--seed=3",
                      ckpt ? "--activation_checkpointing" : "--activation_checkpointing=0"};
    int n = 15;
    if (!full && !strcmp(adapter_kind, "ia3")) { // every module, gate_proj's and down_proj's vectors on their inputs
        argv[n++] = "--peft_method=ia3", argv[n++] = "--ia3_target_modules=all-linear";
        argv[n++] = "--ia3_feedforward_modules=gate_proj,down_proj";
    } else if (!full && !strcmp(adapter_kind, "llama_adapter")) { // a prompt in both layers
        argv[n++] = "--peft_method=llama_adapter", argv[n++] = "--adapter_len=5", argv[n++] = "--adapter_layers=2";
    } else if (!full && !strcmp(adapter_kind, "prefix")) { // (its N(0, 1) keys and values are live from the start)
        argv[n++] = "--peft_method=prefix", argv[n++] = "--num_virtual_tokens=4";
    } else {
        argv[n++] = "--lora_r=4", argv[n++] = "--lora_target_modules=all-linear", argv[n++] = "--lora_dropout=0.2";
        argv[n++] = !full && !strcmp(adapter_kind, "dora") ? "--use_dora" : "--use_dora=0";
    }
    if (parse_args(&tc, n, argv) != 0) die("test arguments rejected");
    if (model_setup(m, NULL, &tc, B, T, NULL) != 0) die("cannot set up %s", model);
    if (window >= 0) m->host.config.sliding_window = window; // else the config's
    m->s2_attn = s2_runs; // (parse_args takes --s2_attn with --batching packing only)
    uint64_t state = 11;
    if (m->host.use_lora && m->host.lora.ia3) // off their init of 1, as training moves them
        for (size_t k = 0; k < m->host.lora.num_params; k++) m->host.lora.params[k] = 0.5f + rng_uniform(&state);
    else if (m->host.use_lora && m->host.lora.adapter_len) // the gates off 0: the branch, and the queries' gradient from it, live
        for (int i = 0; i < m->host.lora.n_layers; i++) *adapter_gate(&m->host.lora, m->host.lora.params, i) = 0.5f + rng_uniform(&state);
    else if (m->host.use_lora) { // B = 0 would leave A without gradient
        for (int i = 0; i < m->host.lora.n_layers; i++)
            for (int t = 0; t < LORA_N_TARGETS; t++) {
                float *b = lora_B(&m->host.lora, m->host.lora.params, i, t);
                for (int k = 0; k < m->host.lora.r * m->host.lora.out[t]; k++) b[k] = 0.2f * (rng_uniform(&state) - 0.5f);
                if (!m->host.lora.use_dora) continue; // m off the norm, so that s != 1
                float *mag = lora_mag(&m->host.lora, m->host.lora.params, i, t);
                for (int k = 0; k < m->host.lora.out[t]; k++) mag[k] = 0.5f + rng_uniform(&state);
                m->host.lora.mag_unset[i * LORA_N_TARGETS + t] = 0;
            }
    }
    m->dropout_key = 99;
}

static float *trainable_grads(Model *m, size_t *n) {
    *n = m->host.use_lora ? m->host.lora.num_params : m->host.num_params;
    return m->host.use_lora ? m->host.lora.grads : m->grads;
}

typedef struct { double loss; float *logits, *grads; size_t n; } Run;

static Run run(Model *m, const int *tokens, const int *targets) {
    Run r;
    r.logits = (float *)mallocCheck((size_t)B * T * m->host.config.vocab_size * sizeof(float));
    float *g = trainable_grads(m, &r.n);
    memset(g, 0, r.n * sizeof(float));
    r.loss = model_forward_backward(m, tokens, targets, B, T, 1.0f / 37);
    r.grads = (float *)mallocCheck(r.n * sizeof(float));
    memcpy(r.grads, g, r.n * sizeof(float));
    m->host.lora.training = 0; // logits without dropout, as evaluation sees them
    double eval = model_forward(m, tokens, targets, B, T, r.logits);
    m->host.lora.training = 1;
    (void)eval;
    return r;
}

// max |got - want| / max |want| over a buffer
static double normwise(const float *got, const float *want, size_t n) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(want[i]));
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) err = e;
    }
    return err / fmax(scale, 1e-30);
}

// how many of n floats differ from want in their bits
static size_t bits_differ(const float *got, const float *want, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    return k;
}

// every trainable tensor separately: LoRA A/B per layer and target, or each base weight
static double worst_tensor(Model *m, const float *got, const float *want, char *name, size_t namelen) {
    double worst = 0;
    if (m->host.use_lora) {
        LoRA *l = &m->host.lora;
        for (int i = 0; i < l->n_layers; i++)
            for (int t = 0; t < LORA_N_TARGETS; t++)
                for (int k = 0; k < lora_n_kinds(l) && lora_trains(l, i, t); k++) { // A, B (and DoRA's magnitude)
                    size_t off = (size_t)(lora_tensor(l, l->params, i, t, k) - l->params);
                    size_t n = lora_tensor_numel(l, t, k);
                    double e = normwise(got + off, want + off, n);
                    if (e > worst) { worst = e; lora_key(l, name, namelen, i, t, k); }
                }
        return worst;
    }
    Config *c = &m->host.config;
    size_t off = 0;
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        int64_t rows, cols;
        param_shape(c, p, &rows, &cols);
        for (int l = 0; l < (param_per_layer(p) ? c->n_layers : 1); l++) {
            size_t n = (size_t)(rows * cols);
            if (p == P_HEAD && c->tied) continue; // the head is the embedding
            double e = normwise(got + off, want + off, n);
            if (e > worst) { worst = e; param_name(p, l, name, namelen); }
            off += n;
        }
    }
    return worst;
}

static void test_equal(const char *model, int full, int window) {
    int tokens[B * T], targets[B * T];
    uint64_t state = 5;
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(rng_next(&state) % 512); // in every fixture's vocabulary
    for (int i = 0; i < B * T; i++) targets[i] = (i % T == T - 1 || i % 7 == 3) ? -100 : tokens[i + 1];
    Model whole;
    setup(&whole, model, full, 0, "keep", 1, 0, window);
    Run ref = run(&whole, tokens, targets);
    size_t n_logits = (size_t)B * T * whole.host.config.vocab_size;
    if (whole.host.config.sliding_window > 0 || s2_runs) { // the window binds (T = 24 tokens are longer), or the groups
        Model causal;
        setup(&causal, model, full, 0, "keep", 1, 0, 0);
        causal.s2_attn = 0;
        Run c = run(&causal, tokens, targets);
        char w[200];
        snprintf(w, sizeof w, "%s %s window %d s2_attn %d: the training loss differs from plain causal attention's", model,
                 full ? "full" : adapter_kind, whole.host.config.sliding_window, s2_runs);
        CHECK(c.loss != ref.loss, w, "%.10g, causal %.10g", ref.loss, c.loss);
        if (s2_runs) { // evaluation (model_forward) attends fully
            snprintf(w, sizeof w, "%s %s s2_attn: evaluation's logits are causal attention's, bit for bit", model,
                     full ? "full" : "lora");
            size_t d = bits_differ(ref.logits, c.logits, n_logits);
            CHECK(d == 0, w, "%zu of %zu differ", d, n_logits);
        }
        free(c.logits); free(c.grads);
        model_free(&causal);
    }
    struct { int chunk; const char *mem; int out_chunks; } cases[] = {
        {1, "keep", 1}, {1, "recompute", 1}, {5, "keep", 1}, {5, "recompute", 3}, {7, "recompute", 1},
        {8, "keep", 2}, {23, "recompute", 1}, {24, "recompute", 1}, {0, "keep", 5}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Model m, mc;
        setup(&m, model, full, cases[k].chunk, cases[k].mem, cases[k].out_chunks, 0, window);
        Run got = run(&m, tokens, targets);
        char what[256], name[200] = "";
        snprintf(what, sizeof what, "%s %s C=%d %s output_chunks=%d window=%d s2_attn=%d", model, full ? "full" : adapter_kind,
                 cases[k].chunk, cases[k].mem, cases[k].out_chunks, m.host.config.sliding_window, s2_runs);
        char w[400];
        snprintf(w, sizeof w, "%s vs whole: loss", what);
        CHECK(fabs(got.loss - ref.loss) <= 1e-6 * fabs(ref.loss), w, "%.10g vs %.10g", got.loss, ref.loss);
        snprintf(w, sizeof w, "%s vs whole: logits", what);
        double e = normwise(got.logits, ref.logits, n_logits);
        CHECK(e <= 1e-6, w, "max err %.3e of max|ref|", e);
        snprintf(w, sizeof w, "%s vs whole: every gradient", what);
        e = worst_tensor(&m, got.grads, ref.grads, name, sizeof name);
        CHECK(e <= 1e-5, w, "worst %s: max err %.3e of max|ref| (tol 1e-5)", name, e);
        // activation checkpointing runs the same operations in the same order: the same bits
        setup(&mc, model, full, cases[k].chunk, cases[k].mem, cases[k].out_chunks, 1, window);
        Run ck = run(&mc, tokens, targets);
        size_t dl = bits_differ(ck.logits, got.logits, n_logits), dg = bits_differ(ck.grads, got.grads, got.n);
        e = worst_tensor(&m, ck.grads, got.grads, name, sizeof name);
        snprintf(w, sizeof w, "%s --activation_checkpointing: loss, logits and every gradient bit-identical", what);
        CHECK(ck.loss == got.loss && dl == 0 && dg == 0, w, "loss %.17g vs %.17g; %zu logits and %zu of %zu gradients differ "
              "(worst %s: %.3e of max|ref|)", ck.loss, got.loss, dl, dg, got.n, name, e);
        free(got.logits); free(got.grads); free(ck.logits); free(ck.grads);
        model_free(&m);
        model_free(&mc);
    }
    free(ref.logits); free(ref.grads);
    model_free(&whole);
}

// the seed's check: 30 consecutive training steps, whole against chunked; and
// each with --activation_checkpointing, which must train the same bits

// a training run's losses, one per step, and the trained weights as saved
typedef struct { double *loss; char *saved; size_t saved_len; } Trajectory;

static Trajectory train_losses(const char *model, const char *chunk, const char *mem, int ckpt, int steps) {
    char metrics[300], out[256], st[16];
    snprintf(out, sizeof out, "/tmp/llama2tune_chunk_%d_%s_%s_%d", (int)getpid(), chunk, mem, ckpt);
    snprintf(metrics, sizeof metrics, "%s.jsonl", out);
    snprintf(st, sizeof st, "%d", steps);
    char path[256];
    snprintf(path, sizeof path, "test/fixtures/%s", model);
    char *argv[] = {"x", "--model", path, "--data", "test/fixtures/data.jsonl", "--max_seq_len", "24",
                    "--batch_size", "2", "--gradient_accumulation_steps", "2", "--max_steps", st, "--lr", "5e-3",
                    "--lora_target_modules", "all-linear", "--lora_dropout", "0.1", "--warmup_steps", "3",
                    "--chunk_size", (char *)chunk, "--chunk_memory", (char *)mem, "--output_dir", out,
                    "--metrics_file", metrics, ckpt ? "--activation_checkpointing" : "--activation_checkpointing=0"};
    TrainConfig tc;
    if (parse_args(&tc, sizeof argv / sizeof argv[0], argv) != 0) die("trajectory arguments");
    if (train(&tc) != 0) die("training failed");
    Trajectory r;
    r.loss = (double *)callocCheck(steps, sizeof(double));
    size_t len;
    char *text = read_file(metrics, &len);
    int i = 0;
    for (char *p = text, *e; p && *p && i < steps; p = e + 1, i++) {
        e = strchr(p, '\n');
        JsonValue rec;
        char err[128];
        if (!e || json_parse(p, e - p, &rec, err, sizeof err) != 0 || json_get_number(&rec, "loss", &r.loss[i]) != 0)
            die("%s: bad metrics line %d", metrics, i + 1);
        json_free(&rec);
    }
    free(text);
    char adapter[300];
    snprintf(adapter, sizeof adapter, "%s/adapter_model.safetensors", out);
    if (!(r.saved = read_file(adapter, &r.saved_len))) die("cannot read %s", adapter);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", out, metrics);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", out);
    return r;
}

static void test_trajectory(void) {
    int steps = 30;
    const char *runs[3][2] = {{"0", "keep"}, {"5", "recompute"}, {"1", "keep"}};
    Trajectory plain[3];
    for (int k = 0; k < 3; k++) plain[k] = train_losses("tiny_gqa", runs[k][0], runs[k][1], 0, steps);
    double *whole = plain[0].loss;
    for (int k = 1; k < 3; k++) {
        double *got = plain[k].loss, worst = 0;
        int at = 0;
        for (int i = 0; i < steps; i++) {
            double e = fabs(got[i] - whole[i]) / fabs(whole[i]);
            if (e > worst) { worst = e; at = i; }
        }
        char what[200];
        snprintf(what, sizeof what, "30 LoRA steps: C=%s %s has the whole-sequence loss trajectory", runs[k][0], runs[k][1]);
        CHECK(worst <= 1e-5 && whole[steps - 1] < whole[0], what, "worst rel diff %.3e at step %d (%.9g vs %.9g); loss %.4f -> %.4f",
              worst, at + 1, got[at], whole[at], whole[0], whole[steps - 1]);
    }
    for (int k = 0; k < 3; k++) {
        Trajectory ck = train_losses("tiny_gqa", runs[k][0], runs[k][1], 1, steps);
        int first = -1;
        for (int i = steps - 1; i >= 0; i--)
            if (ck.loss[i] != plain[k].loss[i]) first = i;
        int same = ck.saved_len == plain[k].saved_len && memcmp(ck.saved, plain[k].saved, ck.saved_len) == 0;
        char what[200];
        snprintf(what, sizeof what, "30 LoRA steps: C=%s %s with --activation_checkpointing: the same losses and adapter, "
                 "bit for bit", runs[k][0], runs[k][1]);
        CHECK(first < 0 && same, what, "first loss to differ: step %d; adapter files %s", first + 1, same ? "equal" : "differ");
        free(ck.loss); free(ck.saved);
    }
    for (int k = 0; k < 3; k++) { free(plain[k].loss); free(plain[k].saved); }
}

// recompute mode: activation memory does not grow with T (only the carry does)
static void test_memory(void) {
    size_t act[2][2], carry[2][2];
    int Ts[2] = {64, 128};
    for (int mode = 0; mode < 2; mode++)
        for (int i = 0; i < 2; i++) {
            Model m;
            memset(&m, 0, sizeof m);
            if (model_load(&m.host, "test/fixtures/tiny_gqa") != 0) die("load");
            model_alloc(&m, 2, Ts[i], 16, mode, 1);
            act[mode][i] = m.act_bytes;
            carry[mode][i] = m.carry_bytes;
            model_free(&m);
        }
    CHECK(act[1][0] == act[1][1], "recompute: activation memory is flat in T", "%zu bytes at T=64, %zu at T=128", act[1][0], act[1][1]);
    CHECK(act[0][1] > act[0][0] * 3 / 2, "keep: activation memory grows with T", "%zu bytes at T=64, %zu at T=128", act[0][0], act[0][1]);
    CHECK(carry[1][1] == 2 * carry[1][0], "the KV carry grows linearly with T", "%zu, %zu bytes", carry[1][0], carry[1][1]);
}

// Activation checkpointing keeps every chunk slot's residuals (L+1, B, C, D) and one
// layer's worth of the rest, which all slots share, instead of L layers' worth per
// slot. Per position a layer holds ln1, resid_mid and ln2 (3 D floats), q and atty
// (2 NH hd), lse (NH), rstd1 and rstd2 (2), gate, up and silu(gate) * up (3 H) and the
// seven LoRA A-projections (7 r): that many floats fewer for (slots L - 1) layers.
static void test_checkpointing_memory(void) {
    struct { int chunk; const char *mem; } cases[] = {{0, "keep"}, {5, "keep"}, {5, "recompute"}, {8, "keep"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Model plain, ckpt;
        setup(&plain, "tiny_gqa", 0, cases[k].chunk, cases[k].mem, 1, 0, 0);
        setup(&ckpt, "tiny_gqa", 0, cases[k].chunk, cases[k].mem, 1, 1, 0);
        const Config *c = &plain.host.config;
        size_t C = cases[k].chunk ? cases[k].chunk : T, slots = strcmp(cases[k].mem, "recompute") ? (T + C - 1) / C : 1;
        size_t per_position = 3 * c->dim + 2 * c->n_heads * c->head_dim + c->n_heads + 2 + 3 * c->hidden_dim +
                              7 * plain.host.lora.r;
        size_t want = (slots * c->n_layers - 1) * B * C * per_position * sizeof(float), got = plain.act_bytes - ckpt.act_bytes;
        char what[200];
        snprintf(what, sizeof what, "--activation_checkpointing, C=%d %s: activations shrink by (slots L - 1) layers' worth",
                 cases[k].chunk, cases[k].mem);
        CHECK(ckpt.act_bytes < plain.act_bytes && got == want, what, "%zu -> %zu bytes: %zu fewer, expected %zu",
              plain.act_bytes, ckpt.act_bytes, got, want);
        model_free(&plain);
        model_free(&ckpt);
    }
}

// generation reuses the KV carry as its cache: with temperature 0 every new token
// must be the argmax of a whole-sequence forward's logits at the position before
// (with a sliding window too: the prompt runs in chunks, then one token at a time)
static void test_greedy_generation(int window) {
    Model m;
    setup(&m, "tiny_gqa", 0, 5, "recompute", 1, 0, window);
    int prompt[7] = {1, 40, 300, 22, 7, 90, 5}, n_new;
    int *gen = generate(&m, prompt, 7, 12, 0.0f, 1.0f, 1, -1, &n_new);
    int seq[B * T], targets[B * T], V = m.host.config.vocab_size, len = 7 + n_new, bad = -1;
    memcpy(seq, prompt, sizeof prompt);
    memcpy(seq + 7, gen, n_new * sizeof(int));
    for (int i = 0; i < len; i++) targets[i] = -100;
    float *logits = (float *)mallocCheck((size_t)len * V * sizeof(float));
    m.host.lora.training = 0;
    model_forward(&m, seq, targets, 1, len, logits);
    for (int i = 0; i < n_new && bad < 0; i++) {
        const float *z = logits + (size_t)(6 + i) * V;
        int best = 0;
        for (int v = 1; v < V; v++) if (z[v] > z[best]) best = v;
        if (best != gen[i]) bad = i;
    }
    char what[120];
    snprintf(what, sizeof what, "greedy generation with the KV cache equals argmax of the full forward (window %d, %s)", window,
             adapter_kind);
    CHECK(n_new == 12 && bad < 0, what, "%d tokens, first mismatch at %d", n_new, bad);
    free(gen); free(logits);
    model_free(&m);
}

static void test_top_p_sampling(void) {
    uint64_t r1 = 3, r2 = 3;
    float z[4] = {0.0f, 2.0f, 1.0f, -1.0f}, z2[4];
    int counts[4] = {0}, same = 1;
    for (int i = 0; i < 4000; i++) {
        memcpy(z2, z, sizeof z);
        int a = sample_token(z2, 4, 1.0f, 0.8f, &r1), b = sample_token(z2, 4, 1.0f, 0.8f, &r2);
        same &= a == b;
        counts[a]++;
    }
    // softmax(z) = .087 .643 .236 .032 -> top_p 0.8 keeps {1, 2}: .643 / .879 = .731 and .269 of 4000
    // draws: 2924 and 1076, binomial standard deviation 28, so +-150 is > 5 sigma
    CHECK(same && counts[0] == 0 && counts[3] == 0 && abs(counts[1] - 2924) < 150, "top-p sampling keeps the nucleus, in proportion",
          "counts %d %d %d %d (expected 0 ~2924 ~1076 0), reproducible %d", counts[0], counts[1], counts[2], counts[3], same);
}

// test_chunked KIND: only the adapter KIND's runs (setup's kinds: ia3, prefix, ...) on tiny_gqa
// and tiny_tied, and its greedy generation; no argument: everything
int main(int argc, char **argv) {
    if (argc > 1) {
        adapter_kind = argv[1];
        test_equal("tiny_gqa", 0, -1);
        test_equal("tiny_tied", 0, -1);
        test_greedy_generation(0);
        return test_summary();
    }
    const char *models[] = {"tiny_gqa", "tiny_tied", "tiny_llama3", "tiny_linear", "tiny_codellama", "tiny_mistral"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        for (int full = 0; full < 2; full++) test_equal(models[i], full, -1);
    // windows of one key, of fewer keys than chunks of 7, 8, 23 (and as many as chunks of
    // 5, more than chunks of 1), and more than chunks of 5, 7, 8
    const int windows[] = {1, 5, 11};
    for (int w = 0; w < 3; w++)
        for (int full = 0; full < 2; full++) test_equal("tiny_gqa", full, windows[w]);
    adapter_kind = "dora"; // DoRA: its norms are computed at a pass's first chunk and serve every chunk
    test_equal("tiny_gqa", 0, -1);
    test_equal("tiny_tied", 0, -1);
    adapter_kind = "ia3";
    test_equal("tiny_gqa", 0, -1);
    test_equal("tiny_tied", 0, -1);
    adapter_kind = "llama_adapter"; // each chunk's queries meet the whole prompt, with no carry
    test_equal("tiny_gqa", 0, -1);
    test_equal("tiny_tied", 0, -1);
    adapter_kind = "prefix"; // one more chunk ahead of the first, in the carry
    test_equal("tiny_gqa", 0, -1);
    test_equal("tiny_tied", 0, -1);
    test_greedy_generation(0); // the prefix in the sampling's cache
    adapter_kind = "lora";
    s2_runs = 1; // shifted sparse attention (tiny_llama3: 4 query heads over 2 KV heads, as tiny_gqa, head_dim 12)
    for (int full = 0; full < 2; full++) {
        test_equal("tiny_gqa", full, -1);
        test_equal("tiny_llama3", full, -1);
    }
    s2_runs = 0;
    test_trajectory();
    test_memory();
    test_checkpointing_memory();
    test_greedy_generation(0);
    test_greedy_generation(3);
    test_top_p_sampling();
    return test_summary();
}
