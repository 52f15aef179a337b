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
//
// SGD (dev/reference/make_sgd_fixtures.py): 10 torch.optim.SGD steps on tiny_gqa,
// LoRA and full fine-tuning, with momentum 0.9, Nesterov momentum 0.9 and none,
// weight decay 0.1, the same schedule and clipping, checked with the same
// tolerances: SGD's update lr * (g + wd * p) (through the momentum buffer) is
// linear in the gradient, so it carries the gradients' rounding over without
// amplifying it, and AdamW's bounds hold with room (measured: losses 3e-7, gradient
// norms 2e-6, weights 5e-6). Dropping the Nesterov term fails the Nesterov runs,
// dropping the weight decay every run.
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
static void fixture_config(TrainConfig *tc, char **argv_store, const char *model, const JsonValue *hp,
                           const char *adapter, const char *outdir, const char *metrics,
                           const char *const *extra) { // extra: NULL-terminated, or NULL
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
    const char *optimizer;
    int nesterov;
    if (json_get_string(hp, "optimizer", &optimizer, NULL) == 0) { ARG("--optimizer"); ARG("%s", optimizer); } // (AdamW's fixtures name none)
    if (json_get_string(hp, "optimizer", &optimizer, NULL) == 0 && !strcmp(optimizer, "sgd")) { // SGD's settings
        if (json_get_bool(hp, "nesterov", &nesterov) != 0) die("fixture: nesterov");
        ARG("--momentum"); ARG("%.17g", json_num(hp, "momentum"));
        ARG("--nesterov"); ARG("%d", nesterov);
    } else {
        ARG("--adam_beta1"); ARG("%.17g", json_num(hp, "beta1"));
        ARG("--adam_beta2"); ARG("%.17g", json_num(hp, "beta2"));
        ARG("--adam_epsilon"); ARG("%.17g", json_num(hp, "eps"));
    }
    ARG("--warmup_steps"); ARG("%d", (int)json_num(hp, "warmup_steps"));
    ARG("--grad_clip"); ARG("%.17g", json_num(hp, "grad_clip"));
    ARG("--max_steps"); ARG("%d", (int)json_num(hp, "max_steps"));
    const char *sched;
    if (json_get_string(hp, "lr_scheduler", &sched, NULL) != 0) die("fixture: lr_scheduler");
    ARG("--lr_scheduler"); ARG("%s", sched);
    ARG("--output_dir"); ARG("%s", outdir);
    ARG("--metrics_file"); ARG("%s", metrics);
    if (!adapter) ARG("--full_finetune");
    else { ARG("--from_peft_checkpoint"); ARG("test/fixtures/%s/%s", model, adapter); }
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
                if (!lora_trains(l, i, t)) continue;
                for (int k = 0; k < lora_n_kinds(l); k++, n++) { // A, B (and DoRA's magnitude)
                    lora_key(l, out[n].name, sizeof out[n].name, i, t, k);
                    out[n].data = lora_tensor(l, l->params, i, t, k);
                    out[n].grad = lora_tensor(l, l->grads, i, t, k);
                    out[n].n = lora_tensor_numel(l, t, k);
                }
            }
        for (int k = 0; k < lora_n_saved(l); k++) { // --trainable_params' (peft's modules_to_save)
            int64_t numel;
            if (!(out[n].data = lora_saved(l, l->params, k, &numel))) continue;
            lora_saved_key(l->n_layers, k, out[n].name, sizeof out[n].name);
            out[n].grad = lora_saved(l, l->grads, k, NULL);
            out[n++].n = (size_t)numel;
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

// a fixture run's metrics file against the reference's steps: loss, lr and gradient norm of each
static void check_steps_within(const char *metrics, const JsonValue *steps, const JsonValue *hp, const char *label,
                               double loss_tol, double norm_tol) {
    char what[300];
    size_t mlen;
    char *mtext = read_file(metrics, &mlen);
    int line = 0;
    for (char *p = mtext, *e; p && *p && line < steps->count; p = e + 1, line++) {
        e = strchr(p, '\n');
        if (!e) break;
        JsonValue rec;
        char err[128];
        if (json_parse(p, e - p, &rec, err, sizeof err) != 0) die("%s: %s", metrics, err);
        const JsonValue *s = &steps->items[line];
        snprintf(what, sizeof what, "%s step %d loss", label, line + 1);
        check_rel(json_num(&rec, "loss"), json_num(s, "loss"), 0, loss_tol, what);
        snprintf(what, sizeof what, "%s step %d lr", label, line + 1);
        check_rel(json_num(&rec, "lr"), json_num(s, "lr"), json_num(hp, "lr"), 1e-6, what); // lr is 0 at step 1
        snprintf(what, sizeof what, "%s step %d grad_norm", label, line + 1);
        check_rel(json_num(&rec, "grad_norm"), json_num(s, "grad_norm"), 0, norm_tol, what);
        json_free(&rec);
    }
    snprintf(what, sizeof what, "%s: metrics has every step", label);
    CHECK(line == steps->count, what, "%d of %d steps", line, steps->count);
    free(mtext);
}
// each step's loss to 1e-5 and gradient norm to 1e-4, relative: fp32 against float64
static void check_steps(const char *metrics, const JsonValue *steps, const JsonValue *hp, const char *label) {
    check_steps_within(metrics, steps, hp, label, 1e-5, 1e-4);
}

// Ten optimizer steps of tc's run through the real training loop: each step's
// loss, lr and gradient norm in the metrics against the reference's steps, then
// every saved trainable tensor against ef's "<prefix>.final.<name>" (ntr of them).
// what names the run in the checks; outdir and metrics are removed afterwards.
static void check_training(TrainConfig *tc, const char *what, const JsonValue *steps, const JsonValue *hp, StFile *ef,
                           const char *prefix, const Config *config, int ntr, const char *outdir, const char *metrics,
                           double weight_tol) {
    char label[320], path[600];
    int rc = train(tc);
    snprintf(label, sizeof label, "%s: train() exits 0", what);
    CHECK(rc == 0, label, "exit code %d", rc);
    check_steps(metrics, steps, hp, what);
    snprintf(path, sizeof path, tc->full_finetune ? "%s/model.safetensors" : "%s/adapter_model.safetensors", outdir);
    StFile of;
    if (st_open(&of, path) != 0) die("cannot open %s", path);
    snprintf(label, sizeof label, "%s after 10 steps", what);
    for (int i = 0; i < of.n_tensors; i++) {
        const StTensor *t = &of.tensors[i];
        float *got = (float *)mallocCheck(t->numel * sizeof(float));
        st_read_f32(&of, t, 0, t->numel, got);
        snprintf(path, sizeof path, "%s.final.%s", prefix, t->name);
        check_weight(ef, path, t->name, got, t->numel, config, weight_tol, label);
        free(got);
    }
    snprintf(label, sizeof label, "%s: saved every trainable tensor", what);
    CHECK(of.n_tensors == ntr, label, "%d tensors saved, %d trainable", of.n_tensors, ntr);
    st_close(&of);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", outdir, metrics);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", outdir);
}

