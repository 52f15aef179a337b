// Trainer features beyond the math: the merged export, the memory plan and
// the FLOP count.
//
// - --merge_adapter: the merged model, loaded without LoRA, gives the logits
//   of base + adapter. Tolerance 1e-5 of the logits' scale: merging changes
//   only the order of fp32 sums (W x + s B (A x) against (W + s B A) x).
// - The memory plan printed before training is within 10% of the peak
//   resident memory measured afterwards (docs/memory.md), for LoRA whole-sequence
//   (with and without --activation_checkpointing), LoRA chunked with
//   recompute, and full fine-tuning, on a random model large
//   enough (~15 MB of weights, ~50-200 MB in all) that the process's fixed
//   overhead (code, libc, tokenizer: ~4 MB) is small next to it.
// - The FLOP count follows the formula in docs/performance.md: checked against the
//   same formula written out by hand for one small shape.
// - --collectives: the CUDA trainer's choice of NCCL or host collectives for
//   the world size, ranks per node, GPUs and build (a table of docs/sharding.md's rules).
// - --loss_scale: the dynamic loss scale's update rule against torch's GradScaler
//   over 6600 steps (exact: powers of two).
// - --random_init: every linear layer and the embedding drawn from
//   N(0, initializer_range) (checked against the normal distribution's own
//   numbers, at 5 standard errors), the norms 1; the same bits at any thread
//   count and as shards at any world size; a run trains (loss finite and
//   falling) and repeats bit for bit.
// - The sums behind the reported loss (cross-entropy over rows) and gradient clipping
//   (the squared gradient norm) give the same bits at 1, 2, 3 and 5 threads, run after
//   run (OpenMP's reductions did not: their partial sums follow the thread count and,
//   from 3 threads, meet in the order the threads finish).
// - The whole model at 1, 2 and 3 threads on a shape where every parallel split
//   is real: full fine-tuning's loss and every gradient (whole, and chunked with the
//   head in pieces), and the adapter file of 3 LoRA training steps, bit for bit
//   (each element of a product summed by one thread in a fixed order: support/matmul.h).
#define TESTING
#include "../train_llama2.c"
#include "test_common.h"
#include "random_model.h"
#include <sys/wait.h>

// every path under one folder of this process, so concurrent test runs do not collide
static char tmpdir[64];

// kind: lora; dora, whose merge rescales each row of W + scale B A to its magnitude; or ia3
// (every module, gate_proj's and down_proj's vectors scaling W's columns, the others' its rows)
static void test_merge(const char *kind) {
    char out[128];
    snprintf(out, sizeof out, "%s/merge_%s", tmpdir, kind);
    int ia3 = !strcmp(kind, "ia3");
    char *argv[] = {"x", "--model", "test/fixtures/tiny_gqa", "--data", "test/fixtures/data.jsonl", "--max_seq_len", "24",
                    "--max_steps", "5", "--lr", "1e-2", "--threads", "1", "--output_dir", (char *)out, "--merge_adapter",
                    !strcmp(kind, "dora") ? "--use_dora" : "--use_dora=0", "--lora_target_modules", "all-linear",
                    "--lora_dropout", "0"};
    char *argv_ia3[] = {"x", "--model", "test/fixtures/tiny_gqa", "--data", "test/fixtures/data.jsonl", "--max_seq_len", "24",
                        "--max_steps", "5", "--lr", "1e-2", "--threads", "1", "--output_dir", (char *)out, "--merge_adapter",
                        "--peft_method", "ia3", "--ia3_target_modules", "all-linear", "--ia3_feedforward_modules", "gate_proj,down_proj"};
    TrainConfig tc;
    int rc = ia3 ? parse_args(&tc, sizeof argv_ia3 / sizeof argv_ia3[0], argv_ia3) : parse_args(&tc, sizeof argv / sizeof argv[0], argv);
    if (rc != 0 || train(&tc) != 0) die("merge run failed");
    // base + adapter, as saved
    Model lora, merged;
    char *argv2[] = {"x", "--model", "test/fixtures/tiny_gqa", "--data", "unused", "--max_seq_len", "24",
                     "--from_peft_checkpoint", (char *)out};
    if (parse_args(&tc, sizeof argv2 / sizeof argv2[0], argv2) != 0 || model_setup(&lora, NULL, &tc, 2, 24, NULL) != 0) die("adapter");
    memset(&merged, 0, sizeof merged);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/merged", out);
    if (model_load(&merged.host, dir) != 0) die("cannot load %s", dir);
    model_alloc(&merged, 2, 24, 0, 0, 1);
    int tokens[48], targets[48], V = lora.host.config.vocab_size;
    uint64_t st = 9;
    for (int i = 0; i < 48; i++) { tokens[i] = (int)(rng_next(&st) % V); targets[i] = -100; }
    float *a = (float *)mallocCheck(48 * V * sizeof(float)), *b = (float *)mallocCheck(48 * V * sizeof(float));
    lora.host.lora.training = 0;
    model_forward(&lora, tokens, targets, 2, 24, a);
    model_forward(&merged, tokens, targets, 2, 24, b);
    double err = 0, scale = 0, lora_effect = 0;
    for (int i = 0; i < 48 * V; i++) { err = fmax(err, fabs(a[i] - b[i])); scale = fmax(scale, fabs(a[i])); }
    float *base = (float *)mallocCheck(48 * V * sizeof(float));
    Model plain;
    memset(&plain, 0, sizeof plain);
    if (model_load(&plain.host, "test/fixtures/tiny_gqa") != 0) die("base");
    model_alloc(&plain, 2, 24, 0, 0, 1);
    model_forward(&plain, tokens, targets, 2, 24, base);
    for (int i = 0; i < 48 * V; i++) lora_effect = fmax(lora_effect, fabs(a[i] - base[i]));
    char what[128];
    snprintf(what, sizeof what, "--merge_adapter (%s): merged model's logits == base + adapter", kind);
    CHECK(err <= 1e-5 * scale && lora_effect > 1e3 * err, what, "max err %.3e of scale %.3e (tol 1e-5); the adapter moves logits by up to %.3e", err, scale, lora_effect);
    free(a); free(b); free(base);
    model_free(&lora); model_free(&merged); model_free(&plain);
}

