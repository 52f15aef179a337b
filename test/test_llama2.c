// The CPU trainer against Hugging Face transformers + peft.
// Fixtures: dev/reference/make_fixtures.py computes, in float64, the logits, the
// loss and the gradient of every trainable tensor for one step (2 micro-batches
// of 2 rows), and 10 AdamW steps, with LoRA (starting from an adapter peft saved)
// and full fine-tuning, for a GQA model (F32 file), a tied one (BF16 shards), and
// one per family: Llama-3's RoPE scaling with all three bands, tied, and head_dim
// not hidden_size / heads (tiny_llama3), linear RoPE scaling (tiny_linear), and
// CodeLlama's vocabulary of 32016 with rope_theta 1e6 (tiny_codellama). The
// newer fixtures store tensors with a vocabulary axis at some rows only
// (vocab_index, see vocab_rows).
//
// Tolerances: we compute in fp32 against an fp64 reference, so errors are
// rounding only: ~1e-7 per operation, grown by the depth of the model and the
// length of the sums. Loss: 1e-5 relative. Logits and gradients: the largest
// error over a tensor, relative to the tensor's largest magnitude, <= 1e-4 (a
// normwise measure: an elementwise one would be dominated by elements that are
// zero up to rounding). Ten optimizer steps: losses 1e-5 relative; final weights
// 1e-4 of the tensor's scale, since Adam's update m / sqrt(v) amplifies the
// rounding of tiny gradients by up to 1/sqrt(v) ~ 1/|g|.
#define TESTING
#include "../train_llama2.c"
#include "test_common.h"

static JsonValue read_json(const char *path) {
    JsonValue v;
    if (json_load_file(path, &v) != 0) exit(1);
    return v;
}

static double json_num(const JsonValue *obj, const char *key) {
    double d;
    if (json_get_number(obj, key, &d) != 0) die("fixture: missing number '%s'", key);
    return d;
}

// compares got with tensor `name` of the expected file: max |got - want| / max |want| <= tol
static void check_tensor(StFile *sf, const char *name, const float *got, size_t n, double tol, const char *what) {
    const StTensor *t = st_find(sf, name);
    char label[512];
    snprintf(label, sizeof label, "%s %s", what, name);
    if (!t || t->numel != n) { CHECK(0, label, "expected tensor missing or has %llu elements, we have %zu", t ? (unsigned long long)t->numel : 0ULL, n); return; }
    float *want = (float *)mallocCheck(n * sizeof(float));
    st_read_f32(sf, t, 0, n, want);
    double scale = 0, err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) { err = e; worst = i; }
    }
    double rel = err / fmax(scale, 1e-30);
    CHECK(rel <= tol, label, "max err %.3e = %.3e of max|ref| %.3e (tol %.0e); worst element %zu: %.8g vs %.8g",
          err, rel, scale, tol, worst, got[worst], want[worst]);
    free(want);
}

// The rows of a tensor with a vocabulary axis, got (outer, V, inner), that the fixture
// stores: those its vocab_index lists (dev/reference's vocab_rows: every k-th, the last
// and every token of the data), or all V when it has none. Returns them gathered into a
// new buffer (outer, K, inner) of *n floats.
static float *vocab_rows(StFile *sf, const float *got, size_t outer, int V, size_t inner, size_t *n) {
    const StTensor *t = st_find(sf, "vocab_index");
    size_t K = t ? (size_t)t->numel : (size_t)V;
    int *index = (int *)mallocCheck(K * sizeof(int));
    if (t && st_read_i32(sf, t, index) != 0) die("fixture: cannot read vocab_index");
    for (size_t k = 0; k < K; k++) {
        if (!t) index[k] = (int)k;
        if (index[k] < 0 || index[k] >= V) die("fixture: vocab_index %d outside the vocabulary (%d)", index[k], V);
    }
    float *out = (float *)mallocCheck(outer * K * inner * sizeof(float));
    for (size_t o = 0; o < outer; o++)
        for (size_t k = 0; k < K; k++)
            memcpy(out + (o * K + k) * inner, got + (o * V + index[k]) * inner, inner * sizeof(float));
    free(index);
    *n = outer * K * inner;
    return out;
}