// how check_step sets tiny_gqa up beyond its fixture run's options
typedef struct { int chunk; const char *memory; int pieces, ckpt, s2; } StepRun;

// One step of n micro-batches (rows of Ts[g] tokens, B rows each) of model (NULL: tiny_gqa), set
// up as its fixture's full, LoRA or "trainable" run (mode, hyperparameters from train) with run's options: the loss
// per label against want_loss to 1e-5 relative and every trainable gradient against ef's
// <mode>.grad.* to 1e-4 of its largest element (fp32 against float64), the checks named
// after run_name
static void check_step(const char *model, const JsonValue *train, const char *mode, StepRun run, int B, int n,
                       int *const *tokens, int *const *targets, const int *Ts, long labels, double want_loss, StFile *ef,
                       const char *run_name) {
    char outdir[256], metrics[300];
    snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_step", (int)getpid());
    snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
    TrainConfig tc;
    char *argv[64];
    const char *adapter = !strcmp(mode, "full") ? NULL : !strcmp(mode, "trainable") ? "trainable/peft_init" : "peft_init";
    fixture_config(&tc, argv, model ? model : "tiny_gqa", json_get(train, mode), adapter, outdir, metrics, NULL);
    tc.batch_size = B, tc.chunk_size = run.chunk, tc.chunk_memory = run.memory, tc.num_output_chunks = run.pieces;
    tc.activation_checkpointing = run.ckpt, tc.s2_attn = run.s2;
    int T = 0;
    for (int g = 0; g < n; g++) T = Ts[g] > T ? Ts[g] : T;
    Model m;
    if (model_setup(&m, NULL, &tc, B, T, NULL) != 0) die("%s: model setup failed", run_name);
    Trainable *tr = (Trainable *)mallocCheck(4096 * sizeof(Trainable));
    int ntr = list_trainables(&m, tr);
    for (int i = 0; i < ntr; i++) memset(tr[i].grad, 0, tr[i].n * sizeof(float));
    double loss = 0;
    for (int g = 0; g < n; g++) loss += model_forward_backward(&m, tokens[g], targets[g], B, Ts[g], 1.0f / labels);
    char what[300], path[300];
    snprintf(what, sizeof what, "%s: loss", run_name);
    check_rel(loss / labels, want_loss, 0, 1e-5, what);
    snprintf(what, sizeof what, "%s: grad", run_name);
    for (int i = 0; i < ntr; i++) {
        snprintf(path, sizeof path, "%s.grad.%s", mode, tr[i].name);
        check_weight(ef, path, tr[i].name, tr[i].grad, tr[i].n, &m.host.config, 1e-4, what);
    }
    free(tr);
    model_free(&m);
}

// mode: "full", "lora", DoRA's "dora" and "dora_dropout", whose references are in the
// model's dora/ (dev/reference/make_dora_fixtures.py, dropout masks as ours), "ia3", in its
// ia3/ (dev/reference/make_ia3_fixtures.py), "llama_adapter", in its llama_adapter/
// (dev/reference/make_llama_adapter_fixtures.py), "prefix", in its prefix/
// (dev/reference/make_prefix_fixtures.py), or "trainable": LoRA with the embedding and
// the norms trained too (--trainable_params embed,norm, peft's modules_to_save), in its
// trainable/ (make_trainable_fixtures.py), which start from the adapter peft saved with them
// (--from_peft_checkpoint loads them)
static void test_model(const char *model, const char *mode) {
    char path[600], what[256], outdir[256], metrics[300];
    int full = !strcmp(mode, "full"), dora = !strncmp(mode, "dora", 4), trainable = !strcmp(mode, "trainable");
    int own = !strcmp(mode, "ia3") || !strcmp(mode, "llama_adapter") || !strcmp(mode, "prefix") || trainable; // (their own folder, named as the mode)
    char own_init[64];
    snprintf(own_init, sizeof own_init, "%s/peft_init", mode);
    const char *refdir = dora ? "dora" : own ? mode : "ref";
    const char *adapter = full ? NULL : own ? own_init : !dora ? "peft_init" : !strcmp(mode, "dora") ? "dora/peft_init" : "dora/peft_init_dropout";
    snprintf(path, sizeof path, "test/fixtures/%s/%s/expected.json", model, refdir);
    JsonValue exp = read_json(path);
    const JsonValue *ref = json_get(&exp, mode), *hp = json_get(json_get(&exp, "train"), mode);
    snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_%s_%s", (int)getpid(), model, mode);
    snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
    TrainConfig tc;
    char *argv[64];
    fixture_config(&tc, argv, model, hp, adapter, outdir, metrics, NULL);

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
    snprintf(path, sizeof path, "test/fixtures/%s/%s/expected.safetensors", model, refdir);
    if (st_open(&ef, path) != 0) die("cannot open %s", path);
    int V = m.host.config.vocab_size;
    float *logits = (float *)mallocCheck((size_t)B * Ts[0] * V * sizeof(float));
    Trainable *tr = (Trainable *)mallocCheck(4096 * sizeof(Trainable));
    int ntr = list_trainables(&m, tr);
    for (int i = 0; i < ntr; i++) memset(tr[i].grad, 0, tr[i].n * sizeof(float));
    double loss = 0;
    for (int g = 0; g < 2; g++) { // step 0's dropout masks, as train() draws them
        m.dropout_key = splitmix64(((uint64_t)tc.seed << 32) ^ (uint64_t)g);
        loss += model_forward_backward(&m, tokens + g * B * T, targets + g * B * T, B, Ts[g], 1.0f / labels);
    }
    m.host.lora.training = 0; // the reference's logits are evaluation's (no dropout)
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
    snprintf(what, sizeof what, "%s %s", model, mode);
    // (a tied model's saved embedding is saved as its head too, as peft does: one tensor more)
    int nsaved = ntr + (trainable && config.tied);
    check_training(&tc, what, json_get(ref, "steps"), hp, &ef, mode, &config, nsaved, outdir, metrics, 1e-4);
    if (trainable) { // (after check_training: fixture_config's strings are shared) chunked == whole: the embedding's and norms' gradients summed over chunks and output pieces
        StepRun runs[] = {{7, "recompute", 1, 0, 0}, {7, "keep", 3, 1, 0}};
        int *tok[2] = {tokens, tokens + B * T}, *tgt[2] = {targets, targets + B * T};
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            snprintf(what, sizeof what, "%s %s (C=7 %s, %d output pieces, checkpointing %d)", model, mode, runs[r].memory,
                     runs[r].pieces, runs[r].ckpt);
            check_step(model, json_get(&exp, "train"), mode, runs[r], B, 2, tok, tgt, Ts, labels, json_num(ref, "loss"), &ef,
                       what);
        }
    }
    st_close(&ef);
    free(logits); free(tr); free(tokens); free(targets);
    json_free(&exp);
}

