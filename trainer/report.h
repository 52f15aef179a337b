// trainer/report.h: what a run reports: the validation loss (evaluation, LoRA dropout off),
// each step's line with its speed, --metrics_file's JSON records and --tensorboard_dir's
// events, and the peak memory at the end.
#ifndef TRAINER_REPORT_H
#define TRAINER_REPORT_H

// mean cross-entropy over every label token of a dataset, in file order
static double evaluate(Model *m, const Dataset *ds, int B, int pad_id) {
    int *tokens = (int *)mallocCheck((size_t)B * m->T * sizeof(int)), *targets = (int *)mallocCheck((size_t)B * m->T * sizeof(int));
    double loss = 0;
    long count = 0;
    m->host.lora.training = 0;
    for (long r = 0; r < ds->n_rows; r += B) {
        int rows = ds->n_rows - r < B ? (int)(ds->n_rows - r) : B, T;
        count += dataset_get_rows(ds, r, rows, pad_id, tokens, targets, &T);
        loss += model_forward(m, tokens, targets, rows, T, NULL);
    }
    m->host.lora.training = 1;
    free(tokens); free(targets);
    return count ? loss / count : 0.0;
}

// preference tuning's metrics (n: preference_metric_count): " | name value" on a step's line, or
// in JSON ', "name": value' into a metrics record, each name after prefix
static void preference_metrics_text(FILE *out, const double *pm, int n, const char *prefix, int json) {
    for (int k = 0; k < n; k++)
        fprintf(out, json ? ", \"%s%s\": %.9g" : " | %s%s %.4f", prefix, preference_metric_names[k], pm[k]);
}
// and as TensorBoard's scalars, each name after prefix ("train/", "eval/"); -1 when the file cannot be written
static int preference_metrics_tb(TbWriter *tb, int step, const double *pm, int n, const char *prefix) {
    char tags[PM_N][48];
    const char *tag[PM_N];
    float v[PM_N];
    for (int k = 0; k < n; k++) {
        snprintf(tags[k], sizeof tags[k], "%s%s", prefix, preference_metric_names[k]);
        tag[k] = tags[k], v[k] = (float)pm[k];
    }
    return tb_scalars(tb, step, tag, v, n);
}

// the validation loss (SFT: the mean cross-entropy, and its perplexity; preference tuning: the
// pairs' loss and metrics, trainer/preference.h) on stdout, into the metrics file and TensorBoard
static void report_eval(const TrainConfig *tc, Model *m, const Dataset *ds, int B, int pad_id, int step, FILE *metrics, TbWriter *tb) {
    double pm[PM_N] = {0}, vl; // (set only where the backend runs preference tuning)
    int pairs = preference(tc), n = preference_metric_count(tc);
#ifdef BACKEND_PREFERENCE
    if (pairs) vl = preference_evaluate(m, tc, ds, B, pad_id, pm);
    else
#endif
    vl = evaluate(m, ds, B, pad_id);
    printf("step %d | val loss %.6f", step, vl);
    if (pairs) preference_metrics_text(stdout, pm, n, "val ", 0);
    else printf(" | val ppl %.4f", exp(vl));
    printf("\n");
    if (metrics) {
        fprintf(metrics, "{\"step\": %d, \"val_loss\": %.9g", step, vl);
        if (pairs) preference_metrics_text(metrics, pm, n, "eval/", 1);
        else fprintf(metrics, ", \"val_ppl\": %.9g", exp(vl));
        fprintf(metrics, "}\n");
        fflush(metrics);
    }
    const char *tag = "eval/loss";
    float v = (float)vl;
    if (tb->f && (tb_scalars(tb, step, &tag, &v, 1) != 0 || (pairs && preference_metrics_tb(tb, step, pm, n, "eval/") != 0)))
        fprintf(stderr, "warning: cannot write %s: %s\n", tb->path, strerror(errno));
}

// on resume the metrics file keeps only its records up to the checkpoint's step
// (a killed run may have logged steps after its last checkpoint)
static int metrics_truncate(const char *path, int step) {
    size_t len, kept = 0;
    char *text = read_file(path, &len);
    if (!text) return errno == ENOENT ? 0 : -1;
    for (size_t pos = 0; pos < len;) {
        char *nl = (char *)memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) + 1 : len;
        JsonValue rec;
        long long s;
        char err[8];
        if (json_parse(text + pos, end - pos, &rec, err, sizeof err) == 0) {
            if (json_get_int(&rec, "step", &s) == 0 && s <= step) {
                memmove(text + kept, text + pos, end - pos);
                kept += end - pos;
            }
            json_free(&rec);
        }
        pos = end;
    }
    int rc = write_bytes_atomic(path, text, kept);
    free(text);
    return rc;
}

// a value for the metrics file: JSON has no NaN or infinity, so those are null
static const char *metrics_num(char *buf, size_t n, double v) {
    if (isfinite(v)) snprintf(buf, n, "%.9g", v);
    else snprintf(buf, n, "null");
    return buf;
}
static int metrics_error(const char *path) {
    fprintf(stderr, "error: --metrics_file '%s': writing failed: %s (the checkpoints are intact)\n", path, strerror(errno));
    return 1;
}

// --tensorboard_dir: a new event file (a resumed run's too: TensorBoard reads every file of the
// folder, and a step written again replaces the earlier one's points) with the configuration
static int tensorboard_begin(TrainConfig *tc, TbWriter *tb, int step) {
    static char text[16384];
    config_markdown(tc, text, sizeof text);
    if (mkdir_p(tc->tensorboard_dir) == 0 && tb_open(tb, tc->tensorboard_dir) == 0 && tb_text(tb, step, "config", text) == 0) return 0;
    fprintf(stderr, "error: --tensorboard_dir '%s': cannot write %s: %s\n", tc->tensorboard_dir, tb->f ? tb->path : "an event file",
            strerror(errno));
    return -1;
}