// check_tensor for a weight, its gradient or its trained value: the embedding's and
// the head's at the rows the fixture stores (vocab_rows)
static void check_weight(StFile *sf, const char *name, const char *weight, const float *got, size_t n, const Config *c,
                         double tol, const char *what) {
    if (strcmp(weight, "model.embed_tokens.weight") != 0 && strcmp(weight, "lm_head.weight") != 0) {
        check_tensor(sf, name, got, n, tol, what);
        return;
    }
    size_t k;
    float *rows = vocab_rows(sf, got, 1, c->vocab_size, (size_t)c->dim, &k);
    check_tensor(sf, name, rows, k, tol, what);
    free(rows);
}

// |got - want| / max(|want|, floor) <= tol
static void check_rel(double got, double want, double floor_, double tol, const char *what) {
    double rel = fabs(got - want) / fmax(fabs(want), floor_);
    CHECK(rel <= tol, what, "%.10g vs reference %.10g (rel %.2e, tol %.0e)", got, want, rel, tol);
}

// TrainConfig for a fixture run, as the command line would give it
static void fixture_config(TrainConfig *tc, char **argv_store, const char *model, const JsonValue *hp, int full,
                           const char *outdir, const char *metrics, const char *const *extra) { // extra: NULL-terminated, or NULL
    static char buf[64][320];
    int n = 0;
#define ARG(...) (snprintf(buf[n], sizeof buf[n], __VA_ARGS__), argv_store[n] = buf[n], n++)
    ARG("train_llama2");
    ARG("--model"); ARG("test/fixtures/%s", model);
    ARG("--data"); ARG("test/fixtures/data.jsonl");
    ARG("--max_seq_len"); ARG("24");
    ARG("--batch_size"); ARG("2");
    ARG("--gradient_accumulation_steps"); ARG("2");
    ARG("--shuffle"); ARG("0");
    ARG("--lr"); ARG("%.17g", json_num(hp, "lr"));
    ARG("--weight_decay"); ARG("%.17g", json_num(hp, "weight_decay"));
    ARG("--adam_beta1"); ARG("%.17g", json_num(hp, "beta1"));
    ARG("--adam_beta2"); ARG("%.17g", json_num(hp, "beta2"));
    ARG("--adam_epsilon"); ARG("%.17g", json_num(hp, "eps"));
    ARG("--warmup_steps"); ARG("%d", (int)json_num(hp, "warmup_steps"));
    ARG("--grad_clip"); ARG("%.17g", json_num(hp, "grad_clip"));
    ARG("--max_steps"); ARG("%d", (int)json_num(hp, "max_steps"));
    const char *sched;
    if (json_get_string(hp, "lr_scheduler", &sched, NULL) != 0) die("fixture: lr_scheduler");
    ARG("--lr_scheduler"); ARG("%s", sched);
    ARG("--output_dir"); ARG("%s", outdir);
    ARG("--metrics_file"); ARG("%s", metrics);
    if (full) ARG("--full_finetune");
    else { ARG("--from_peft_checkpoint"); ARG("test/fixtures/%s/peft_init", model); }
    for (int i = 0; extra && extra[i]; i++) ARG("%s", extra[i]);
#undef ARG
    if (parse_args(tc, n, argv_store) != 0) die("fixture arguments rejected");
}

// the names and buffers of every trainable tensor: peft keys for LoRA, HF names for full
typedef struct { char name[200]; float *data; float *grad; size_t n; } Trainable;