// Targets -100 inside rows, as SFT data has them (a prompt, then the response; padding;
// a hole between two labelled runs): the loss and every gradient of one micro-batch of
// tiny_gqa against transformers + peft in float64 (mask.safetensors, from
// dev/reference/make_mask_fixtures.py), full fine-tuning and LoRA. The output head runs
// on the labelled positions only (chunk_head), moving their rows; this shows the rest
// still get a zero gradient and the labelled ones their own. Whole, in chunks of 7 and
// with 3 output pieces (pieces and chunks that cut the labelled runs). Tolerances as
// test_model's: fp32 against float64, the loss to 1e-5 relative, each gradient to 1e-4
// of its largest element.
static void test_mask(void) {
    JsonValue exp = read_json("test/fixtures/tiny_gqa/ref/mask.json"), ref = read_json("test/fixtures/tiny_gqa/ref/expected.json");
    StFile ef;
    if (st_open(&ef, "test/fixtures/tiny_gqa/ref/mask.safetensors") != 0) die("mask: no fixture");
    enum { B = 3, T = 24 };
    int tokens[B * T], targets[B * T];
    const StTensor *tt = st_find(&ef, "tokens"), *gt = st_find(&ef, "targets");
    if (!tt || !gt || tt->numel != B * T || gt->numel != B * T || st_read_i32(&ef, tt, tokens) != 0 ||
        st_read_i32(&ef, gt, targets) != 0)
        die("mask: tokens and targets (%d, %d) missing", B, T);
    long labels = (long)json_num(&exp, "labels");
    StepRun runs[] = {{0, "keep", 1, 0, 0}, {7, "recompute", 1, 0, 0}, {0, "keep", 3, 0, 0}};
    int *tok[] = {tokens}, *tgt[] = {targets}, Ts[] = {T};
    for (int full = 0; full < 2; full++)
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            const char *mode = full ? "full" : "lora";
            char run_name[200];
            snprintf(run_name, sizeof run_name, "tiny_gqa %s, targets -100 inside rows (C=%d %s, %d output pieces)", mode,
                     runs[r].chunk, runs[r].memory, runs[r].pieces);
            check_step(NULL, json_get(&ref, "train"), mode, runs[r], B, 1, tok, tgt, Ts, labels,
                       json_num(&exp, full ? "full_loss" : "lora_loss"), &ef, run_name);
        }
    st_close(&ef);
    json_free(&exp);
    json_free(&ref);
}

// --s2_attn 1, LongLoRA's shifted sparse attention: the loss and every gradient of one step
// of tiny_gqa (two micro-batches, T = 24 and 20: groups of 6 and 5) against transformers +
// peft in float64 with the grouping written out in PyTorch (s2attn.safetensors, from
// dev/reference/make_s2attn_fixtures.py), full fine-tuning and LoRA. Whole, in chunks of 7
// (recompute: chunks that cut the groups, whose queries see the carry within their group),
// of 5 with activation checkpointing, and of 1. Tolerances as test_mask's: fp32 against
// float64, the loss to 1e-5 relative, each gradient to 1e-4 of its largest element (the
// grouping changes the loss by 4.5e-3 relative, the gradients by far more).
static void test_s2attn(void) {
    JsonValue exp = read_json("test/fixtures/tiny_gqa/ref/s2attn.json"), ref = read_json("test/fixtures/tiny_gqa/ref/expected.json");
    StFile ef;
    if (st_open(&ef, "test/fixtures/tiny_gqa/ref/s2attn.safetensors") != 0) die("s2attn: no fixture");
    enum { B = 2, MAXT = 24, MBS = 2 };
    int tokens[MBS][B * MAXT], targets[MBS][B * MAXT], Ts[MBS];
    for (int g = 0; g < MBS; g++) {
        char name[32];
        snprintf(name, sizeof name, "tokens_%d", g);
        const StTensor *tt = st_find(&ef, name);
        snprintf(name, sizeof name, "targets_%d", g);
        const StTensor *gt = st_find(&ef, name);
        if (!tt || !gt || tt->ndim != 2 || tt->shape[0] != B || tt->shape[1] > MAXT || gt->numel != tt->numel ||
            st_read_i32(&ef, tt, tokens[g]) != 0 || st_read_i32(&ef, gt, targets[g]) != 0)
            die("s2attn: micro-batch %d missing", g);
        Ts[g] = (int)tt->shape[1];
    }
    long labels = (long)json_num(&exp, "labels");
    StepRun runs[] = {{0, "keep", 1, 0, 1}, {7, "recompute", 1, 0, 1}, {5, "keep", 1, 1, 1}, {1, "keep", 1, 0, 1}};
    int *tok[] = {tokens[0], tokens[1]}, *tgt[] = {targets[0], targets[1]};
    for (int full = 0; full < 2; full++)
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            const char *mode = full ? "full" : "lora";
            char run_name[200];
            snprintf(run_name, sizeof run_name, "tiny_gqa %s, --s2_attn 1 (C=%d %s%s)", mode, runs[r].chunk, runs[r].memory,
                     runs[r].ckpt ? ", activation checkpointing" : "");
            check_step(NULL, json_get(&ref, "train"), mode, runs[r], B, MBS, tok, tgt, Ts, labels,
                       json_num(&exp, full ? "full_loss" : "lora_loss"), &ef, run_name);
        }
    st_close(&ef);
    json_free(&exp);
    json_free(&ref);
}

