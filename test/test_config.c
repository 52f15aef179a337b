// config.json as transformers reads it (model.h's config_load and rope_inv_freq).
// test/fixtures/configs/ holds the config.json files of Llama-2-7B and 70B, Llama-3-8B, Llama-3.1-8B
// and 70B, Llama-3.2-1B and 3B (tied), Mistral-7B v0.1 (sliding window 4096) and
// v0.3 (vocab 32768), CodeLlama-7b (vocab 32016, rope_theta 1e6), TinyLlama-1.1B
// and Vicuna-7B-v1.5-16k (linear scaling under the older key "type"), as their
// model folders have them, and a few edge cases (edge-*: the defaults and
// precedences transformers applies: a Mistral config without num_key_value_heads
// and sliding_window (8 and 4096 there), nulls, rope_parameters, rope_type over
// type, rope_theta inside over outside).
// dev/reference/make_config_fixtures.py wrote what transformers' AutoConfig makes
// of each (expected.json). For every one:
// - config_load's fields are transformers' (sliding_window null is Config's 0);
// - RoPE: rope_scale on transformers' plain frequencies gives transformers' scaled
//   ones bit for bit, and rope_inv_freq is within one ulp of them (the pow, see
//   model.h; the frequencies that differ are counted in the check's line);
// - the trainer plans it: --dry_run --random_init (no weight is drawn) prints the
//   model's shape and the memory plan.
// Then settings that would change the maths in ways the trainer does not
// implement are refused, each with a message naming the key or its value.
#define TESTING
#include "../train_llama2.c"
#include "test_common.h"

static char tmpdir[64];

// runs fn(arg) with file descriptor fd (1 or 2) sent to a file; returns fn's result
// and what it wrote (malloc'd, in *out)
static int capture(int fd, int (*fn)(void *), void *arg, char **out) {
    char path[128];
    snprintf(path, sizeof path, "%s/captured.txt", tmpdir);
    fflush(fd == 1 ? stdout : stderr);
    int saved = dup(fd), file = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(file, fd);
    close(file);
    int rc = fn(arg);
    fflush(fd == 1 ? stdout : stderr);
    dup2(saved, fd);
    close(saved);
    size_t len;
    *out = read_file(path, &len);
    if (!*out) die("cannot read %s", path);
    return rc;
}

static double num(const JsonValue *o, const char *key) {
    double d;
    if (json_get_number(o, key, &d) != 0) die("expected.json: no number '%s'", key);
    return d;
}

// config_load against transformers' parse; mismatches listed in the check's line
static void check_fields(const char *name, const Config *c, const JsonValue *want) {
    char bad[1024] = "", what[128];
    size_t n = 0;
#define FIELD(got, key, want_value)                                                                    \
    if ((double)(got) != (double)(want_value))                                                         \
        n += snprintf(bad + n, n < sizeof bad ? sizeof bad - n : 0, " %s %.9g (transformers: %.9g);", \
                      key, (double)(got), (double)(want_value));
    struct { const char *key; int got; } ints[] = {
        {"hidden_size", c->dim}, {"intermediate_size", c->hidden_dim}, {"num_hidden_layers", c->n_layers},
        {"num_attention_heads", c->n_heads}, {"num_key_value_heads", c->n_kv_heads}, {"head_dim", c->head_dim},
        {"vocab_size", c->vocab_size}, {"max_position_embeddings", c->max_pos}, {"tie_word_embeddings", c->tied}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        const JsonValue *v = json_get(want, ints[i].key);
        double w = v && v->type == JSON_BOOL ? v->boolean : num(want, ints[i].key);
        FIELD(ints[i].got, ints[i].key, w);
    }
    FIELD(c->norm_eps, "rms_norm_eps", (float)num(want, "rms_norm_eps"));
    FIELD(c->rope_theta, "rope_theta", (float)num(want, "rope_theta"));
    const char *type;
    if (json_get_string(want, "rope_type", &type, NULL) != 0) die("expected.json: %s: no rope_type", name);
    if (strcmp(rope_type_names[c->rope_type], type) != 0)
        n += snprintf(bad + n, n < sizeof bad ? sizeof bad - n : 0, " rope_type %s (transformers: %s);",
                      rope_type_names[c->rope_type], type);
    if (c->rope_type != ROPE_DEFAULT) FIELD(c->rope_factor, "factor", num(want, "factor"));
    if (c->rope_type == ROPE_LLAMA3) {
        FIELD(c->rope_low_freq_factor, "low_freq_factor", num(want, "low_freq_factor"));
        FIELD(c->rope_high_freq_factor, "high_freq_factor", num(want, "high_freq_factor"));
        FIELD(c->rope_original_max_pos, "original_max_position_embeddings", num(want, "original_max_position_embeddings"));
    }
    const JsonValue *win = json_get(want, "sliding_window"); // null (None): no window, which Config says with 0
    FIELD(c->sliding_window, "sliding_window", win && win->type == JSON_NULL ? 0 : num(want, "sliding_window"));
#undef FIELD
    snprintf(what, sizeof what, "%s: config_load's fields are transformers'", name);
    CHECK(bad[0] == 0, what, "%s", bad);
}