static int list_trainables(Model *m, Trainable *out) {
    int n = 0;
    if (m->host.use_lora) {
        LoRA *l = &m->host.lora;
        for (int i = 0; i < l->n_layers; i++)
            for (int t = 0; t < LORA_N_TARGETS; t++) {
                if (!(l->targets & (1u << t))) continue;
                for (int ab = 0; ab < 2; ab++, n++) {
                    lora_key(out[n].name, sizeof out[n].name, i, t, ab ? 'B' : 'A');
                    out[n].data = ab ? lora_B(l, l->params, i, t) : lora_A(l, l->params, i, t);
                    out[n].grad = ab ? lora_B(l, l->grads, i, t) : lora_A(l, l->grads, i, t);
                    out[n].n = (size_t)l->r * (ab ? l->out[t] : l->in[t]);
                }
            }
        return n;
    }
    Config *c = &m->host.config;
    float *w[NUM_PARAM_TENSORS], *g[NUM_PARAM_TENSORS];
    param_tensors(&m->host.w, w);
    param_tensors(&m->g, g);
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        if (p == P_HEAD && c->tied) continue;
        int64_t rows, cols;
        param_shape(c, p, &rows, &cols);
        for (int l = 0; l < (param_per_layer(p) ? c->n_layers : 1); l++, n++) {
            param_name(p, l, out[n].name, sizeof out[n].name);
            out[n].n = (size_t)(rows * cols);
            out[n].data = w[p] + (size_t)l * out[n].n;
            out[n].grad = g[p] + (size_t)l * out[n].n;
        }
    }
    return n;
}