// the runs of another optimizer's fixture (test/fixtures/tiny_gqa/ref/<opt>.json and
// .safetensors), each trained and compared as test_model's ten AdamW steps are: SGD's
// (make_sgd_fixtures.py) and AdamW8bit's (make_adamw8bit_fixtures.py)
static void test_optimizer_runs(const char *opt) {
    const char *model = "tiny_gqa";
    char path[600], what[256], outdir[256], metrics[300];
    snprintf(path, sizeof path, "test/fixtures/%s/ref/%s.json", model, opt);
    JsonValue exp = read_json(path);
    StFile ef;
    snprintf(path, sizeof path, "test/fixtures/%s/ref/%s.safetensors", model, opt);
    if (st_open(&ef, path) != 0) die("cannot open %s", path);
    const JsonValue *runs = json_get(&exp, "runs");
    if (!runs || runs->type != JSON_ARRAY) die("fixture: %s.json has no runs", opt);
    for (int i = 0; i < runs->count; i++) {
        const JsonValue *run = &runs->items[i], *hp = json_get(run, "hparams");
        const char *name, *mode;
        if (json_get_string(run, "name", &name, NULL) != 0 || json_get_string(run, "mode", &mode, NULL) != 0 || !hp)
            die("fixture: %s.json run %d", opt, i);
        int full = !strcmp(mode, "full");
        snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_%s_%s_%s", (int)getpid(), model, opt, name);
        snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
        TrainConfig tc;
        char *argv[64];
        fixture_config(&tc, argv, model, hp, full ? NULL : "peft_init", outdir, metrics, NULL);
        Model m; // the trainable tensors' count and the config, as the run will have them
        if (model_setup(&m, NULL, &tc, 1, 2, NULL) != 0) die("model setup failed for %s", model);
        Trainable *tr = (Trainable *)mallocCheck(4096 * sizeof(Trainable));
        int ntr = list_trainables(&m, tr);
        Config config = m.host.config;
        model_free(&m);
        free(tr);
        snprintf(what, sizeof what, "%s %s %s", model, opt, name);
        // 8-bit moments: where one lands near the midpoint of two codes, the float64 reference's
        // gradients (ours are fp32's) can pick the other code, a step of the map, and every later
        // update of that element moves by a fraction of lr: measured 4.4e-4 of a tensor's scale
        // after 10 steps (the fp32 state's runs stay under 1e-4). A wrong formula moves them by
        // far more (test_optim.c checks the step itself bit for bit from equal inputs).
        const JsonValue *eight = json_get(run, "eight_bit");
        check_training(&tc, what, json_get(run, "steps"), hp, &ef, name, &config, ntr, outdir, metrics,
                       eight && eight->count ? 2e-3 : 1e-4);
    }
    st_close(&ef);
    json_free(&exp);
}

// --pure_bf16 --optimizer anyprecision against llama-recipes' pure bf16 (model.to(bfloat16),
// AnyPrecisionAdamW; dev/reference/make_purebf16_fixtures.py), Kahan summation off and on:
// 10 steps of full fine-tuning through the real training loop. The weights, gradients and
// moments are bf16 in both, but torch rounds every activation to bf16 and we compute them in
// fp32, so the gradients differ by bf16's precision and an update that lands near a rounding
// boundary of a bf16 weight can go the other way. Measured: losses within 2.7e-4 relative,
// gradient norms 4.2e-3, each weight tensor within 1.1e-2 of its largest element (2.5 bf16
// ulps of it), 16.8% (16.3% with Kahan) of the weights a bf16 step or more apart. Allowed:
// 5e-4, 1e-2, 2e-2 and 25%. A slip in the step's order shows as more weights apart: training
// with Kahan summation on and comparing with the run without leaves 45.7% of them apart.
// Also: every saved weight a bf16 value; the checkpoint's state bf16, the compensation there
// only with Kahan summation.
static void test_pure_bf16(void) {
    const char *model = "tiny_gqa";
    char path[600], key[256], what[160], label[256], outdir[256], metrics[300];
    snprintf(path, sizeof path, "test/fixtures/%s/ref/purebf16.json", model);
    JsonValue exp = read_json(path);
    StFile ef;
    snprintf(path, sizeof path, "test/fixtures/%s/ref/purebf16.safetensors", model);
    if (st_open(&ef, path) != 0) die("cannot open %s", path);
    const JsonValue *runs = json_get(&exp, "runs");
    if (!runs || runs->type != JSON_ARRAY) die("fixture: purebf16.json has no runs");
    for (int i = 0; i < runs->count; i++) {
        const JsonValue *run = &runs->items[i], *hp = json_get(run, "hparams");
        const char *name;
        if (json_get_string(run, "name", &name, NULL) != 0 || !hp) die("fixture: purebf16.json run %d", i);
        int kahan = (int)json_num(hp, "kahan_summation");
        snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_purebf16_%s", (int)getpid(), name);
        snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
        const char *extra[] = {"--pure_bf16", "1", "--kahan_summation", kahan ? "1" : "0", NULL};
        TrainConfig tc;
        char *argv[64];
        fixture_config(&tc, argv, model, hp, NULL, outdir, metrics, extra);
        snprintf(what, sizeof what, "%s --pure_bf16 --optimizer anyprecision --kahan_summation %d", model, kahan);
        snprintf(label, sizeof label, "%s: train() exits 0", what);
        int rc = train(&tc);
        CHECK(rc == 0, label, "exit code %d", rc);
        check_steps_within(metrics, json_get(run, "steps"), hp, what, 5e-4, 1e-2);
        StFile of;
        snprintf(path, sizeof path, "%s/model.safetensors", outdir);
        if (st_open(&of, path) != 0) die("cannot open %s", path);
        size_t total = 0, apart = 0, not_bf16 = 0;
        snprintf(label, sizeof label, "%s after 10 steps", what);
        for (int k = 0; k < of.n_tensors; k++) {
            const StTensor *t = &of.tensors[k];
            float *got = (float *)mallocCheck(t->numel * sizeof(float)), *want = (float *)mallocCheck(t->numel * sizeof(float));
            st_read_f32(&of, t, 0, t->numel, got);
            snprintf(key, sizeof key, "%s.final.%s", name, t->name);
            check_tensor(&ef, key, got, t->numel, 2e-2, label);
            const StTensor *w = st_find(&ef, key);
            if (w && w->numel == t->numel) {
                st_read_f32(&ef, w, 0, t->numel, want);
                for (size_t j = 0; j < t->numel; j++) apart += got[j] != want[j], not_bf16 += got[j] != bf16_round(got[j]);
                total += t->numel;
            }
            free(got), free(want);
        }
        snprintf(label, sizeof label, "%s: at most 25%% of the weights a bf16 step or more from the reference's", what);
        CHECK(total && apart <= total / 4, label, "%zu of %zu (%.1f%%)", apart, total, 100.0 * apart / (total ? total : 1));
        snprintf(label, sizeof label, "%s: every saved weight is a bf16 value", what);
        CHECK(total && not_bf16 == 0, label, "%zu of %zu are not", not_bf16, total);
        st_close(&of);
        snprintf(path, sizeof path, "%s/checkpoint-10/optimizer.safetensors", outdir);
        if (st_open(&of, path) != 0) die("cannot open %s", path);
        const StTensor *m = st_find(&of, "exp_avg"), *v = st_find(&of, "exp_avg_sq"), *c = st_find(&of, "compensation");
        snprintf(label, sizeof label, "%s: the checkpoint's state is bf16 exp_avg, exp_avg_sq%s", what, kahan ? ", compensation" : "");
        CHECK(m && v && m->dtype == ST_BF16 && v->dtype == ST_BF16 && m->numel == (uint64_t)total && v->numel == (uint64_t)total &&
              (kahan ? c && c->dtype == ST_BF16 && c->numel == (uint64_t)total : !c) && of.n_tensors == 2 + kahan,
              label, "%d tensors", of.n_tensors);
        st_close(&of);
        snprintf(path, sizeof path, "rm -rf '%s' '%s'", outdir, metrics);
        if (system(path) != 0) fprintf(stderr, "warning: could not remove %s\n", outdir);
    }
    st_close(&ef);
    json_free(&exp);
}

