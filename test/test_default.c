// Tests of default_model.h, the built-in default run's model and data: what
// default_setup writes loads with the repository's own readers (the
// trainer's config and weight loaders, tokenizer.h, dataloader.h,
// safetensors.h), has the shapes and initialisation the header describes, is
// written again byte for byte (and only where missing), and the default run's
// options are ones the trainer accepts. Temporary files go to a fresh /tmp
// directory, removed at the end.
#define TESTING
#include "../train_llama2.c"
#include "../support/default_model.h"
#include "test_common.h"

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_file(a, &na), *y = read_file(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x); free(y);
    return same;
}

// every tensor a Hugging Face Llama checkpoint of this config holds, F32, with its shape
static void check_weights(const char *model_dir, const Config *c) {
    char path[4200], name[128], what[256];
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    StFile sf;
    if (st_open(&sf, path) != 0) { CHECK(0, "model.safetensors opens", "%s", path); return; }
    int64_t D = c->dim, H = c->hidden_dim, V = c->vocab_size, q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    CHECK(sf.n_tensors == 3 + 9 * c->n_layers, "model.safetensors has 3 + 9 * layers tensors", "%d", sf.n_tensors);
    struct { const char *name; int64_t rows, cols; } expect[] = {
        {"model.embed_tokens.weight", V, D}, {"model.norm.weight", D, 0}, {"lm_head.weight", V, D},
        {"input_layernorm", D, 0}, {"self_attn.q_proj", q, D}, {"self_attn.k_proj", kv, D},
        {"self_attn.v_proj", kv, D}, {"self_attn.o_proj", D, q}, {"post_attention_layernorm", D, 0},
        {"mlp.gate_proj", H, D}, {"mlp.up_proj", H, D}, {"mlp.down_proj", D, H},
    };
    int bad = 0;
    for (int l = 0; l < c->n_layers; l++) {
        for (size_t k = 0; k < sizeof expect / sizeof expect[0]; k++) {
            if (k < 3 && l > 0) continue; // the three outside the layers, once
            if (k < 3) snprintf(name, sizeof name, "%s", expect[k].name);
            else snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, expect[k].name);
            const StTensor *t = st_find(&sf, name);
            int ndim = expect[k].cols ? 2 : 1;
            int ok = t && t->dtype == ST_F32 && t->ndim == ndim && t->shape[0] == expect[k].rows &&
                     (ndim == 1 || t->shape[1] == expect[k].cols);
            if (!ok && bad++ < 5) {
                snprintf(what, sizeof what, "tensor %s", name);
                CHECK(0, what, t ? "wrong dtype or shape" : "missing");
            }
        }
    }
    CHECK(bad == 0, "every tensor is there, F32, with its shape", "%d wrong", bad);

    // the initialisation the header describes: norms exactly 1, linear layers
    // and embeddings zero-mean with standard deviation DEFAULT_INIT_STD
    const StTensor *norm = st_find(&sf, "model.layers.0.input_layernorm.weight"), *wq = st_find(&sf, "model.layers.0.self_attn.q_proj.weight");
    if (norm && wq) {
        float *w = (float *)mallocCheck(wq->numel * sizeof(float));
        int ones = 1;
        if (st_read_f32(&sf, norm, 0, norm->numel, w) == 0)
            for (uint64_t i = 0; i < norm->numel; i++) ones &= w[i] == 1.0f;
        CHECK(ones, "norm weights are 1", "");
        double s = 0, s2 = 0;
        if (st_read_f32(&sf, wq, 0, wq->numel, w) == 0)
            for (uint64_t i = 0; i < wq->numel; i++) { s += w[i]; s2 += (double)w[i] * w[i]; }
        double mean = s / wq->numel, sd = sqrt(s2 / wq->numel - mean * mean);
        CHECK(fabs(mean) < 0.05 * DEFAULT_INIT_STD && fabs(sd / DEFAULT_INIT_STD - 1) < 0.03,
              "q_proj has mean 0 and the init std", "mean %g, std %g (want %g)", mean, sd, DEFAULT_INIT_STD);
        free(w);
    }
    st_close(&sf);
}