static void test_model(const char *model, int full) {
    char path[600], what[256], outdir[256], metrics[300];
    const char *mode = full ? "full" : "lora";
    snprintf(path, sizeof path, "test/fixtures/%s/ref/expected.json", model);
    JsonValue exp = read_json(path);
    const JsonValue *ref = json_get(&exp, mode), *hp = json_get(json_get(&exp, "train"), mode);
    snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_%s_%s", (int)getpid(), model, mode);
    snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
    TrainConfig tc;
    char *argv[64];
    fixture_config(&tc, argv, model, hp, full, outdir, metrics, NULL);

    // the data path: our tokenizer + dataloader must give the reference's step-0 batches
    Tokenizer tok;
    snprintf(path, sizeof path, "test/fixtures/%s/tokenizer.model", model);
    if (tokenizer_load(&tok, path) != 0) die("cannot load %s", path);
    Dataset ds;
    DataOptions dopt = {.max_seq_len = tc.max_seq_len, .quiet = 1};
    snprintf(path, sizeof path, "test/fixtures/%s/tokenizer.model", model);
    if (dataset_load(&ds, tc.data, &tok, path, &dopt) != 0) die("cannot load data");
    DataLoader dl;
    dataloader_init(&dl, &ds, 0, 0, 0, 1);
    snprintf(path, sizeof path, "test/fixtures/%s/ref/batch.safetensors", model);
    StFile bf;
    if (st_open(&bf, path) != 0) die("cannot open %s", path);
    int B = 2, Ts[2], T = 24;
    int *tokens = (int *)mallocCheck(2 * B * T * sizeof(int)), *targets = (int *)mallocCheck(2 * B * T * sizeof(int));
    long labels = 0;
    for (int g = 0; g < 2; g++) {
        labels += dataloader_next_batch(&dl, B, tok.eos_id, tokens + g * B * T, targets + g * B * T, &Ts[g]);
        char name[32];
        int *want = (int *)mallocCheck(B * T * sizeof(int));
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, k ? "targets_%d" : "tokens_%d", g);
            const StTensor *t = st_find(&bf, name);
            int same = t && t->ndim == 2 && t->shape[0] == B && t->shape[1] == Ts[g] && st_read_i32(&bf, t, want) == 0 &&
                       memcmp(want, (k ? targets : tokens) + g * B * T, (size_t)B * Ts[g] * sizeof(int)) == 0;
            snprintf(what, sizeof what, "%s %s: dataloader %s equal the reference", model, mode, name);
            CHECK(same, what, "tokenization, truncation, padding or label shift differs (T = %d)", Ts[g]);
        }
        free(want);
    }
    st_close(&bf);
    dataloader_free(&dl);
    dataset_free(&ds);
    tokenizer_free(&tok);

    // one forward/backward over the step's two micro-batches
    Model m;
    if (model_setup(&m, NULL, &tc, B, T, NULL) != 0) die("model setup failed for %s", model);
    StFile ef;
    snprintf(path, sizeof path, "test/fixtures/%s/ref/expected.safetensors", model);
    if (st_open(&ef, path) != 0) die("cannot open %s", path);
    int V = m.host.config.vocab_size;
    float *logits = (float *)mallocCheck((size_t)B * Ts[0] * V * sizeof(float));
    Trainable *tr = (Trainable *)mallocCheck(4096 * sizeof(Trainable));
    int ntr = list_trainables(&m, tr);
    for (int i = 0; i < ntr; i++) memset(tr[i].grad, 0, tr[i].n * sizeof(float));
    double loss = 0;
    for (int g = 0; g < 2; g++)
        loss += model_forward_backward(&m, tokens + g * B * T, targets + g * B * T, B, Ts[g], 1.0f / labels);
    model_forward(&m, tokens, targets, B, Ts[0], logits);
    snprintf(what, sizeof what, "%s %s logits", model, mode);
    snprintf(path, sizeof path, "%s.logits", mode);
    size_t nl;
    float *stored = vocab_rows(&ef, logits, (size_t)B * Ts[0], V, 1, &nl);
    check_tensor(&ef, path, stored, nl, 1e-4, what);
    free(stored);
    snprintf(what, sizeof what, "%s %s loss", model, mode);
    check_rel(loss / labels, json_num(ref, "loss"), 0, 1e-5, what);
    snprintf(what, sizeof what, "%s %s grad", model, mode);
    for (int i = 0; i < ntr; i++) {
        snprintf(path, sizeof path, "%s.grad.%s", mode, tr[i].name);
        check_weight(&ef, path, tr[i].name, tr[i].grad, tr[i].n, &m.host.config, 1e-4, what);
    }
    Config config = m.host.config;
    model_free(&m);

    // ten optimizer steps through the real training loop, then the saved weights
    int rc = train(&tc);
    snprintf(what, sizeof what, "%s %s: train() exits 0", model, mode);
    CHECK(rc == 0, what, "exit code %d", rc);
    size_t mlen;
    char *mtext = read_file(metrics, &mlen);
    const JsonValue *steps = json_get(ref, "steps");
    int line = 0;
    for (char *p = mtext, *e; p && *p && line < steps->count; p = e + 1, line++) {
        e = strchr(p, '\n');
        if (!e) break;
        JsonValue rec;
        char err[128];
        if (json_parse(p, e - p, &rec, err, sizeof err) != 0) die("%s: %s", metrics, err);
        const JsonValue *s = &steps->items[line];
        snprintf(what, sizeof what, "%s %s step %d loss", model, mode, line + 1);
        check_rel(json_num(&rec, "loss"), json_num(s, "loss"), 0, 1e-5, what);
        snprintf(what, sizeof what, "%s %s step %d lr", model, mode, line + 1);
        check_rel(json_num(&rec, "lr"), json_num(s, "lr"), json_num(hp, "lr"), 1e-6, what); // lr is 0 at step 1
        snprintf(what, sizeof what, "%s %s step %d grad_norm", model, mode, line + 1);
        check_rel(json_num(&rec, "grad_norm"), json_num(s, "grad_norm"), 0, 1e-4, what);
        json_free(&rec);
    }
    snprintf(what, sizeof what, "%s %s: metrics has every step", model, mode);
    CHECK(line == steps->count, what, "%d of %d steps", line, steps->count);
    free(mtext);
    snprintf(path, sizeof path, full ? "%s/model.safetensors" : "%s/adapter_model.safetensors", outdir);
    StFile of;
    if (st_open(&of, path) != 0) die("cannot open %s", path);
    snprintf(what, sizeof what, "%s %s after 10 steps", model, mode);
    for (int i = 0; i < of.n_tensors; i++) {
        const StTensor *t = &of.tensors[i];
        float *got = (float *)mallocCheck(t->numel * sizeof(float));
        st_read_f32(&of, t, 0, t->numel, got);
        snprintf(path, sizeof path, "%s.final.%s", mode, t->name);
        check_weight(&ef, path, t->name, got, t->numel, &config, 1e-4, what);
        free(got);
    }
    snprintf(what, sizeof what, "%s %s: saved every trainable tensor", model, mode);
    CHECK(of.n_tensors == ntr, what, "%d tensors saved, %d trainable", of.n_tensors, ntr);
    st_close(&of);
    st_close(&ef);
    free(logits); free(tr); free(tokens); free(targets);
    json_free(&exp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", outdir, metrics);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", outdir);
}