// one optimizer step as train_step returns it, and its time
typedef struct {
    double loss, norm, ms;
    double cpu_ms; // the process's CPU time over the step, every thread's (ms x threads when all are busy)
    long n_tokens; // every rank's
    float lr;
    int skipped;   // NaN or infinite loss or norm: no update
    float loss_scale; // the loss scale the step ran with (1: none)
    double pm[PM_N];  // preference tuning's metrics (preference_step)
} StepStats;

// The step's line on stdout and, with --metrics_file (rank 0), its JSON record, with
// the speed: tokens/s, model TFLOP/s and MFU (against --peak_tflops). 1 when the
// metrics file could not be written.
static int report_step(const TrainConfig *tc, Trainer *r, const TrainState *ts, int total, const StepStats *s, double eta_s) {
    Model *m = &r->m;
    int W = r->fsdp.world.size;
    double flops = 0;
    for (int g = 0; g < tc->grad_accum; g++) flops += (double)batch_rows(tc) * fsdp_data_size(&r->fsdp) * flops_per_sequence(&m->host, r->Ts[g], m->s2_attn);
    double tflops = flops / (s->ms * 1e9), mfu = tc->peak_tflops > 0 ? tflops / (tc->peak_tflops * W) : -1;
    int pairs = preference(tc), n = preference_metric_count(tc);
    printf("step %d/%d | loss %.6f | lr %.3e | grad norm %.4f", ts->step, total, s->loss, s->lr, s->norm);
    if (pairs) preference_metrics_text(stdout, s->pm, n, "", 0);
    printf(" | %.1f ms | %.0f tok/s | %.3f TFLOP/s", s->ms, s->n_tokens / (s->ms / 1e3), tflops);
    if (mfu >= 0) printf(" | MFU %.1f%%", 100 * mfu);
    if (ts->ls.on) printf(" | loss scale %g", s->loss_scale);
    if (s->skipped) printf(" | skipped: NaN or inf loss or grad norm (%d skipped so far)", ts->step - ts->opt_t);
    printf(" | %.0f MiB | ETA %dm%02ds\n", model_peak_mb(m), (int)(eta_s / 60), (int)eta_s % 60);
    if (r->tb.f) { // Hugging Face Trainer's names where it has them
        const char *tags[] = {"train/loss", "train/learning_rate", "train/grad_norm", "train/tokens_per_second",
                              "train/peak_memory_mib", "train/mfu"};
        float v[] = {(float)s->loss, s->lr, (float)s->norm, (float)(s->n_tokens / (s->ms / 1e3)), (float)model_peak_mb(m), (float)mfu};
        if (tb_scalars(&r->tb, ts->step, tags, v, mfu >= 0 ? 6 : 5) != 0 || (pairs && preference_metrics_tb(&r->tb, ts->step, s->pm, n, "train/") != 0)) {
            fprintf(stderr, "error: --tensorboard_dir: cannot write %s: %s (the checkpoints are intact)\n", r->tb.path, strerror(errno));
            return 1;
        }
    }
    FILE *metrics = r->metrics;
    if (!metrics) return 0;
    char lb[32], nb[32];
    fprintf(metrics, "{\"step\": %d, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"tokens\": %ld, \"skipped\": %d, "
            "\"skipped_total\": %d", ts->step, metrics_num(lb, sizeof lb, s->loss), s->lr, metrics_num(nb, sizeof nb, s->norm),
            s->n_tokens, s->skipped, ts->step - ts->opt_t);
    if (pairs) preference_metrics_text(metrics, s->pm, n, "", 1); // (before the times, which dev/same_outputs.sh leaves out)
    fprintf(metrics, ", \"ms\": %.3f, \"cpu_ms\": %.3f, \"tok_per_s\": %.3f, \"tflops\": %.6g, ", s->ms, s->cpu_ms,
            s->n_tokens / (s->ms / 1e3), tflops);
    if (mfu >= 0) fprintf(metrics, "\"mfu\": %.6g, ", mfu);
    if (ts->ls.on) fprintf(metrics, "\"loss_scale\": %.9g, ", s->loss_scale);
    fprintf(metrics, "\"mem_mb\": %.1f, \"act_mb\": %.3f, \"carry_mb\": %.3f}\n", model_peak_mb(m), m->act_bytes / 1048576.0,
            m->carry_bytes / 1048576.0);
    return (fflush(metrics) != 0 || ferror(metrics)) && metrics_error(tc->metrics_file);
}

// the peak memory of the run, and with several ranks every rank's (collective)
static void print_peak_memory(Trainer *r) {
    Model *m = &r->m;
    int W = r->fsdp.world.size;
    printf("peak %s %.1f MiB (activations %.1f MiB, carry %.1f MiB)", backend_memory, model_peak_mb(m), m->act_bytes / 1048576.0,
           m->carry_bytes / 1048576.0);
    float peak = (float)model_peak_mb(m), *peaks = (float *)mallocCheck((size_t)W * sizeof(float));
    fsdp_all_gather(&r->fsdp.world, peaks, &peak, 1);
    for (int i = 0; W > 1 && i < W; i++) printf("%s%.0f", i ? " " : "; per rank, MiB: ", peaks[i]);
    printf("\n");
    free(peaks);
}

#endif