// a JSONL text dataset of rows of n words
static void write_words(const char *path, int rows, int n) {
    FILE *f = fopenCheck(path, "w");
    for (int r = 0; r < rows; r++) {
        fprintf(f, "{\"text\": \"");
        for (int i = 0; i < n; i++) fprintf(f, "%s ", (const char *[]){"the", "cat", "sat", "on", "a", "mat"}[(i * 7 + r) % 6]);
        fprintf(f, "\"}\n");
    }
    fclose(f);
}

// runs the trainer in a child process; returns its peak RSS (MiB) and the plan it printed
static double child_peak(char **argv, int argc, double *plan_mib) {
    char log[128];
    snprintf(log, sizeof log, "%s/plan_log_XXXXXX", tmpdir);
    int fd = mkstemp(log);
    if (fd < 0) die("mkstemp");
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 1);
        TrainConfig tc;
        _exit(parse_args(&tc, argc, argv) == 0 && train(&tc) == 0 ? 0 : 1);
    }
    int status;
    struct rusage ru;
    wait4(pid, &status, 0, &ru);
    close(fd);
    size_t len;
    char *text = read_file(log, &len), *t = text ? strstr(text, "  total ") : NULL;
    *plan_mib = t ? strtod(t + 8, NULL) : -1;
    free(text);
    unlink(log);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "trainer child: %s %d\n", WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return -1;
    }
    return ru.ru_maxrss / 1024.0;
}

static void test_memory_plan(void) {
#if defined(__SANITIZE_ADDRESS__)
    test_skip("memory plan against peak RSS", "AddressSanitizer's shadow memory and quarantine inflate the RSS");
    return;
#endif
    char model[128], data[128], outdir[128];
    snprintf(model, sizeof model, "%s/plan_model", tmpdir);
    snprintf(data, sizeof data, "%s/plan_data.jsonl", tmpdir);
    snprintf(outdir, sizeof outdir, "%s/plan_out", tmpdir);
    write_random_model(model, 256, 688, 4, 4, 4, 512);
    write_words(data, 4, 1200);
    // (each optimizer's state is part of full fine-tuning's plan: AdamW's 8 bytes a parameter,
    // AdamW8bit's 2 and its staging buffer, SGD's momentum buffer's 4; pure bf16's 6 for
    // AnyPrecision's bf16 moments and compensation and 2 for the step's bf16 gradient)
    struct { const char *name, *seq, *chunk, *mem, *flags[7]; } cases[] = {
        {"LoRA, T = 1024, whole", "1024", "0", "keep", {NULL}},
        {"LoRA, T = 1024, whole, activation checkpointing", "1024", "0", "keep", {"--activation_checkpointing"}},
        {"LoRA, T = 1024, chunks of 128, recompute", "1024", "128", "recompute", {NULL}},
        {"full fine-tuning, T = 512, chunks of 256, keep", "512", "256", "keep", {"--full_finetune"}},
        {"full fine-tuning, AdamW8bit", "512", "256", "keep", {"--full_finetune", "--optimizer", "adamw8bit"}},
        {"full fine-tuning, SGD with momentum", "512", "256", "keep", {"--full_finetune", "--optimizer", "sgd", "--momentum", "0.9"}},
        {"full fine-tuning, pure bf16, AnyPrecisionAdamW with Kahan summation", "512", "256", "keep",
         {"--full_finetune", "--pure_bf16", "1", "--optimizer", "anyprecision", "--kahan_summation", "1"}}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *argv[] = {"x", "--model", (char *)model, "--data", (char *)data, "--max_seq_len", (char *)cases[k].seq,
                        "--batch_size", "2", "--max_steps", "1", "--chunk_size", (char *)cases[k].chunk, "--chunk_memory",
                        (char *)cases[k].mem, "--threads", "2", "--data_cache_dir", tmpdir, "--output_dir", outdir,
                        (char *)cases[k].flags[0], (char *)cases[k].flags[1], (char *)cases[k].flags[2], (char *)cases[k].flags[3],
                        (char *)cases[k].flags[4], (char *)cases[k].flags[5], (char *)cases[k].flags[6]};
        int argc = (int)(sizeof argv / sizeof argv[0]) - 7;
        while (argc < (int)(sizeof argv / sizeof argv[0]) && argv[argc]) argc++;
        double plan, peak = child_peak(argv, argc, &plan);
        char what[200];
        snprintf(what, sizeof what, "memory plan within 10%% of the measured peak: %s (plan %.1f MiB, peak %.1f MiB)", cases[k].name,
                 plan, peak);
        CHECK(peak > 0 && plan > 0 && fabs(plan - peak) <= 0.1 * peak, what, "plan %.1f MiB, peak RSS %.1f MiB (%+.1f%%)",
              plan, peak, 100 * (plan - peak) / peak);
    }
}

static void test_flops(void) {
    HostModel m;
    memset(&m, 0, sizeof m);
    if (model_load(&m, "test/fixtures/tiny_gqa") != 0) die("load");
    // tiny_gqa: D 64, H 96, L 2, 4 heads of 16, 2 kv heads, V 512
    double N = 2 * (64.0 * 64 * 2 + 64.0 * 32 * 2 + 3 * 64.0 * 96) + 512.0 * 64, T = 24;
    double attn = 2 * 2 * 64.0 * T * T;
    m.full_finetune = 1;
    double full = flops_per_sequence(&m, 24, 0);
    CHECK(fabs(full - (6 * N * T + 3 * attn)) < 1e-6 * full, "FLOPs: full fine-tuning = 6 N T + 3 x attention",
          "%.6g vs %.6g", full, 6 * N * T + 3 * attn);
    // a sliding window of 8 keys: query i sees min(i + 1, 8) of them, 8 * 24 - 28 = 164 pairs, which
    // the continuous count (as T^2 / 2 for causal) makes 24^2 / 2 - 16^2 / 2 = 160, not 24^2 / 2 = 288
    m.config.sliding_window = 8;
    double windowed = flops_per_sequence(&m, 24, 0), wattn = 4 * 2 * 64.0 * 160;
    CHECK(fabs(windowed - (6 * N * T + 3 * wattn)) < 1e-6 * windowed, "FLOPs: a sliding window counts only its scores",
          "%.6g vs %.6g", windowed, 6 * N * T + 3 * wattn);
    // --s2_attn: groups of 6; the first half of the heads 4 of them, 4 * 6^2 / 2 = 72 pairs (continuous
    // count), the second 3 and two of 3, 54 + 9 = 63: 67.5 pairs a head on average, not 288
    m.config.sliding_window = 0;
    double s2 = flops_per_sequence(&m, 24, 1), s2attn = 4 * 2 * 64.0 * 67.5;
    CHECK(fabs(s2 - (6 * N * T + 3 * s2attn)) < 1e-6 * s2, "FLOPs: --s2_attn counts only its groups' scores", "%.6g vs %.6g",
          s2, 6 * N * T + 3 * s2attn);
    host_model_free(&m);
}