// LoRA dropout has no reference (peft draws its masks from torch's RNG), so its
// gradient is checked against central finite differences of our own loss with
// the same mask. fp32 loss rounding (~1e-6 relative on ~6.6) over a step of
// 2 * 1e-2 gives ~5e-4 absolute noise in the difference quotient, so the check
// takes the 5 largest gradient elements of each of a few tensors (|g| >> 5e-4)
// and allows 2e-2 relative: a wrong mask in the backward is off by O(1).
static void test_dropout(void) {
    TrainConfig tc;
    char *argv[] = {"x", "--model", "test/fixtures/tiny_gqa", "--data", "test/fixtures/data.jsonl", "--lora_r", "4",
                    "--lora_dropout", "0.3", "--lora_target_modules", "all-linear", "--max_seq_len", "24"};
    if (parse_args(&tc, sizeof argv / sizeof argv[0], argv) != 0) die("dropout test arguments");
    Tokenizer tok;
    Dataset ds;
    DataLoader dl;
    if (tokenizer_load(&tok, "test/fixtures/tiny_gqa/tokenizer.model") != 0 ||
        dataset_load(&ds, tc.data, &tok, "test/fixtures/tiny_gqa/tokenizer.model", &(DataOptions){.max_seq_len = 24, .quiet = 1}) != 0)
        die("dropout test data");
    dataloader_init(&dl, &ds, 0, 0, 0, 1);
    int B = 2, T, tokens[48], targets[48];
    long labels = dataloader_next_batch(&dl, B, tok.eos_id, tokens, targets, &T);
    Model m;
    if (model_setup(&m, NULL, &tc, B, 24, NULL) != 0) die("dropout test model");
    uint64_t state = 7;
    for (int i = 0; i < m.host.lora.n_layers; i++) // B = 0 would give A no gradient
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            float *b = lora_B(&m.host.lora, m.host.lora.params, i, t);
            for (int k = 0; k < m.host.lora.r * m.host.lora.out[t]; k++) b[k] = 0.1f * (rng_uniform(&state) - 0.5f);
        }
    m.dropout_key = 12345;
    float scale = 1.0f / labels;
    memset(m.host.lora.grads, 0, m.host.lora.num_params * sizeof(float));
    double loss = model_forward_backward(&m, tokens, targets, B, T, scale) * scale;
    double again = model_forward(&m, tokens, targets, B, T, NULL) * scale;
    CHECK(loss == again, "dropout: the same key gives the same mask", "%.9g vs %.9g", loss, again);
    m.host.lora.training = 0;
    double nodrop = model_forward(&m, tokens, targets, B, T, NULL) * scale;
    m.host.lora.training = 1;
    CHECK(fabs(nodrop - loss) > 1e-4, "dropout: changes the training loss, not evaluation", "%.9g vs %.9g without", loss, nodrop);
    int checks[4][2] = {{0, LORA_Q}, {1, LORA_V}, {0, LORA_DOWN}, {1, LORA_GATE}};
    double worst = 0;
    for (int c = 0; c < 4; c++)
        for (int ab = 0; ab < 2; ab++) {
            int layer = checks[c][0], t = checks[c][1];
            float *p = ab ? lora_B(&m.host.lora, m.host.lora.params, layer, t) : lora_A(&m.host.lora, m.host.lora.params, layer, t);
            float *g = ab ? lora_B(&m.host.lora, m.host.lora.grads, layer, t) : lora_A(&m.host.lora, m.host.lora.grads, layer, t);
            int n = m.host.lora.r * (ab ? m.host.lora.out[t] : m.host.lora.in[t]);
            for (int pick = 0; pick < 5; pick++) {
                int best = 0; // the largest |g| not yet checked (checked ones are marked NaN)
                for (int k = 0; k < n; k++) if (!isnan(g[k]) && (isnan(g[best]) || fabsf(g[k]) > fabsf(g[best]))) best = k;
                float saved = p[best], eps = 1e-2f;
                p[best] = saved + eps;
                double lp = model_forward(&m, tokens, targets, B, T, NULL) * scale;
                p[best] = saved - eps;
                double lm = model_forward(&m, tokens, targets, B, T, NULL) * scale;
                p[best] = saved;
                double fd = (lp - lm) / (2 * eps), rel = fabs(fd - g[best]) / fabs(g[best]);
                if (rel > worst) worst = rel;
                g[best] = NAN;
            }
        }
    CHECK(worst <= 2e-2, "dropout: LoRA gradients match finite differences", "worst relative error %.3e", worst);
    model_free(&m);
    dataloader_free(&dl);
    dataset_free(&ds);
    tokenizer_free(&tok);
}