// --freeze_layers N against transformers with requires_grad=False on the embedding (and a
// head tied to it: the same tensor) and the first N layers, 10 AdamW steps in float64
// (dev/reference/make_freeze_fixtures.py): the trajectory and the trained tensors with the
// full fine-tuning test's tolerances; the frozen tensors saved bit for bit as they were; the
// checkpoint's AdamW state and the memory plan's gradients and moments only the trainable
// weights' (4 fp32 values each: gradient, two moments, and a moment's worth of the buffer a
// checkpoint moves the state through).
static void test_freeze(const char *model) {
    char path[600], what[300], outdir[256], metrics[300];
    snprintf(path, sizeof path, "test/fixtures/%s/ref/freeze.json", model);
    JsonValue exp = read_json(path);
    const JsonValue *hp = json_get(&exp, "train"), *names = json_get(&exp, "trainable");
    int N = (int)json_num(&exp, "freeze_layers");
    size_t numel = (size_t)json_num(&exp, "trainable_numel");
    snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_%s_freeze", (int)getpid(), model);
    snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
    TrainConfig tc;
    char *argv[64];
    fixture_config(&tc, argv, model, hp, NULL, outdir, metrics, NULL);
    tc.freeze_layers = N; // (fixture_config's options are full fine-tuning's: --freeze_layers goes with them)
    Model m;
    if (model_setup(&m, NULL, &tc, 2, 24, NULL) != 0) die("model setup failed for %s", model);
    snprintf(what, sizeof what, "%s --freeze_layers %d: the memory plan's gradients and moments", model, N);
    CHECK(m.param_bytes == 4 * sizeof(float) * numel, what, "%zu bytes, %zu trainable weights", m.param_bytes, numel);
    model_free(&m);
    int rc = train(&tc);
    snprintf(what, sizeof what, "%s --freeze_layers %d: train() exits 0", model, N);
    CHECK(rc == 0, what, "exit code %d", rc);
    snprintf(what, sizeof what, "%s --freeze_layers %d", model, N);
    check_steps(metrics, json_get(&exp, "steps"), hp, what);
    StFile of, ef;
    snprintf(path, sizeof path, "%s/model.safetensors", outdir);
    if (st_open(&of, path) != 0) die("cannot open %s", path);
    snprintf(path, sizeof path, "test/fixtures/%s/ref/freeze.safetensors", model);
    if (st_open(&ef, path) != 0) die("cannot open %s", path);
    int n_trained = 0;
    for (int i = 0; i < of.n_tensors; i++) {
        const StTensor *t = &of.tensors[i];
        int trains = 0;
        for (int k = 0; k < names->count; k++) trains |= !strcmp(names->items[k].string, t->name);
        n_trained += trains;
        float *got = (float *)mallocCheck(t->numel * sizeof(float)), *want = (float *)mallocCheck(t->numel * sizeof(float));
        st_read_f32(&of, t, 0, t->numel, got);
        snprintf(path, sizeof path, "final.%s", t->name);
        snprintf(what, sizeof what, "%s --freeze_layers %d after 10 steps%s", model, N, trains ? "" : " (frozen: unchanged, bit for bit)");
        const StTensor *w = st_find(&ef, path);
        if (trains || !w || w->numel != t->numel) check_tensor(&ef, path, got, t->numel, 1e-4, what); // says what is missing
        else {
            st_read_f32(&ef, w, 0, t->numel, want);
            CHECK(memcmp(got, want, t->numel * sizeof(float)) == 0, what, "%s differs from the base weights", t->name);
        }
        free(got); free(want);
    }
    snprintf(what, sizeof what, "%s --freeze_layers %d: every tensor saved, %d of them trained", model, N, names->count);
    CHECK(of.n_tensors == ef.n_tensors && n_trained == names->count, what, "%d tensors saved (reference %d), %d trained",
          of.n_tensors, ef.n_tensors, n_trained);
    st_close(&of);
    st_close(&ef);
    snprintf(path, sizeof path, "%s/checkpoint-10/optimizer.safetensors", outdir);
    if (st_open(&of, path) != 0) die("cannot open %s", path);
    const StTensor *mt = st_find(&of, "exp_avg");
    snprintf(what, sizeof what, "%s --freeze_layers %d: the checkpoint's AdamW state is the trainable weights' only", model, N);
    CHECK(mt && mt->numel == numel, what, "exp_avg of %lld elements, %zu trainable", mt ? (long long)mt->numel : -1LL, numel);
    st_close(&of);
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

// QLoRA (--quantize nf4, double quantization) against transformers + peft on a
// bitsandbytes 4-bit model (dev/reference/make_qlora_fixtures.py): the weights as
// dequantized for the products bit for bit (the same bytes from the same BF16
// checkpoint, peft/quant.h), then logits, loss and every LoRA gradient of one batch.
// Both sides compute in fp32 (bitsandbytes dequantizes to fp32; there is no fp64
// 4-bit model) from the same weights, each rounding ~1e-7 per operation in its own
// summation order: logits and gradients within 1e-5 of a tensor's largest magnitude
// (measured: 7e-7), the loss within 1e-6 relative (measured: 2e-8). A wrong code,
// nibble or absmax moves the logits by ~1e-2. Then a short QLoRA fine-tune whose loss must fall
// (from ~ln 512, the untrained model's, by a fifth at least; it falls by ~30%).
static void test_qlora(void) {
    const char *dir = "test/fixtures/tiny_qlora";
    char outdir[128], metrics[160], what[256];
    snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_qlora", (int)getpid());
    snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
    char *argv[] = {"train_llama2", "--model", (char *)dir, "--data", "test/fixtures/data.jsonl", "--max_seq_len", "24",
                    "--batch_size", "4", "--quantize", "nf4", "--from_peft_checkpoint", "test/fixtures/tiny_qlora/peft_init",
                    "--max_steps", "30", "--lr", "3e-3", "--lr_scheduler", "constant", "--output_dir", outdir,
                    "--metrics_file", metrics};
    TrainConfig tc;
    if (parse_args(&tc, sizeof argv / sizeof argv[0], argv) != 0) die("qlora: arguments rejected");
    int B = 2, T = 16;
    Model m;
    if (model_setup(&m, NULL, &tc, B, T, NULL) != 0) die("qlora: model setup failed");
    StFile ef;
    if (st_open(&ef, "test/fixtures/tiny_qlora/ref/expected.safetensors") != 0) die("qlora: no fixture");
    const Config *c = &m.host.config;
    int exact = 0, total = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const FsdpUnit *un = &m.host.units.units[fsdp_layer_unit(l)];
        float *w = unit_dequant(&m, fsdp_layer_unit(l));
        for (int j = 0; j < un->n_tensors; j++) {
            if (!model_quantized(&m.host, fsdp_layer_unit(l), j)) continue;
            char name[160];
            snprintf(name, sizeof name, "deq.%s", un->tensors[j].name);
            const StTensor *t = st_find(&ef, name);
            float *want = (float *)mallocCheck(un->tensors[j].numel * sizeof(float));
            total++;
            exact += t && t->numel == un->tensors[j].numel && st_read_f32(&ef, t, 0, t->numel, want) == 0 &&
                     memcmp(want, w + un->tensors[j].offset, t->numel * sizeof(float)) == 0;
            free(want);
        }
    }
    CHECK(exact == total && total == 7 * c->n_layers, "qlora: every 4-bit weight dequantizes to bitsandbytes' bits",
          "%d of %d", exact, total);
    int tokens[2 * 16], targets[2 * 16];
    if (st_read_i32(&ef, st_find(&ef, "tokens"), tokens) != 0 || st_read_i32(&ef, st_find(&ef, "targets"), targets) != 0)
        die("qlora: batch");
    long labels = 0;
    for (int i = 0; i < B * T; i++) labels += targets[i] >= 0;
    Trainable *tr = (Trainable *)mallocCheck(64 * sizeof(Trainable));
    int ntr = list_trainables(&m, tr);
    for (int i = 0; i < ntr; i++) memset(tr[i].grad, 0, tr[i].n * sizeof(float));
    double loss = model_forward_backward(&m, tokens, targets, B, T, 1.0f / labels) / labels;
    float *logits = (float *)mallocCheck((size_t)B * T * c->vocab_size * sizeof(float)), want_loss;
    model_forward(&m, tokens, targets, B, T, logits);
    check_tensor(&ef, "logits", logits, (size_t)B * T * c->vocab_size, 1e-5, "qlora");
    if (st_read_f32(&ef, st_find(&ef, "loss"), 0, 1, &want_loss) != 0) die("qlora: loss");
    check_rel(loss, want_loss, 0, 1e-6, "qlora loss");
    char name[256];
    for (int i = 0; i < ntr; i++) {
        snprintf(name, sizeof name, "grad.%s", tr[i].name);
        check_tensor(&ef, name, tr[i].grad, tr[i].n, 1e-5, "qlora");
    }
    CHECK(ntr == 2 * LORA_N_TARGETS * c->n_layers, "qlora: the adapter covers all seven linear layers", "%d tensors", ntr);
    free(tr), free(logits);
    st_close(&ef);
    model_free(&m);

    // a short fine-tune on the tiny data: the loss falls
    int rc = train(&tc);
    CHECK(rc == 0, "qlora: train() exits 0", "exit code %d", rc);
    size_t len;
    char *text = read_file(metrics, &len);
    double first = 0, last = 0;
    int steps = 0;
    for (char *p = text, *e; p && (e = strchr(p, '\n')); p = e + 1) {
        JsonValue rec;
        char err[64];
        if (json_parse(p, e - p, &rec, err, sizeof err) != 0) die("%s: %s", metrics, err);
        if (json_get(&rec, "loss")) last = json_num(&rec, "loss"), first = steps++ ? first : last;
        json_free(&rec);
    }
    snprintf(what, sizeof what, "qlora: %d fine-tuning steps lower the loss by a fifth", steps);
    CHECK(steps == 30 && last < first * 0.8, what, "first %.4f, last %.4f", first, last);
    free(text);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", outdir, metrics);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", outdir);
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
    fixture_config(&tc, argv, "tiny_gqa", hp, "peft_init", outdir, metrics, extra);
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
    fixture_config(&tc, argv, "tiny_gqa", hp, "peft_init", outdir, metrics, resume);
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

