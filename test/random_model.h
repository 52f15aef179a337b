// A random Llama checkpoint (F32) for tests that need a shape no fixture has,
// written with the trainer's own writer (model.h: include it first), with a
// vocabulary of V rows and the fixture's tokenizer (512 pieces: a larger V is for
// tests that never tokenize). Weights are uniform in +-0.02, the norms 1.
#ifndef RANDOM_MODEL_H
#define RANDOM_MODEL_H
static void write_random_model(const char *dir, int D, int H, int L, int NH, int NKV, int V) {
    char path[512];
    if (mkdir_p(dir) != 0) die("mkdir %s", dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopenCheck(path, "w");
    fprintf(f, "{\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
            "\"num_key_value_heads\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, "
            "\"max_position_embeddings\": 4096, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}\n", D, H, L, NH, NKV, V);
    fclose(f);
    Config c;
    if (config_load(&c, dir) != 0) die("cannot read back %s/config.json", dir);
    ParameterTensors sizes;
    size_t n = param_layout(&c, &sizes, NULL);
    float *w = (float *)mallocCheck(n * sizeof(float));
    uint64_t st = 1;
    for (size_t i = 0; i < n; i++) w[i] = 0.04f * (rng_uniform(&st) - 0.5f);
    HostModel m;
    memset(&m, 0, sizeof m);
    m.config = c;
    m.params = w;
    m.num_params = n;
    param_layout(&c, &m.w, w);
    for (int l = 0; l < L; l++) for (int d = 0; d < D; d++) m.w.attn_norm[l * D + d] = m.w.mlp_norm[l * D + d] = 1.0f;
    if (model_save_hf(&m, dir, dir, "test/fixtures/tiny_gqa/tokenizer.model") != 0) die("cannot write %s", dir);
    free(w);
}
#endif
