// Trainer features beyond the math: the merged export, the memory plan and
// the FLOP count.
//
// - --merge_adapter: the merged model, loaded without LoRA, gives the logits
//   of base + adapter. Tolerance 1e-5 of the logits' scale: merging changes
//   only the order of fp32 sums (W x + s B (A x) against (W + s B A) x).
// - The memory plan printed before training is within 10% of the peak
//   resident memory measured afterwards (issue 7), for LoRA whole-sequence
//   (with and without --activation_checkpointing), LoRA chunked with
//   recompute, and full fine-tuning, on a random model large
//   enough (~15 MB of weights, ~50-200 MB in all) that the process's fixed
//   overhead (code, libc, tokenizer: ~4 MB) is small next to it.
// - The FLOP count follows the formula in the README: checked against the
//   same formula written out by hand for one small shape.
#define TESTING
#include "../train_llama2.c"
#include "test_common.h"
#include "random_model.h"
#include <sys/wait.h>

// every path under one folder of this process, so concurrent test runs do not collide
static char tmpdir[64];

static void test_merge(void) {
    char out[128];
    snprintf(out, sizeof out, "%s/merge", tmpdir);
    char *argv[] = {"x", "--model", "test/fixtures/tiny_gqa", "--data", "test/fixtures/data.jsonl", "--max_seq_len", "24",
                    "--max_steps", "5", "--lr", "1e-2", "--lora_target_modules", "all-linear", "--lora_dropout", "0",
                    "--threads", "1", "--output_dir", (char *)out, "--merge_adapter"};
    TrainConfig tc;
    if (parse_args(&tc, sizeof argv / sizeof argv[0], argv) != 0 || train(&tc) != 0) die("merge run failed");
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
    CHECK(err <= 1e-5 * scale && lora_effect > 1e3 * err, "--merge_adapter: merged model's logits == base + adapter",
          "max err %.3e of scale %.3e (tol 1e-5); the adapter moves logits by up to %.3e", err, scale, lora_effect);
    free(a); free(b); free(base);
    model_free(&lora); model_free(&merged); model_free(&plain);
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
    write_random_model(model, 256, 688, 4, 4, 4);
    FILE *f = fopenCheck(data, "w");
    for (int r = 0; r < 4; r++) {
        fprintf(f, "{\"text\": \"");
        for (int i = 0; i < 1200; i++) fprintf(f, "%s ", (const char *[]){"the", "cat", "sat", "on", "a", "mat"}[(i * 7 + r) % 6]);
        fprintf(f, "\"}\n");
    }
    fclose(f);
    struct { const char *name, *seq, *chunk, *mem, *flag; } cases[] = {
        {"LoRA, T = 1024, whole", "1024", "0", "keep", NULL},
        {"LoRA, T = 1024, whole, activation checkpointing", "1024", "0", "keep", "--activation_checkpointing"},
        {"LoRA, T = 1024, chunks of 128, recompute", "1024", "128", "recompute", NULL},
        {"full fine-tuning, T = 512, chunks of 256, keep", "512", "256", "keep", "--full_finetune"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *argv[] = {"x", "--model", (char *)model, "--data", (char *)data, "--max_seq_len", (char *)cases[k].seq,
                        "--batch_size", "2", "--max_steps", "1", "--chunk_size", (char *)cases[k].chunk, "--chunk_memory",
                        (char *)cases[k].mem, "--threads", "2", "--data_cache_dir", tmpdir, "--output_dir",
                        outdir, (char *)cases[k].flag};
        int argc = (int)(sizeof argv / sizeof argv[0]) - (cases[k].flag ? 0 : 1);
        double plan, peak = child_peak(argv, argc, &plan);
        char what[200];
        snprintf(what, sizeof what, "memory plan within 10%% of the measured peak: %s", cases[k].name);
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
    double full = flops_per_sequence(&m, 24);
    CHECK(fabs(full - (6 * N * T + 3 * attn)) < 1e-6 * full, "FLOPs: full fine-tuning = 6 N T + 3 x attention",
          "%.6g vs %.6g", full, 6 * N * T + 3 * attn);
    host_model_free(&m);
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

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/llama2tune_test_trainer_XXXXXX");
    if (!mkdtemp(tmpdir)) die("mkdtemp: %s", strerror(errno));
    test_merge();
    test_flops();
    test_sample_escaping();
    test_memory_plan();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    return test_summary();
}