// Preference tuning (trainer/preference.h, --objective dpo and orpo) against
// dev/reference/make_dpo_fixtures.py's float64 reference in test/fixtures/tiny_gqa/dpo (TRL
// 1.16's DPOTrainer and ORPOTrainer train the same steps and agree with it), each case on
// test/fixtures/preference/data.jsonl (max_seq_len 32, 2 micro-batches of 2 pairs, file
// order): step 1's gradient of the step's loss (before clipping), whole (each pair's prompt run
// once: --shared_prompt auto, the fixtures' adapters having no dropout; and as two rows), and in
// chunks of 7 with recompute, activation checkpointing and 3 output pieces, with its loss and TRL's
// metrics; then the 4 steps through the training loop: each step's loss, lr and gradient
// norm (check_steps), TRL's metrics, and the trained tensors. Tolerances, fp32 against
// float64 (the measured worst errors are in docs/preference.md): losses and metrics 1e-5
// relative (a floor of 1e-3 for the ones near 0; DPO's rewards against beta |logps|, see
// dpo_check_metrics: step 1's are 0 exactly, the policy being the reference); gradients
// 1e-4 of the tensor's largest element; final weights 1e-4 of the tensor's scale, as
// test_model's. Measured worst: losses 1.8e-6, gradients 2.0e-6, final weights 9.6e-6.
static const char *const dpo_metrics[] = {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                                          "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"};

