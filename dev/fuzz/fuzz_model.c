// A checkpoint folder whose config.json is arbitrary bytes and whose weights
// are the tiny GQA model of test/fixtures: model_load (model.h) must
// either refuse it with a message or load a model whose shapes match the file.
// Nothing is allocated for the weights before every tensor has been checked
// against the config (a config claiming terabytes once made model_load try to
// allocate them: test/fuzz_regress/model/); libFuzzer's -malloc_limit_mb
// (= -rss_limit_mb, 2048) reports any single allocation above 2 GB as a crash.
#define TESTING
#include "../../train_llama2.c"
#include "fuzz.h"

FUZZ_TARGET(model) {
    static int init = 0;
    if (!init) {
        fuzz_link_fixture("model.safetensors", "test/fixtures/tiny_gqa/model.safetensors");
        init = 1;
    }
    char p[4096];
    fuzz_path(p, sizeof p, "config.json");
    fuzz_write(p, data, size);
    HostModel m;
    memset(&m, 0, sizeof m);
    fuzz_stderr_begin();
    int r = model_load(&m, fuzz_tmpdir());
    int said = fuzz_stderr_end(fuzz_tmpdir()); // names the folder, config.json or model.safetensors
    if (r != 0) FUZZ_ASSERT(said);
    if (r == 0) {
        // it loaded, so the config is the tiny model's: 2 layers of dim 64, vocab 512
        FUZZ_ASSERT(m.config.dim == 64 && m.config.n_layers == 2 && m.config.vocab_size == 512);
        FUZZ_ASSERT(m.num_params == param_layout(&m.config, &m.w, NULL) && m.params != NULL);
    }
    host_model_free(&m); // all that model_load allocates (also after a failure)
    return 0;
}