// config.json's sliding_window as transformers reads it: an integer W (Mistral v0.1's
// 4096) is the window; null (Mistral v0.2+) and absent (Llama) are none, 0. What is
// not an integer >= 1 is refused (test/test_cli.sh checks the messages).
static void test_config_sliding_window(void) {
    const char *values[] = {"4096", "1", "null", NULL, "0", "-3", "2.5", "\"4096\"", "true"};
    int want[] = {4096, 1, 0, 0, -1, -1, -1, -1, -1}; // -1: refused
    for (int i = 0; i < 9; i++) {
        char dir[300], path[320];
        snprintf(dir, sizeof dir, "%s/window%d", tmpdir, i);
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (mkdir_p(dir) != 0) die("mkdir %s", dir);
        FILE *f = fopenCheck(path, "w");
        fprintf(f, "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                "\"vocab_size\": 512%s%s}\n", values[i] ? ", \"sliding_window\": " : "", values[i] ? values[i] : "");
        fclose(f);
        Config c;
        memset(&c, 0x55, sizeof c);
        int rc = config_load(&c, dir), got = rc == 0 ? c.sliding_window : -1;
        char what[120];
        snprintf(what, sizeof what, "config.json \"sliding_window\": %s -> %s", values[i] ? values[i] : "(absent)",
                 want[i] < 0 ? "refused" : want[i] ? "that window" : "none (0)");
        CHECK(got == want[i] && (rc == 0) == (want[i] >= 0), what, "config_load %d, sliding_window %d", rc, got);
    }
}

// ----------------------------------------------------------------------------
// --random_init

// a config.json alone (no weights) of a small GQA Llama with initializer_range std
static void write_config_only(const char *dir, double std) {
    char path[256];
    if (mkdir_p(dir) != 0) die("mkdir %s", dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopenCheck(path, "w");
    fprintf(f, "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
            "\"num_key_value_heads\": 2, \"vocab_size\": 512, \"initializer_range\": %g}\n", std);
    fclose(f);
}

static void draw_whole(HostModel *m, const char *dir, uint64_t seed) {
    memset(m, 0, sizeof *m);
    if (model_init_random(m, dir, seed, 0, 1, 1) != 0) die("model_init_random %s", dir);
}

// fsdp.h's FsdpReadFn out of a whole model: what a shard of it holds
static int read_whole(void *ctx, int unit, int tensor, size_t first, size_t count, float *dst) {
    const HostModel *m = (const HostModel *)ctx;
    memcpy(dst, m->params + model_tensor_offset(&m->config, unit, tensor) + first, count * sizeof(float));
    return 0;
}

// the mean losses of the first and the last 5 steps of a metrics file (every loss finite), or -1
static int loss_ends(const char *path, double *first5, double *last5) {
    double loss[64];
    int n = 0;
    char line[1024];
    FILE *f = fopenCheck(path, "r");
    while (n < 64 && fgets(line, sizeof line, f)) {
        JsonValue j;
        char err[64];
        if (json_parse(line, strlen(line), &j, err, sizeof err) != 0) die("%s: %s", path, err);
        if (json_get_number(&j, "loss", &loss[n]) == 0) n++;
        json_free(&j);
    }
    fclose(f);
    *first5 = *last5 = 0;
    for (int i = 0; i < n; i++)
        if (!isfinite(loss[i])) return -1;
    if (n < 10) return -1;
    for (int i = 0; i < 5; i++) { *first5 += loss[i] / 5; *last5 += loss[n - 1 - i] / 5; }
    return 0;
}

// the deterministic part of a metrics file: each record up to its timing ("ms", then memory)
static char *trajectory(const char *path) {
    size_t len;
    char *text = read_file(path, &len), *out = (char *)callocCheck(len + 1, 1), *o = out;
    if (!text) die("cannot read %s", path);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *ms = strstr(line, "\"ms\"");
        size_t n = ms ? (size_t)(ms - line) : strlen(line);
        memcpy(o, line, n);
        o += n;
        *o++ = '\n';
    }
    free(text);
    return out;
}

