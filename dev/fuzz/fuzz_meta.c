// A folder in Meta's original layout whose params.json is arbitrary bytes and
// whose weights are test/fixtures/meta/tiny_gqa's two model-parallel files:
// model_load (config_load_meta, then support/weights.h reassembling the tensors)
// must either refuse it with a message or load the tiny model, whose shapes the
// files fix: all but the head count, which splits the same projections into heads of
// another size just as well (n_heads 2 over n_kv_heads 1, heads of 32, is as valid over
// these files as the 4 over 2, heads of 16, they were made with: no shape tells them
// apart). A params.json that does not add up (an FFN formula or vocab_size other than
// the tensors', heads that do not divide) is refused; nothing is allocated for the
// weights before they have been checked.
#define TESTING
#include "../../train_llama2.c"
#include "fuzz.h"

FUZZ_TARGET(meta) {
    static int init = 0;
    if (!init) {
        fuzz_link_fixture("consolidated.00.pth", "test/fixtures/meta/tiny_gqa/consolidated.00.pth");
        fuzz_link_fixture("consolidated.01.pth", "test/fixtures/meta/tiny_gqa/consolidated.01.pth");
        fuzz_link_fixture("tokenizer.model", "test/fixtures/meta/tiny_gqa/tokenizer.model");
        init = 1;
    }
    char p[4096];
    fuzz_path(p, sizeof p, "params.json");
    fuzz_write(p, data, size);
    HostModel m;
    memset(&m, 0, sizeof m);
    fuzz_stderr_begin();
    int r = model_load(&m, fuzz_tmpdir());
    int said = fuzz_stderr_end(fuzz_tmpdir()); // names the folder, params.json or a file of it
    if (r != 0) FUZZ_ASSERT(said);
    if (r == 0) { // the tiny model: 2 layers of dim 64, FFN 96, vocab 512, q 64 and k, v 32 rows (GQA 4/2 of 16)
        const Config *c = &m.config;
        FUZZ_ASSERT(c->dim == 64 && c->n_layers == 2 && c->vocab_size == 512 && c->hidden_dim == 96);
        FUZZ_ASSERT(c->n_heads * c->head_dim == 64 && c->n_kv_heads * c->head_dim == 32);
        FUZZ_ASSERT(c->head_dim >= 2 && c->head_dim % 2 == 0 && c->n_heads % c->n_kv_heads == 0);
        FUZZ_ASSERT(c->norm_eps > 0 && isfinite(c->norm_eps) && c->rope_theta > 0 && isfinite(c->rope_theta));
        FUZZ_ASSERT(m.num_params == param_layout(c, &m.w, NULL) && m.params != NULL);
    }
    host_model_free(&m);
    return 0;
}