// float32 values of a JSON array (transformers' inverse frequencies)
static float *floats(const JsonValue *o, const char *key, int want_n) {
    const JsonValue *a = json_get(o, key);
    if (!a || a->type != JSON_ARRAY || a->count != want_n) die("expected.json: '%s' is not %d numbers", key, want_n);
    float *f = (float *)mallocCheck((size_t)want_n * sizeof(float));
    for (int i = 0; i < want_n; i++) f[i] = (float)a->items[i].number; // exact: they are float32 values
    return f;
}

// ulps between two positive floats
static int ulps(float a, float b) {
    int32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return abs(x - y);
}

static void check_rope(const char *name, const Config *c, const JsonValue *want) {
    int half = c->head_dim / 2, scaled_bad = -1, worst = 0, differ = 0;
    float *plain = floats(want, "inv_freq_plain", half), *ref = floats(want, "inv_freq", half);
    float *got = (float *)mallocCheck((size_t)half * sizeof(float));
    rope_inv_freq(c, got);
    for (int i = 0; i < half; i++) {
        float s = rope_scale(c, plain[i]);
        if (memcmp(&s, &ref[i], sizeof s) != 0 && scaled_bad < 0) scaled_bad = i;
        int u = ulps(got[i], ref[i]);
        differ += u != 0;
        if (u > worst) worst = u;
    }
    char what[160];
    snprintf(what, sizeof what, "%s: rope %s: rope_scale of transformers' plain frequencies is its scaled ones, bit for bit",
             name, rope_type_names[c->rope_type]);
    CHECK(scaled_bad < 0, what, "first difference at %d: %a vs transformers' %a", scaled_bad,
          scaled_bad < 0 ? 0.0 : rope_scale(c, plain[scaled_bad]), scaled_bad < 0 ? 0.0 : ref[scaled_bad]);
    snprintf(what, sizeof what, "%s: rope_inv_freq within 1 ulp of transformers' (%d of %d differ)", name, differ, half);
    CHECK(worst <= 1, what, "worst: %d ulps", worst);
    free(plain); free(ref); free(got);
}