static void dpo_config(TrainConfig *tc, char **argv, const char *name, const JsonValue *hp, const char *outdir, const char *metrics,
                       const char *const *more) {
    static char beta[32];
    const char *objective, *loss_type = "sigmoid", *extra[32] = {"--data", "test/fixtures/preference/data.jsonl", "--max_seq_len", "32",
                                                                 "--objective", NULL, "--beta", beta, NULL};
    int full = 0, n = 8;
    if (json_get_string(hp, "objective", &objective, NULL) != 0) die("fixture %s: objective", name);
    json_get_string(hp, "dpo_loss_type", &loss_type, NULL);
    json_get_bool(hp, "full_finetune", &full);
    extra[5] = objective;
    snprintf(beta, sizeof beta, "%.17g", json_num(hp, "beta"));
    if (!strcmp(objective, "dpo")) extra[n++] = "--dpo_loss_type", extra[n++] = loss_type;
    for (int i = 0; more && more[i]; i++) extra[n++] = more[i];
    extra[n] = NULL;
    fixture_config(tc, argv, "tiny_gqa", hp, full ? NULL : "dpo/peft_init", outdir, metrics, extra);
}

// every metric of the case (DPO's six, ORPO's nine) of one step: a metrics record or the reference's.
// A reward is beta times a difference of log-probabilities (DPO's log-ratio to the reference), each
// rounded to ~1e-7 of its size: its error is measured against beta |logps/chosen|
static void dpo_check_metrics(const JsonValue *got, const JsonValue *want, double beta, const char *label, int step) {
    char what[300];
    for (size_t k = 0; k < sizeof dpo_metrics / sizeof *dpo_metrics; k++) {
        if (!json_get(want, dpo_metrics[k])) continue;
        int reward = !strncmp(dpo_metrics[k], "rewards/", 8) && strcmp(dpo_metrics[k], "rewards/accuracies");
        snprintf(what, sizeof what, "%s step %d %s", label, step, dpo_metrics[k]);
        CHECK(json_get(got, dpo_metrics[k]) != NULL, what, "missing from the metrics");
        if (json_get(got, dpo_metrics[k]))
            check_rel(json_num(got, dpo_metrics[k]), json_num(want, dpo_metrics[k]),
                      reward ? beta * fabs(json_num(want, "logps/chosen")) : 1e-3, 1e-5, what);
    }
}

// step 1 of the case through preference_step, its gradients kept (no clipping) and checked
static void dpo_step_one(const char *name, const JsonValue *hp, const JsonValue *step1, StFile *ef, const char *const *run,
                         const char *label) {
    char outdir[256], metrics[300], what[300], path[300];
    snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_dpo_step", (int)getpid());
    snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
    TrainConfig tc;
    char *argv[64];
    const char *more[16] = {"--grad_clip", "0"};
    for (int i = 0; run && run[i]; i++) more[2 + i] = run[i];
    dpo_config(&tc, argv, name, hp, outdir, metrics, more);
    tc.metrics_file = "";
    Trainer r;
    memset(&r, 0, sizeof r);
    TrainState ts;
    memset(&ts, 0, sizeof ts);
    loss_scale_init(&ts.ls, 0);
    int T;
    if (fsdp_init(&r.fsdp, FSDP_FULL_SHARD, 0) != 0 || mkdir_p(outdir) != 0 || train_load(&tc, &r, &T, host_available()) != 0 ||
        train_begin(&tc, &r, &ts) != 0)
        die("%s: set-up failed", label);
    StepStats s;
    double loss = preference_step(&r, &tc, 0, tc.max_steps, &ts.ls, &s.n_tokens, &s.norm, &s.lr, &s.skipped, s.pm);
    snprintf(what, sizeof what, "%s step 1 loss", label);
    check_rel(loss, json_num(step1, "loss"), 0, 1e-5, what);
    snprintf(what, sizeof what, "%s step 1 grad_norm", label);
    check_rel(s.norm, json_num(step1, "grad_norm"), 0, 1e-4, what);
    char rec[1024];
    size_t at = (size_t)snprintf(rec, sizeof rec, "{\"step\": 1");
    for (int k = 0; k < preference_metric_count(&tc); k++)
        at += (size_t)snprintf(rec + at, sizeof rec - at, ", \"%s\": %.17g", preference_metric_names[k], s.pm[k]);
    snprintf(rec + at, sizeof rec - at, "}");
    JsonValue got;
    char err[64];
    if (json_parse(rec, strlen(rec), &got, err, sizeof err) != 0) die("%s: %s", label, err);
    dpo_check_metrics(&got, step1, json_num(hp, "beta"), label, 1);
    json_free(&got);
    Trainable *tr = (Trainable *)mallocCheck(4096 * sizeof(Trainable));
    int ntr = list_trainables(&r.m, tr);
    snprintf(what, sizeof what, "%s step 1 grad", label);
    for (int i = 0; i < ntr; i++) {
        snprintf(path, sizeof path, "%s.grad.%s", name, tr[i].name);
        check_weight(ef, path, tr[i].name, tr[i].grad, tr[i].n, &r.m.host.config, 1e-4, what);
    }
    free(tr);
    trainer_free(&r);
    snprintf(path, sizeof path, "rm -rf '%s'", outdir);
    if (system(path) != 0) fprintf(stderr, "warning: could not remove %s\n", outdir);
}