static void test_random_init(void) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/random", tmpdir);
    const double std = 0.05;
    write_config_only(dir, std);
    HostModel a, b;
    draw_whole(&a, dir, 7);
    const Config *c = &a.config;
    float *t[NUM_PARAM_TENSORS];
    param_tensors(&a.w, t);
    // every tensor against N(0, std): its mean, its standard deviation and the fraction beyond
    // 2 std (4.55% for a normal; 0 for a uniform of the same std), each within 5 standard errors
    double worst = 0; // the largest deviation, in standard errors
    size_t not_one = 0;
    char where[256] = "";
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        size_t n = param_numel(c, p);
        int64_t rows, cols;
        param_shape(c, p, &rows, &cols);
        if (rows == 1) { // a norm: ones, exactly
            for (size_t i = 0; i < n; i++) not_one += t[p][i] != 1.0f;
            continue;
        }
        double sum = 0, sumsq = 0, tail = 0;
        for (size_t i = 0; i < n; i++) { sum += t[p][i]; sumsq += (double)t[p][i] * t[p][i]; tail += fabs(t[p][i]) > 2 * std; }
        double mean = sum / n, sd = sqrt(sumsq / n - mean * mean), frac = tail / n, pt = 0.0455;
        double dev = fmax(fabs(mean) / (std / sqrt((double)n)),
                          fmax(fabs(sd - std) / (std / sqrt(2.0 * n)), fabs(frac - pt) / sqrt(pt * (1 - pt) / n)));
        if (dev > worst)
            snprintf(where, sizeof where, "tensor %d (%zu values): mean %.3g, std %.4g, beyond 2 std %.4f", p, n, mean, sd, frac);
        worst = fmax(worst, dev);
    }
    CHECK(worst <= 5 && not_one == 0, "--random_init: linear layers and embedding N(0, initializer_range), norms 1",
          "worst %.2f standard errors (tol 5) at %s; %zu norm weights not 1", worst, where, not_one);

    // the same bits again and at another thread count; another seed, other weights
#ifdef _OPENMP
    int threads = omp_get_max_threads();
    omp_set_num_threads(3);
#endif
    draw_whole(&b, dir, 7);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    size_t differ = 0;
    for (size_t i = 0; i < a.num_params; i++) differ += a.params[i] != b.params[i];
    CHECK(differ == 0, "--random_init: the same weights at any thread count", "%zu of %zu differ (1 vs 3 threads)", differ, a.num_params);
    host_model_free(&b);
    draw_whole(&b, dir, 8);
    size_t same = 0;
    for (size_t i = 0; i < a.num_params; i++) same += a.params[i] == b.params[i] && a.params[i] != 1.0f;
    CHECK(same < a.num_params / 1000, "--random_init: another --seed draws other weights", "%zu of %zu equal", same, a.num_params);
    host_model_free(&b);

    // sharded 3 ways: each rank's shards are the whole model's
    differ = 0;
    for (int r = 0; r < 3; r++) {
        HostModel s;
        memset(&s, 0, sizeof s);
        if (model_init_random(&s, dir, 7, r, 3, 1) != 0) die("sharded draw");
        float *want = (float *)mallocCheck(s.units.shard_numel * sizeof(float));
        fsdp_read_shard(&s.units, r, want, read_whole, &a);
        for (size_t i = 0; i < s.units.shard_numel; i++) differ += want[i] != s.shards[i];
        free(want);
        host_model_free(&s);
    }
    CHECK(differ == 0, "--random_init: a rank's shards (W = 3) are those of the whole model", "%zu elements differ", differ);
    host_model_free(&a);

    // the trainer with --random_init: it trains, and a second run repeats the first bit for bit
    char out[2][160], metrics[2][160], adapter[2][400];
    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof out[k], "%s/random_run%d", tmpdir, k);
        snprintf(metrics[k], sizeof metrics[k], "%s/random_run%d.jsonl", tmpdir, k);
        snprintf(adapter[k], sizeof adapter[k], "%s/adapter_model.safetensors", out[k]);
        char *argv[] = {"x", "--model", dir, "--random_init", "--tokenizer", "test/fixtures/tiny_gqa/tokenizer.model", "--data",
                        "test/fixtures/data.jsonl", "--max_seq_len", "24", "--max_steps", "30", "--lr", "1e-2",
                        "--lora_target_modules", "all-linear", "--threads", "1", "--output_dir", out[k], "--metrics_file",
                        metrics[k]};
        TrainConfig tc;
        if (parse_args(&tc, sizeof argv / sizeof argv[0], argv) != 0 || train(&tc) != 0) die("--random_init run failed");
    }
    double first5, last5;
    int finite = loss_ends(metrics[0], &first5, &last5) == 0;
    // measured: 6.02 -> 4.54 (ln 512 = 6.24 at the start); a run that does not learn stays near 6
    CHECK(finite && last5 < first5 - 0.5, "--random_init: trains (30 steps: loss finite, the last 5 steps' mean 0.5 below the first 5's)",
          "first 5 %.4f, last 5 %.4f%s", first5, last5, finite ? "" : " (NaN, inf, or too few steps)");
    char *t0 = trajectory(metrics[0]), *t1 = trajectory(metrics[1]);
    size_t n0, n1;
    char *w0 = read_file(adapter[0], &n0), *w1 = read_file(adapter[1], &n1);
    int same_log = strcmp(t0, t1) == 0, same_adapter = w0 && w1 && n0 == n1 && memcmp(w0, w1, n0) == 0;
    CHECK(same_log && same_adapter, "--random_init: a second run repeats the first bit for bit (losses, norms, adapter)",
          "metrics %s, adapter %s", same_log ? "same" : "differ", same_adapter ? "same" : "differs");
    free(t0); free(t1); free(w0); free(w1);
}

// samples are printed with control bytes escaped: one line each, nothing a terminal obeys
static void test_sample_escaping(void) {
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    fputs_escaped("a\nb\tc\x1b[31md\\e\x7f\xc3\xa9", f);
    fclose(f);
    const char *want = "a\\nb\\tc\\x1b[31md\\\\e\\x7f\xc3\xa9"; // UTF-8 (é) passes through
    CHECK(strcmp(buf, want) == 0, "samples: control bytes escaped", "got '%s', want '%s'", buf, want);
    free(buf);
}