// the trainer plans a model of this config: --dry_run --random_init on a folder of it with
// the fixtures' tokenizer (whose tokenizer_config.json names its own BOS and EOS: the
// config's ids, 128000 and up for Llama-3, are beyond its 512 pieces) and data
typedef struct { char *argv[32]; int argc; } Args;
static int dry_run(void *p) {
    Args *a = (Args *)p;
    TrainConfig tc;
    if (parse_args(&tc, a->argc, a->argv) != 0) return -1;
    return train(&tc);
}
static void check_plan(const char *name, const char *dir, const Config *c) {
    char out[128], model[128], from[300], to[300];
    snprintf(out, sizeof out, "%s/out", tmpdir);
    snprintf(model, sizeof model, "%s/model", tmpdir);
    snprintf(from, sizeof from, "%s/config.json", dir);
    snprintf(to, sizeof to, "%s/config.json", model);
    if (mkdir_p(model) != 0 || copy_file(from, to) != 0) die("cannot copy %s", from);
    snprintf(to, sizeof to, "%s/tokenizer.model", model);
    if (copy_file("test/fixtures/tiny_gqa/tokenizer.model", to) != 0) die("cannot copy the tokenizer");
    snprintf(to, sizeof to, "%s/tokenizer_config.json", model);
    FILE *f = fopenCheck(to, "w");
    fprintf(f, "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}\n");
    fclose(f);
    Args a = {{"x", "--model", model, "--data", "test/fixtures/data.jsonl", "--max_seq_len", "24", "--batch_size", "1",
               "--dry_run", "--random_init", "--output_dir", out}, 13};
    char *printed;
    int rc = capture(1, dry_run, &a, &printed);
    char shape[256], what[160];
    snprintf(shape, sizeof shape, ": %d layers, dim %d, %d heads (%d kv) of %d, vocab %d, RoPE %s", c->n_layers, c->dim,
             c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, rope_type_names[c->rope_type]);
    snprintf(what, sizeof what, "%s: --dry_run --random_init prints its shape and the memory plan", name);
    CHECK(rc == 0 && strstr(printed, shape) && strstr(printed, "memory plan"), what, "exit %d; printed: %.300s", rc, printed);
    free(printed);
}

static void test_configs(void) {
    JsonValue exp;
    if (json_load_file("test/fixtures/configs/expected.json", &exp) != 0) exit(1);
    const JsonValue *configs = json_get(&exp, "configs");
    if (!configs || configs->type != JSON_OBJECT || configs->count == 0) die("expected.json: no configs");
    for (int i = 0; i < configs->count; i++) {
        const char *name = configs->keys[i];
        char dir[256], what[160];
        snprintf(dir, sizeof dir, "test/fixtures/configs/%s", name);
        Config c;
        int rc = config_load(&c, dir);
        snprintf(what, sizeof what, "%s: config_load accepts it", name);
        CHECK(rc == 0, what, "refused (see above)");
        if (rc != 0) continue;
        check_fields(name, &c, &configs->items[i]);
        check_rope(name, &c, &configs->items[i]);
        check_plan(name, dir, &c);
    }
    json_free(&exp);
}

// ----------------------------------------------------------------------------
// refused: a small Llama config with one setting added

typedef struct { const char *dir; Config c; } Load;
static int load(void *p) { Load *l = (Load *)p; return config_load(&l->c, l->dir); }

// config_load refuses a small Llama config (read as Llama's: no model_type) with `extra`
// keys added, with a message naming its file and containing `expect`
static void refused(const char *what, const char *extra, const char *expect) {
    char path[128], name[200];
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    FILE *f = fopenCheck(path, "w");
    fprintf(f, "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
               "\"num_attention_heads\": 4, \"vocab_size\": 512%s%s}\n", extra[0] ? ", " : "", extra);
    fclose(f);
    Load l = {.dir = tmpdir};
    char *msg;
    int rc = capture(2, load, &l, &msg);
    char *nl = strchr(msg, '\n');
    if (nl) *nl = 0;
    snprintf(name, sizeof name, "refused: %s", what);
    CHECK(rc == -1 && strstr(msg, expect) && strstr(msg, "config.json"), name, "exit %d, message '%s' (expected '%s')", rc,
          msg, expect);
    free(msg);
}

// refused for each of n values v: `extra` and `expect` are formats of v (one %s each)
static void refused_each(const char *extra_fmt, const char *expect_fmt, const char *const *values, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char extra[200], expect[100];
        snprintf(extra, sizeof extra, extra_fmt, values[i]);
        snprintf(expect, sizeof expect, expect_fmt, values[i]);
        refused(extra, extra, expect);
    }
}