// Dynamic loss scaling (--loss_scale dynamic) against torch.amp.GradScaler("cpu")
// (dev/reference/make_grad_scaler_fixtures.py): tiny_gqa's LoRA run of test_model
// with NaN gradients at steps 3 and 4 (LLAMA2TUNE_FAULT=nan:3-4). Per step, the
// scale it ran with and whether it was skipped exactly; the loss, the lr (the
// schedule moves on over skipped steps, as torch's scheduler.step() every
// iteration) and the norm to test_model's tolerances; the final adapter to 1e-4
// as there (a skipped step that touched the weights, the moments or AdamW's t
// would be off by ~1e-2). Then resumed from its step-5 checkpoint, whose
// trainer_state holds the scale (16384) and growth tracker (1): the same metrics
// from step 6 on and the same adapter, bit for bit.
static int check_scaler_metrics(const char *metrics, const JsonValue *steps, const JsonValue *hp, const char *what0) {
    size_t mlen;
    char *mtext = read_file(metrics, &mlen), what[256];
    int line = 0;
    for (char *p = mtext, *e; p && *p && line < steps->count; p = e + 1, line++) {
        if (!(e = strchr(p, '\n'))) break;
        JsonValue rec;
        char err[128];
        if (json_parse(p, e - p, &rec, err, sizeof err) != 0) die("%s: %s", metrics, err);
        const JsonValue *s = &steps->items[line];
        int skipped = (int)json_num(s, "skipped");
        double scale = json_get(&rec, "loss_scale") ? json_num(&rec, "loss_scale") : -1;
        snprintf(what, sizeof what, "%s step %d: loss scale and skipped as GradScaler's", what0, line + 1);
        CHECK(scale == json_num(s, "loss_scale") && (int)json_num(&rec, "skipped") == skipped, what,
              "scale %g (torch %g), skipped %d (torch %d)", scale, json_num(s, "loss_scale"), (int)json_num(&rec, "skipped"), skipped);
        snprintf(what, sizeof what, "%s step %d loss", what0, line + 1);
        check_rel(json_num(&rec, "loss"), json_num(s, "loss"), 0, 1e-5, what);
        snprintf(what, sizeof what, "%s step %d lr", what0, line + 1);
        check_rel(json_num(&rec, "lr"), json_num(s, "lr"), json_num(hp, "lr"), 1e-6, what);
        if (!skipped) {
            snprintf(what, sizeof what, "%s step %d grad_norm", what0, line + 1);
            check_rel(json_num(&rec, "grad_norm"), json_num(s, "grad_norm"), 0, 1e-4, what);
        }
        json_free(&rec);
    }
    free(mtext);
    return line;
}