int main(void) {
    char tmp[] = "/tmp/llama2tune_test_default_XXXXXX";
    if (!mkdtemp(tmp)) die("cannot make a temporary directory: %s", strerror(errno));
    char dir_a[300], dir_b[300], model_a[4096], data_a[4096], model_b[4096], data_b[4096], path[4200], path_b[4200];
    snprintf(dir_a, sizeof dir_a, "%s/a", tmp);
    snprintf(dir_b, sizeof dir_b, "%s/b", tmp);

    CHECK(default_setup(dir_a, model_a, sizeof model_a, data_a, sizeof data_a) == 0, "default_setup writes a folder", "");
    snprintf(path, sizeof path, "%s/model", dir_a);
    CHECK(strcmp(model_a, path) == 0, "model folder is DIR/model", "%s", model_a);
    snprintf(path, sizeof path, "%s/data.jsonl", dir_a);
    CHECK(strcmp(data_a, path) == 0, "data is DIR/data.jsonl", "%s", data_a);

    // config.json, read by the trainer
    Config c;
    memset(&c, 0, sizeof c);
    int cfg_ok = config_load(&c, model_a) == 0;
    CHECK(cfg_ok, "config.json parses", "");
    CHECK(cfg_ok && c.dim == DEFAULT_DIM && c.hidden_dim == DEFAULT_HIDDEN && c.n_layers == DEFAULT_LAYERS &&
          c.n_heads == DEFAULT_HEADS && c.n_kv_heads == DEFAULT_KV_HEADS && c.vocab_size == DEFAULT_VOCAB && !c.tied &&
          c.max_pos == DEFAULT_MAX_POS && c.rope_theta == 10000.0f && c.norm_eps == 1e-5f,
          "config has the header's sizes", "dim %d hidden %d layers %d heads %d/%d vocab %d", c.dim, c.hidden_dim,
          c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size);

    // tokenizer.model: a character vocabulary, Llama-2's special ids
    Tokenizer tok;
    snprintf(path, sizeof path, "%s/tokenizer.model", model_a);
    int tok_ok = tokenizer_load(&tok, path) == 0;
    CHECK(tok_ok, "tokenizer.model loads", "");
    if (tok_ok) {
        CHECK(tok.vocab_size == c.vocab_size && tok.unk_id == 0 && tok.bos_id == 1 && tok.eos_id == 2 && tok.pad_id == -1,
              "tokenizer: vocab size as config, unk 0, bos 1, eos 2, no pad", "vocab %d unk %d bos %d eos %d pad %d",
              tok.vocab_size, tok.unk_id, tok.bos_id, tok.eos_id, tok.pad_id);
        const char *text = "The capital of France is Paris! {~}";
        int n, unk = 0;
        int *ids = tokenizer_encode(&tok, text, strlen(text), 0, 0, &n);
        for (int i = 0; ids && i < n; i++) unk += ids[i] == tok.unk_id;
        char *back = ids ? tokenizer_decode(&tok, ids, n, NULL) : NULL;
        // one token per character, plus the dummy prefix "▁"
        CHECK(ids && n == (int)strlen(text) + 1 && unk == 0, "printable ASCII encodes one token per character", "%d tokens", n);
        CHECK(back && strcmp(back, text) == 0, "decode(encode(text)) == text", "'%s'", back ? back : "(null)");
        free(ids); free(back);
    }

    // data.jsonl: one prompt/response sample per fact, none skipped
    if (tok_ok) {
        DataOptions o;
        memset(&o, 0, sizeof o);
        o.max_seq_len = 64;
        o.cache_dir = tmp;
        o.quiet = 1;
        Dataset ds;
        int ok = dataset_load(&ds, data_a, &tok, path, &o) == 0;
        long facts = (long)(sizeof default_facts / sizeof default_facts[0]);
        CHECK(ok && ds.format == FORMAT_PROMPT_RESPONSE && ds.n_samples == facts && ds.n_skipped == 0,
              "data.jsonl loads: a prompt_response sample per fact", "%s: %ld samples of %ld", ok ? "" : ds.error,
              ok ? ds.n_samples : 0L, facts);
        if (ok) {
            CHECK(dataset_max_len(&ds) <= 64, "every sample fits the default run's max_seq_len 64", "%d", dataset_max_len(&ds));
            dataset_free(&ds);
        }
        tokenizer_free(&tok);
    }

    // model.safetensors: names, shapes, init; and the trainer loads it against the config
    if (cfg_ok) {
        check_weights(model_a, &c);
        HostModel m;
        memset(&m, 0, sizeof m);
        CHECK(model_load(&m, model_a) == 0, "the trainer loads the model", "");
        host_model_free(&m);
    }

    // the same bytes again, in another folder
    CHECK(default_setup(dir_b, model_b, sizeof model_b, data_b, sizeof data_b) == 0, "default_setup writes a second folder", "");
    const char *files[] = {"model/config.json", "model/model.safetensors", "model/tokenizer.model", "data.jsonl"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char what[128];
        snprintf(path, sizeof path, "%s/%s", dir_a, files[i]);
        snprintf(path_b, sizeof path_b, "%s/%s", dir_b, files[i]);
        snprintf(what, sizeof what, "%s is the same bytes twice", files[i]);
        CHECK(same_file(path, path_b), what, "");
    }

    // a second call writes only what is missing
    snprintf(path_b, sizeof path_b, "%s/model/tokenizer.model", dir_b);
    remove(path_b);
    snprintf(path, sizeof path, "%s/model/model.safetensors", dir_b);
    struct stat before, after;
    stat(path, &before);
    CHECK(default_setup(dir_b, model_b, sizeof model_b, data_b, sizeof data_b) == 0, "default_setup on an existing folder", "");
    stat(path, &after);
    CHECK(before.st_ino == after.st_ino && before.st_mtime == after.st_mtime, "existing files are left as they are", "");
    snprintf(path, sizeof path, "%s/model/tokenizer.model", dir_a);
    CHECK(same_file(path, path_b), "a missing file is written again", "");

    // the default run's options are ones the trainer accepts
    enum { NDEF = sizeof default_run_args / sizeof default_run_args[0] };
    char *argv[NDEF + 5];
    int argc = 0;
    argv[argc++] = (char *)"train_llama2";
    for (int i = 0; i < NDEF; i++) argv[argc++] = (char *)default_run_args[i];
    argv[argc++] = (char *)"--model"; argv[argc++] = model_a;
    argv[argc++] = (char *)"--data"; argv[argc++] = data_a;
    TrainConfig tc;
    memset(&tc, 0, sizeof tc);
    CHECK(parse_args(&tc, argc, argv) == 0, "the trainer accepts default_run_args", "");
    CHECK(tc.sample_prompt.n > 0 && !tc.full_finetune, "the default run is LoRA with sample prompts", "");
    // the samples show memorisation, so each prompt must be one the model trains on
    int unknown = 0;
    for (int i = 0; i < tc.sample_prompt.n; i++) {
        int found = 0;
        for (size_t k = 0; k < sizeof default_facts / sizeof default_facts[0]; k++) found |= !strcmp(tc.sample_prompt.v[i], default_facts[k][0]);
        unknown += !found;
    }
    CHECK(unknown == 0, "every sample prompt is a prompt of the data", "%d are not", unknown);

    remove_tree(tmp);
    return test_summary();
}