static void test_refused(void) {
    // RoPE types that change the frequencies in ways not implemented, by name
    const char *types[] = {"dynamic", "yarn", "longrope", "su", "ntk", "proportional", "llama4"};
    refused_each("\"rope_scaling\": {\"rope_type\": \"%s\", \"factor\": 2.0}", "rope scaling type \"%s\" is not supported",
                 types, sizeof types / sizeof types[0]);
    // missing or bad parameters, by key; other architectures, and settings of these that change the maths
#define LLAMA3 "\"rope_scaling\": {\"rope_type\": \"llama3\", "
    struct { const char *what, *extra, *expect; } cases[] = {
        {"rope type under the older key", "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}", "\"dynamic\""},
        {"rope_parameters' type", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"rope_theta\": 1e6}", "\"yarn\""},
        {"llama3 without factor", LLAMA3 "\"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
         "'rope_scaling.factor' must be a positive finite number (missing)"},
        {"llama3 without low_freq_factor", LLAMA3 "\"factor\": 8, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
         "'rope_scaling.low_freq_factor' must be a positive finite number (missing)"},
        {"llama3 without high_freq_factor", LLAMA3 "\"factor\": 8, \"low_freq_factor\": 1, \"original_max_position_embeddings\": 8192}",
         "'rope_scaling.high_freq_factor' must be a positive finite number (missing)"},
        {"llama3 without original_max_position_embeddings", LLAMA3 "\"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4}",
         "'original_max_position_embeddings' must be an integer"},
        {"llama3 with high_freq_factor <= low_freq_factor",
         LLAMA3 "\"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
         "high_freq_factor (4) must be greater than low_freq_factor (4)"},
        {"llama3 with a factor of text",
         LLAMA3 "\"factor\": \"8\", \"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
         "'rope_scaling.factor' must be a positive finite number"},
        {"llama3 with a negative factor",
         LLAMA3 "\"factor\": -8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
         "'rope_scaling.factor' must be a positive finite number"},
        {"linear without factor", "\"rope_scaling\": {\"type\": \"linear\"}", "'rope_scaling.factor' must be a positive finite number (missing)"},
        {"rope_type not a string", "\"rope_scaling\": {\"rope_type\": 3, \"factor\": 2}", "'rope_scaling.rope_type' must be a string"},
        {"rope_scaling not an object", "\"rope_scaling\": \"linear\"", "'rope_scaling' must be an object or null"},
        {"rope_theta of text", "\"rope_theta\": \"1e4\"", "'rope_theta' must be a positive finite number"},
        {"rope_theta beyond float", "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e39}",
         "'rope_parameters.rope_theta' must be a positive finite number"},
        {"rope_theta below float", "\"rope_theta\": 1e-50", "'rope_theta' is 1e-50, which a float rounds to 0"},
        {"partial_rotary_factor", "\"partial_rotary_factor\": 0.5", "partial_rotary_factor 0.5 is not supported"},
        {"model_type not a string", "\"model_type\": null", "'model_type' must be a string"},
        {"attention_dropout", "\"attention_dropout\": 0.1", "attention_dropout is not supported"},
        {"attention_dropout of text", "\"attention_dropout\": \"0\"", "attention_dropout is not supported"},
        {"attention_bias of text", "\"attention_bias\": \"false\"", "attention_bias / mlp_bias are not supported"},
        {"hidden_act not a string", "\"hidden_act\": 1", "hidden_act \"(not a string)\" is not supported"},
        {"attention_bias", "\"attention_bias\": true", "attention_bias / mlp_bias are not supported"},
        {"mlp_bias", "\"mlp_bias\": true", "attention_bias / mlp_bias are not supported"},
        {"hidden_act gelu", "\"hidden_act\": \"gelu\"", "hidden_act \"gelu\" is not supported"},
        {"num_key_value_heads that does not divide the heads", "\"num_key_value_heads\": 3",
         "num_attention_heads (4) is not a multiple of num_key_value_heads (3)"},
        {"an odd head_dim", "\"head_dim\": 15", "head dimension must be even"},
    };
#undef LLAMA3
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) refused(cases[i].what, cases[i].extra, cases[i].expect);
    const char *others[] = {"qwen2", "qwen3", "gemma", "mixtral", "phi3"};
    refused_each("\"model_type\": \"%s\"", "model_type \"%s\" is not supported", others, sizeof others / sizeof others[0]);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/llama2tune_test_config_%d", (int)getpid());
    if (mkdir_p(tmpdir) != 0) die("cannot create %s", tmpdir);
    test_configs();
    test_refused();
    remove_tree(tmpdir);
    return test_summary();
}