// --collectives: which backend moves the CUDA trainer's device buffers (fsdp_device_backend), by the
// rules of docs/sharding.md: NCCL needs a GPU per rank on every node (it refuses two ranks on one device)
// and a build with NCCL; host (staged) runs anywhere; auto picks NCCL where it can run
static void test_device_backend(void) {
    const int NCCL = FSDP_BACKEND_NCCL, HOST = FSDP_BACKEND_STAGED;
    struct { const char *requested; int world, local, devices, have_nccl, want; const char *error, *what; } cases[] = {
        {"host", 2, 2, 2, 1, HOST, NULL, "host where NCCL could run"},
        {"auto", 2, 2, 2, 1, NCCL, NULL, "auto, a GPU per rank"},
        {"auto", 4, 2, 2, 1, NCCL, NULL, "auto, 2 nodes of 2 ranks on 2 GPUs each (W above the GPUs of a node)"},
        {"auto", 2, 2, 1, 1, HOST, NULL, "auto, 2 ranks sharing 1 GPU"},
        {"auto", 2, 2, 8, 0, HOST, NULL, "auto, built without NCCL"},
        {"nccl", 2, 2, 2, 1, NCCL, NULL, "nccl, a GPU per rank"},
        {"nccl", 1, 1, 1, 0, NCCL, NULL, "nccl, one rank without NCCL (no collectives to refuse)"},
        {"nccl", 3, 3, 2, 1, -1, "--collectives nccl: this node runs 3 ranks on 2 GPU(s), and NCCL refuses two ranks on one device: use --collectives host",
         "nccl, 3 ranks sharing 2 GPUs"},
        {"nccl", 2, 2, 2, 0, -1, "--collectives nccl: this program was built without NCCL", "nccl, 2 ranks, built without NCCL"},
        {"bogus", 2, 2, 2, 1, -1, "--collectives: 'bogus' is not one of auto, nccl, host", "a bad value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[320] = "", what[200];
        int got = fsdp_device_backend(cases[i].requested, cases[i].world, cases[i].local, cases[i].devices,
                                      cases[i].have_nccl, err, sizeof err);
        int ok = got == cases[i].want && (!cases[i].error || strstr(err, cases[i].error));
        snprintf(what, sizeof what, "--collectives: %s -> %s", cases[i].what, cases[i].error ? "refused" : cases[i].want == NCCL ? "nccl" : "host");
        CHECK(ok, what, "got %d (NCCL %d, host %d), message '%s'", got, NCCL, HOST, err);
        if (cases[i].error && cases[i].error[0] == '-' && strstr(cases[i].error, "nccl:")) // a refusal says what to use instead
            CHECK(strstr(err, "--collectives host") != NULL, "--collectives nccl refused: the message points to --collectives host", "'%s'", err);
    }
}

// the optimizer's state in the plan and in memory: one float per trainable
// parameter for each of AdamW's moments, SGD's momentum buffer, nothing else
// for plain SGD (full fine-tuning: the gradients and the state, and a state
// tensor's worth for a checkpoint's staging; the weights are the base weights' bytes)
static void test_optimizer_state(void) {
    struct { const char *what; const char *args[4]; int states; } cases[] = {
        {"AdamW: two moments", {"--optimizer", "adamw"}, 2},
        {"SGD with momentum: one buffer", {"--optimizer", "sgd", "--momentum", "0.9"}, 1},
        {"plain SGD: no state", {"--optimizer", "sgd"}, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *argv[16] = {"x", "--model", "test/fixtures/tiny_gqa", "--data", "test/fixtures/data.jsonl", "--full_finetune"};
        int argc = 6;
        for (int i = 0; i < 4 && cases[k].args[i]; i++) argv[argc++] = (char *)cases[k].args[i];
        TrainConfig tc;
        if (parse_args(&tc, argc, argv) != 0) die("optimizer state test arguments");
        Model m;
        Optimizer o;
        if (model_setup(&m, NULL, &tc, 1, 8, NULL) != 0) die("optimizer state test model");
        optimizer_init(&o, &m);
        size_t n = m.host.num_params;
        int held = (o.state[0] != NULL) + (o.state[1] != NULL);
        char what[160];
        snprintf(what, sizeof what, "memory plan and optimizer_init, full fine-tuning: %s", cases[k].what);
        size_t want = n * sizeof(float) * (1 + cases[k].states + (cases[k].states > 0));
        CHECK(m.param_bytes == want && held == cases[k].states && o.n == n, what,
              "plan %zu bytes for %zu parameters (want %zu), %d state tensors held", m.param_bytes, n, want, held);
        optimizer_free(&o);
        model_free(&m);
    }
}

// AdamW8bit's state in the plan and in memory, tiny_gqa full fine-tuning, counted here from
// the model's shapes (dim 64, 4 heads and 2 KV heads of 16, MLP 96, 2 layers, untied head):
// q, o (64 x 64), gate, up, down (96 x 64), the embedding and lm_head (V x 64) keep codes
// (2 bytes an element) and an fp32 absmax per 256 (2 more floats a block); k, v (32 x 64)
// and the norms (64) fp32 moments (8 bytes an element); a checkpoint's staging holds the
// largest state tensor, the codes of one moment (one byte an 8-bit element)
static void test_adamw8bit_state(void) {
    char *argv[] = {"x", "--model", "test/fixtures/tiny_gqa", "--data", "test/fixtures/data.jsonl", "--full_finetune",
                    "--optimizer", "adamw8bit"};
    TrainConfig tc;
    if (parse_args(&tc, 8, argv) != 0) die("adamw8bit state test arguments");
    Model m;
    Optimizer o;
    if (model_setup(&m, NULL, &tc, 1, 8, NULL) != 0) die("adamw8bit state test model");
    optimizer_init(&o, &m);
    size_t V = (size_t)m.host.config.vocab_size, n8 = 2 * (2 * 64 * 64 + 3 * 96 * 64) + 2 * V * 64;
    size_t n32 = 2 * (2 * 32 * 64 + 2 * 64) + 64, n = m.host.num_params;
    size_t want = n * sizeof(float) + n8 * 2 + n8 / 256 * 2 * sizeof(float) + n32 * 2 * sizeof(float) + n8; // the gradients first
    CHECK(n8 + n32 == n && m.param_bytes == want && o.n == n, "memory plan and optimizer_init, full fine-tuning: AdamW8bit's codes, absmax and fp32 moments",
          "plan %zu bytes for %zu parameters (want %zu: %zu in 8 bits, %zu in fp32)", m.param_bytes, n, want, n8, n32);
    optimizer_free(&o);
    model_free(&m);
}

// trainer/schedule.h's loss_scale_update against torch.amp.GradScaler("cpu") driven alone
// (dev/reference/make_grad_scaler_fixtures.py): 6600 steps with overflows at
// steps 1, 2, 2500 and 4499, so two backoffs, a growth after 2000 clean steps,
// a backoff that restarts the count, one a step before a growth. The scale
// after every step must be torch's exactly (powers of two: no tolerance).
// an Optimizer over the given runs of parameters, as optimizer_init makes one (its state zeroed)
static void a8_optimizer(Optimizer *o, const OptimizerSettings *s, const OptimTensors *t, float **run, const size_t *run_n, int n_runs,
                         float *grads) {
    memset(o, 0, sizeof *o);
    o->n_runs = n_runs;
    for (int r = 0; r < n_runs; r++) o->run[r] = run[r], o->run_n[r] = run_n[r], o->n += run_n[r];
    o->grads = grads;
    o->s = *s;
    o->tensors = t;
    for (int i = 0; i < optimizer_n_states(s); i++) {
        size_t count, es = optimizer_state_elem(s, t, o->n, i, &count);
        o->state[i] = callocCheck(count + 1, es);
    }
}

// AdamW8bit in sharded full fine-tuning: each rank steps the pieces of the tensors in its
// shards (whole blocks of 256: model_align_blocks) and must give the whole model's step bit
// for bit: every parameter, and its state (each 8-bit tensor's codes and the absmax of each
// block, the fp32 moments of the others), after 3 steps, at W = 2, 3 and 4, with the first
// layer frozen and without. Whole and sharded get the same gradients, so nothing differs
// but the layout: the tolerance is 0.
static void test_adamw8bit_sharded_step(void) {
    Config c = {0};
    c.dim = 256, c.hidden_dim = 512, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64, c.vocab_size = 512;
    OptimizerSettings s = {0};
    s.kind = OPTIMIZER_ADAMW8BIT, s.weight_decay = 0.01f, s.beta1 = 0.9f, s.beta2 = 0.999f, s.eps = 1e-8f;
    const int steps = 3;
    for (int frozen = 0; frozen <= 2; frozen += 2) {
        HostModel wh = {0};
        wh.config = c, wh.full_finetune = 1, wh.frozen_units = frozen;
        model_units(&c, &wh.units, 1);
        wh.num_params = wh.units.numel;
        float *P0 = (float *)mallocCheck(wh.num_params * sizeof(float)), *P = (float *)mallocCheck(wh.num_params * sizeof(float));
        for (size_t e = 0; e < wh.num_params; e++) P0[e] = 0.05f * (hash_uniform(1, e) - 0.5f);
        memcpy(P, P0, wh.num_params * sizeof(float));
        wh.params = P;
        size_t first[NUM_PARAM_TENSORS], count[NUM_PARAM_TENSORS], n = 0;
        float *runs[NUM_PARAM_TENSORS];
        int n_runs = model_trainable_runs(&wh, first, count);
        for (int r = 0; r < n_runs; r++) runs[r] = P + first[r], n += count[r];
        float *G = (float *)mallocCheck(n * sizeof(float) * steps); // each step's gradients, the trainable layout
        for (size_t e = 0; e < n * steps; e++) G[e] = 1e-3f * (hash_uniform(2, e) - 0.5f) * (e % 7 == 0 ? 30.0f : 1.0f);
        OptimTensors wt = {0};
        model_optim_tensors(&wh, &s, -1, &wt);
        Optimizer wo;
        a8_optimizer(&wo, &s, &wt, runs, count, n_runs, G);
        for (int t = 1; t <= steps; t++) wo.grads = G + (size_t)(t - 1) * n, wo.t = t, adamw8bit_step(&wo, 1e-2f);
        Adamw8bitState wa = adamw8bit_state(wo.state);
        for (int W = 2; W <= 4; W++) {
            int bad_p = 0, bad_s = 0, pieces = 0;
            for (int rank = 0; rank < W; rank++) {
                HostModel h = {0};
                h.config = c, h.full_finetune = 1, h.frozen_units = frozen;
                model_units(&c, &h.units, W);
                if (model_align_blocks(&h, "test") != 0) die("model_align_blocks");
                const FsdpUnits *u = &h.units;
                size_t base = u->units[frozen].shard_offset, rn = u->shard_numel - base; // the trainable run
                float *shards = (float *)callocCheck(u->shard_numel, sizeof(float)), *g = (float *)callocCheck(rn * steps, sizeof(float));
                // the same values in this rank's layout: unit i's element x at its shard's place
                for (int i = 0; i < u->n_units; i++) {
                    size_t begin, cnt = fsdp_shard_range(u->units[i].numel, W, u->align, rank, &begin);
                    for (int j = 0; j < u->units[i].n_tensors; j++) {
                        const FsdpTensor *tt = &u->units[i].tensors[j];
                        for (size_t x = tt->offset; x < tt->offset + tt->numel; x++) {
                            if (x < begin || x >= begin + cnt) continue;
                            size_t at = u->units[i].shard_offset + (x - begin);
                            shards[at] = P0[model_tensor_offset_from(&c, 0, i, j) + (x - tt->offset)];
                            for (int t = 0; i >= frozen && t < steps; t++)
                                g[(size_t)t * rn + at - base] = G[(size_t)t * n + model_tensor_offset_from(&c, frozen, i, j) + (x - tt->offset)];
                        }
                    }
                }
                OptimTensors st = {0};
                h.units.n_shards = W; // (host_sharded)
                model_optim_tensors(&h, &s, rank, &st);
                float *run = shards + base;
                Optimizer so;
                a8_optimizer(&so, &s, &st, &run, &rn, 1, g);
                for (int t = 1; t <= steps; t++) so.grads = g + (size_t)(t - 1) * rn, so.t = t, adamw8bit_step(&so, 1e-2f);
                Adamw8bitState sa = adamw8bit_state(so.state);
                // each piece against the whole tensor it is part of, in the units' order as model_optim_tensors lists them
                for (int i = frozen, k = 0; i < u->n_units; i++) {
                    size_t begin, cnt = fsdp_shard_range(u->units[i].numel, W, u->align, rank, &begin);
                    for (int j = 0; j < u->units[i].n_tensors; j++) {
                        const FsdpTensor *tt = &u->units[i].tensors[j];
                        size_t lo = begin > tt->offset ? begin : tt->offset, hi = begin + cnt < tt->offset + tt->numel ? begin + cnt : tt->offset + tt->numel;
                        if (lo >= hi) continue;
                        size_t off = model_tensor_offset_from(&c, frozen, i, j), e0 = lo - tt->offset;
                        int wk = 0;
                        while (wt.first[wk] != off) wk++;
                        bad_s |= k >= st.n || st.numel[k] != hi - lo || st.quant[k] != wt.quant[wk];
                        for (size_t e = 0; e < hi - lo && !bad_s; e++) {
                            bad_p |= shards[u->units[i].shard_offset + (lo - begin) + e] != P[model_tensor_offset_from(&c, 0, i, j) + e0 + e];
                            for (int mo = 0; mo < 2; mo++)
                                if (wt.quant[wk])
                                    bad_s |= sa.codes[mo][st.at[k] + e] != wa.codes[mo][wt.at[wk] + e0 + e] ||
                                             sa.absmax[mo][(st.at[k] + e) / 256] != wa.absmax[mo][(wt.at[wk] + e0 + e) / 256];
                                else bad_s |= memcmp(&sa.fp32[mo][st.at[k] + e], &wa.fp32[mo][wt.at[wk] + e0 + e], sizeof(float)) != 0;
                        }
                        k++, pieces++;
                    }
                }
                for (int i = 0; i < OPTIMIZER_MAX_STATES; i++) free(so.state[i]);
                optim_tensors_free(&st);
                fsdp_units_free(&h.units);
                free(shards), free(g);
            }
            char what[200];
            snprintf(what, sizeof what, "AdamW8bit, sharded full fine-tuning, W = %d%s: every rank's pieces (%d) step as the whole model, "
                     "bit for bit (parameters; codes, absmax, fp32 moments)", W, frozen ? ", first layer frozen" : "", pieces);
            CHECK(!bad_p && !bad_s, what, "parameters %s, state %s", bad_p ? "differ" : "equal", bad_s ? "differs" : "equal");
        }
        for (int i = 0; i < OPTIMIZER_MAX_STATES; i++) free(wo.state[i]);
        optim_tensors_free(&wt);
        fsdp_units_free(&wh.units);
        free(P0), free(P), free(G);
    }
}

static void test_loss_scale_sequence(void) {
    JsonValue exp;
    if (json_load_file("test/fixtures/grad_scaler/expected.json", &exp) != 0) die("grad scaler fixture");
    const JsonValue *seq = json_get(&exp, "sequence"), *inf = json_get(seq, "inf_steps"), *changes = json_get(seq, "changes");
    double steps, init, want;
    if (!seq || !inf || !changes || json_get_number(seq, "steps", &steps) != 0 || json_get_number(seq, "init_scale", &init) != 0)
        die("grad scaler fixture: no sequence");
    LossScale ls;
    loss_scale_init(&ls, 1);
    int bad = 0, first_bad = 0, next_change = 0, next_inf = 0;
    double got_bad = 0, want_bad = 0;
    want = init;
    CHECK(ls.scale == init, "loss scale: starts at GradScaler's init_scale", "%g vs %g", ls.scale, init);
    for (int s = 1; s <= (int)steps; s++) {
        int found_inf = next_inf < inf->count && (int)inf->items[next_inf].number == s;
        next_inf += found_inf;
        loss_scale_update(&ls, found_inf);
        if (next_change < changes->count && (int)changes->items[next_change].items[0].number == s)
            want = changes->items[next_change++].items[1].number;
        if (ls.scale != want && !bad++) first_bad = s, got_bad = ls.scale, want_bad = want;
    }
    CHECK(bad == 0 && next_change == changes->count, "loss scale: GradScaler's scale after each of 6600 steps",
          "%d steps differ, the first after step %d: %g (torch %g)", bad, first_bad, got_bad, want_bad);
    LossScale off;
    loss_scale_init(&off, 0);
    loss_scale_update(&off, 1);
    CHECK(off.scale == 1.0f, "loss scale: off (fp32, bf16 as torch) scales by 1 and never changes", "%g", off.scale);
    json_free(&exp);
}

static void test_thread_count_sums(void) {
#ifdef _OPENMP
    int threads = omp_get_max_threads(), counts[] = {1, 2, 3, 5, 3, 5};
    size_t n = 1000003; // not a multiple of anything the loops split by
    int rows = 97, V = 1003, *targets = (int *)mallocCheck(rows * sizeof(int));
    float *g = (float *)mallocCheck(n * sizeof(float)), *logits = (float *)mallocCheck((size_t)rows * V * sizeof(float));
    float *z = (float *)mallocCheck((size_t)rows * V * sizeof(float));
    uint64_t st = 42;
    for (size_t i = 0; i < n; i++) g[i] = rng_uniform(&st) * 2.5f - 1.25f;
    for (size_t i = 0; i < (size_t)rows * V; i++) logits[i] = rng_uniform(&st) * 20.0f - 10.0f;
    for (int i = 0; i < rows; i++) targets[i] = i % 11 == 5 ? -100 : (int)(rng_next(&st) % V);
    double sumsq[6], loss[6];
    for (int k = 0; k < 6; k++) {
        omp_set_num_threads(counts[k]);
        sumsq[k] = grad_sumsq(g, n);
        memcpy(z, logits, (size_t)rows * V * sizeof(float));
        loss[k] = crossentropy_forward_backward(z, targets, NULL, NULL, rows, V, 0.25f);
    }
    omp_set_num_threads(threads);
    int same = 1;
    for (int k = 1; k < 6; k++) same &= sumsq[k] == sumsq[0] && loss[k] == loss[0];
    CHECK(same, "the loss and the gradient norm's sums: the same bits at 1, 2, 3 and 5 threads, twice",
          "sumsq %.17g %.17g %.17g %.17g; loss %.17g %.17g %.17g %.17g", sumsq[0], sumsq[1], sumsq[2], sumsq[3],
          loss[0], loss[1], loss[2], loss[3]);
    free(g), free(logits), free(z), free(targets);
#endif
}

// The whole model's results at 1, 2 and 3 threads: every gradient of full fine-tuning
// (whole, and chunked with recompute, the head in pieces and activation checkpointing),
// and the LoRA adapter that 3 training steps write, compared bit for bit. The shape makes
// every parallel split real: 262 rows (not a multiple of GEMM_MR, several GEMM_MC blocks),
// K of 384 and 1000 (2 and 4 blocks of k), N of 1000 and 1100 (several GEMM_NC blocks and a
// ragged strip), 131 positions (several attention tiles), GQA; one layer keeps it cheap.
static void test_thread_count_model(void) {
#ifdef _OPENMP
    enum { NB = 2, NT = 131 };
    int threads = omp_get_max_threads(), counts[] = {1, 2, 3}; // (3: partial sums would meet in any order)
    char model[128], data[128];
    snprintf(model, sizeof model, "%s/threads_model", tmpdir);
    snprintf(data, sizeof data, "%s/threads_data.jsonl", tmpdir);
    write_random_model(model, 384, 1000, 1, 6, 2, 1100);
    int tokens[NB * NT], targets[NB * NT];
    uint64_t st = 5;
    for (int i = 0; i < NB * NT; i++) tokens[i] = (int)(rng_next(&st) % 1100), targets[i] = i % 7 == 3 ? -100 : (int)(rng_next(&st) % 1100);
    struct { const char *name, *chunk, *out_chunks, *ckpt; } cases[] = {
        {"whole", "0", "1", "--activation_checkpointing=0"},
        {"chunks of 64, recompute, the head in 3 pieces, activation checkpointing", "64", "3", "--activation_checkpointing"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        double loss[3];
        float *grads[3];
        size_t n = 0;
        for (int t = 0; t < 3; t++) {
            omp_set_num_threads(counts[t]);
            char *argv[] = {"x", "--model", model, "--data", "unused", "--max_seq_len", "131", "--full_finetune",
                            "--chunk_size", (char *)cases[k].chunk, "--chunk_memory", "recompute",
                            "--num_output_chunks", (char *)cases[k].out_chunks, (char *)cases[k].ckpt};
            TrainConfig tc;
            Model m;
            if (parse_args(&tc, sizeof argv / sizeof argv[0], argv) != 0 || model_setup(&m, NULL, &tc, NB, NT, NULL) != 0)
                die("cannot set up %s", model);
            n = m.host.num_params;
            memset(m.grads, 0, n * sizeof(float));
            loss[t] = model_forward_backward(&m, tokens, targets, NB, NT, 1.0f / 37);
            grads[t] = (float *)mallocCheck(n * sizeof(float));
            memcpy(grads[t], m.grads, n * sizeof(float));
            model_free(&m);
        }
        size_t differ = 0, nonzero = 0;
        for (size_t i = 0; i < n; i++) nonzero += grads[0][i] != 0.0f;
        for (int t = 1; t < 3; t++) differ += memcmp(grads[t], grads[0], n * sizeof(float)) != 0 || loss[t] != loss[0];
        char what[200];
        snprintf(what, sizeof what, "full fine-tuning, %s: the loss and every gradient the same bits at 1, 2, 3 threads", cases[k].name);
        CHECK(differ == 0 && nonzero > n / 2, what, "%zu of 2 thread counts differ from 1 thread (losses %.17g %.17g %.17g); "
              "%zu of %zu gradients nonzero", differ, loss[0], loss[1], loss[2], nonzero, n);
        for (int t = 0; t < 3; t++) free(grads[t]);
    }

    // 3 LoRA steps through the trainer (data, dropout, clipping, AdamW), the adapter files compared
    write_words(data, 12, 200);
    char *adapter[3] = {0};
    size_t len[3] = {0};
    for (int t = 0; t < 3; t++) {
        char out[160], th[8], path[200];
        snprintf(out, sizeof out, "%s/threads_out%d", tmpdir, t);
        snprintf(th, sizeof th, "%d", counts[t]);
        char *argv[] = {"x", "--model", model, "--data", data, "--max_seq_len", "131", "--batch_size", "2", "--max_steps", "3",
                        "--lr", "1e-2", "--lora_r", "8", "--lora_target_modules", "all-linear", "--lora_dropout", "0.1",
                        "--grad_clip", "1.0", "--threads", th, "--output_dir", out};
        TrainConfig tc;
        if (parse_args(&tc, sizeof argv / sizeof argv[0], argv) != 0 || train(&tc) != 0) die("the %d-thread LoRA run failed", counts[t]);
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", out);
        adapter[t] = read_file(path, &len[t]);
        if (!adapter[t]) die("cannot read %s", path);
    }
    omp_set_num_threads(threads);
    int differ = 0;
    for (int t = 1; t < 3; t++) differ += len[t] != len[0] || memcmp(adapter[t], adapter[0], len[0]) != 0;
    CHECK(differ == 0, "LoRA, 3 training steps: the adapter file the same bytes at 1, 2, 3 threads",
          "%d of 2 thread counts differ from 1 thread", differ);
    for (int t = 0; t < 3; t++) free(adapter[t]);
#endif
}

int main(void) {
    test_loss_scale_sequence();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/llama2tune_test_trainer_XXXXXX");
    if (!mkdtemp(tmpdir)) die("mkdtemp: %s", strerror(errno));
    test_merge("lora");
    test_merge("dora");
    test_merge("ia3");
    test_flops();
    test_config_sliding_window();
    test_sample_escaping();
    test_device_backend();
    test_optimizer_state();
    test_adamw8bit_state();
    test_memory_plan();
    test_thread_count_sums(); // (after test_memory_plan: it starts OpenMP threads, see below)
    test_thread_count_model();
    test_adamw8bit_sharded_step(); // (after test_memory_plan: the peak memory a forked child measures starts at this process's)
    test_random_init(); // last: it starts OpenMP threads, and a child forked after that (test_memory_plan's) hangs in libgomp
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    return test_summary();
}