static void test_grad_scaler(void) {
    char path[600], outdir[256], metrics[300], ckpt[320];
    JsonValue exp = read_json("test/fixtures/grad_scaler/expected.json");
    const JsonValue *ref = json_get(&exp, "train"), *hp = json_get(ref, "hparams"), *steps = json_get(ref, "steps");
    snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_grad_scaler", (int)getpid());
    snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint-5", outdir);
    TrainConfig tc;
    char *argv[64];
    const char *extra[] = {"--loss_scale", "dynamic", "--save_every", "5", "--max_bad_steps", "2", NULL}; // 2 skips in a row: not bad steps
    fixture_config(&tc, argv, "tiny_gqa", hp, 0, outdir, metrics, extra);
    setenv("LLAMA2TUNE_FAULT", "nan:3-4", 1);
    int rc = train(&tc);
    CHECK(rc == 0, "grad scaler: train() exits 0 (overflow skips are not bad steps)", "exit code %d", rc);
    int line = check_scaler_metrics(metrics, steps, hp, "grad scaler");
    CHECK(line == steps->count, "grad scaler: metrics has every step", "%d of %d steps", line, steps->count);
    StFile ef, of;
    if (st_open(&ef, "test/fixtures/grad_scaler/final.safetensors") != 0) die("cannot open the grad scaler fixture");
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", outdir);
    if (st_open(&of, path) != 0) die("cannot open %s", path);
    size_t n = 0;
    for (int i = 0; i < of.n_tensors; i++) n += of.tensors[i].numel;
    float *first = (float *)mallocCheck(n * sizeof(float)), *w = first;
    for (int i = 0; i < of.n_tensors; i++) {
        const StTensor *t = &of.tensors[i];
        st_read_f32(&of, t, 0, t->numel, w);
        check_tensor(&ef, t->name, w, t->numel, 1e-4, "grad scaler: after 10 steps");
        w += t->numel;
    }
    CHECK(of.n_tensors == ef.n_tensors, "grad scaler: saved every trainable tensor", "%d of %d", of.n_tensors, ef.n_tensors);
    st_close(&of);
    st_close(&ef);

    // the scale in the step-5 checkpoint, and a resume from it
    snprintf(path, sizeof path, "%s/trainer_state.json", ckpt);
    JsonValue st = read_json(path);
    double saved_scale = -1, saved_tracker = -1;
    json_get_number(&st, "loss_scale", &saved_scale);
    json_get_number(&st, "loss_scale_growth_tracker", &saved_tracker);
    CHECK(saved_scale == 16384 && saved_tracker == 1, "grad scaler: checkpoint-5 holds the scale and the growth tracker",
          "%g and %g (16384 and 1; -1: missing)", saved_scale, saved_tracker);
    json_free(&st);
    const char *resume[] = {"--loss_scale", "dynamic", "--save_every", "5", "--resume", ckpt, NULL};
    fixture_config(&tc, argv, "tiny_gqa", hp, 0, outdir, metrics, resume);
    rc = train(&tc);
    unsetenv("LLAMA2TUNE_FAULT");
    CHECK(rc == 0, "grad scaler: resumed from checkpoint-5", "exit code %d", rc);
    line = check_scaler_metrics(metrics, steps, hp, "grad scaler resumed");
    CHECK(line == steps->count, "grad scaler resumed: metrics has every step", "%d of %d steps", line, steps->count);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", outdir);
    if (st_open(&of, path) != 0) die("cannot open %s", path);
    int same = 1;
    w = first;
    for (int i = 0; i < of.n_tensors; i++) {
        const StTensor *t = &of.tensors[i];
        float *again = (float *)mallocCheck(t->numel * sizeof(float));
        st_read_f32(&of, t, 0, t->numel, again);
        same &= memcmp(again, w, t->numel * sizeof(float)) == 0;
        w += t->numel;
        free(again);
    }
    CHECK(same, "grad scaler: the resumed run's adapter is bit-identical", "it differs");
    st_close(&of);
    free(first);
    json_free(&exp);
    snprintf(path, sizeof path, "rm -rf '%s' '%s'", outdir, metrics);
    if (system(path) != 0) fprintf(stderr, "warning: could not remove %s\n", outdir);
}

int main(void) {
    test_grad_scaler();
    test_dropout();
    const char *models[] = {"tiny_gqa", "tiny_tied", "tiny_llama3", "tiny_linear", "tiny_codellama", "tiny_mistral"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        for (int full = 0; full < 2; full++) test_model(models[i], full);
    return test_summary();
}