static void test_preference(const char *name) {
    char outdir[256], metrics[300], what[300];
    JsonValue exp = read_json("test/fixtures/tiny_gqa/dpo/expected.json");
    const JsonValue *c = json_get(json_get(&exp, "cases"), name), *hp = json_get(c, "hp"), *steps = json_get(c, "steps");
    if (!c || !hp || !steps) die("fixture: case %s", name);
    StFile ef;
    if (st_open(&ef, "test/fixtures/tiny_gqa/dpo/expected.safetensors") != 0) die("cannot open the DPO fixtures");
    dpo_step_one(name, hp, &steps->items[0], &ef, NULL, name);
    const char *two_rows[] = {"--shared_prompt", "off", NULL};
    snprintf(what, sizeof what, "%s (two rows a pair)", name);
    dpo_step_one(name, hp, &steps->items[0], &ef, two_rows, what);
    const char *chunked[] = {"--chunk_size", "7", "--chunk_memory", "recompute", "--activation_checkpointing", "--num_output_chunks", "3", NULL};
    snprintf(what, sizeof what, "%s (C=7 recompute, checkpointing, 3 output pieces)", name);
    dpo_step_one(name, hp, &steps->items[0], &ef, chunked, what);

    snprintf(outdir, sizeof outdir, "/tmp/llama2tune_test_%d_%s", (int)getpid(), name);
    snprintf(metrics, sizeof metrics, "%s.metrics.jsonl", outdir);
    TrainConfig tc;
    char *argv[64];
    dpo_config(&tc, argv, name, hp, outdir, metrics, NULL);
    int rc = train(&tc);
    CHECK(rc == 0, name, "train() exit code %d", rc);
    check_steps(metrics, steps, hp, name);
    size_t len;
    char *text = read_file(metrics, &len), *p = text;
    for (int k = 0; k < steps->count && p && *p; k++) {
        char *e = strchr(p, '\n'), err[64];
        JsonValue rec;
        if (!e || json_parse(p, e - p, &rec, err, sizeof err) != 0) die("%s: metrics line %d", name, k + 1);
        dpo_check_metrics(&rec, &steps->items[k], json_num(hp, "beta"), name, k + 1);
        json_free(&rec);
        p = e + 1;
    }
    free(text);
    StFile of;
    int full = 0;
    json_get_bool(hp, "full_finetune", &full);
    char path[600];
    snprintf(path, sizeof path, full ? "%s/model.safetensors" : "%s/adapter_model.safetensors", outdir);
    if (st_open(&of, path) != 0) die("cannot open %s", path);
    Config config;
    if (config_load(&config, "test/fixtures/tiny_gqa") != 0) die("tiny_gqa's config");
    snprintf(what, sizeof what, "%s after %d steps", name, steps->count);
    for (int i = 0; i < of.n_tensors; i++) {
        const StTensor *t = &of.tensors[i];
        float *got = (float *)mallocCheck(t->numel * sizeof(float));
        st_read_f32(&of, t, 0, t->numel, got);
        snprintf(path, sizeof path, "%s.final.%s", name, t->name);
        check_weight(&ef, path, t->name, got, t->numel, &config, 1e-4, what);
        free(got);
    }
    st_close(&of);
    st_close(&ef);
    json_free(&exp);
    snprintf(path, sizeof path, "rm -rf '%s' '%s'", outdir, metrics);
    if (system(path) != 0) fprintf(stderr, "warning: could not remove %s\n", outdir);
}

// test_llama2 MODE: only MODE's fixture runs (test_model's modes; "prefix" say), on the
// models that have it; no argument: everything
int main(int argc, char **argv) {
    static const char *const preference_cases[] = {"dpo_sigmoid_lora", "dpo_ipo_lora", "dpo_hinge_lora", "dpo_sigmoid_full", "orpo_lora"};
    if (argc > 1 && !strcmp(argv[1], "preference")) {
        for (size_t i = 0; i < sizeof preference_cases / sizeof *preference_cases; i++) test_preference(preference_cases[i]);
        return test_summary();
    }
    if (argc > 1) {
        for (int i = 0; i < 2; i++) test_model(i ? "tiny_tied" : "tiny_gqa", argv[1]);
        return test_summary();
    }
    test_qlora();
    test_grad_scaler();
    test_dropout();
    test_optimizer_runs("sgd");
    test_optimizer_runs("adamw8bit");
    test_pure_bf16();
    test_mask();
    test_s2attn();
    const char *models[] = {"tiny_gqa", "tiny_tied", "tiny_llama3", "tiny_linear", "tiny_codellama", "tiny_mistral"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        test_model(models[i], "lora");
        test_model(models[i], "full");
    }
    for (int i = 0; i < 2; i++) { // DoRA, with and without dropout; IA3; llama_adapter; prefix; LoRA with the embedding and norms trained
        test_model(models[i], "dora");
        test_model(models[i], "dora_dropout");
        test_model(models[i], "ia3");
        test_model(models[i], "llama_adapter");
        test_model(models[i], "prefix");
        test_model(models[i], "trainable");
    }
    for (size_t i = 0; i < sizeof preference_cases / sizeof *preference_cases; i++) test_preference(preference_cases[i]);
    test_freeze("tiny_gqa");  // untied: lm_head trains
    test_freeze("tiny_tied"); // tied: the head is the frozen embedding
    return test_summary();
}
