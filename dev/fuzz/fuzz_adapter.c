// A PEFT adapter folder from arbitrary bytes: adapter_config.json is the input
// up to its first NUL byte (JSON text never holds a raw NUL); the bytes after
// that NUL, when there is one, are adapter_model.safetensors, else that file is
// the valid adapter peft saved for the tiny GQA model (test/fixtures). Then
// lora_load_peft against the tiny model's shapes (2 layers, dim 64).
#define TESTING
#include "../../train_llama2.c"
#include "fuzz.h"

FUZZ_TARGET(adapter) {
    static int init = 0, n_layers, vocab, tied, in[LORA_N_TARGETS], out[LORA_N_TARGETS];
    if (!init) {
        Config c;
        char dir[1024];
        fuzz_fixture(dir, sizeof dir, "test/fixtures/tiny_gqa");
        FUZZ_ASSERT(config_load(&c, dir) == 0);
        lora_shapes(&c, in, out);
        n_layers = c.n_layers, vocab = c.vocab_size, tied = c.tied;
        init = 1;
    }
    const uint8_t *nul = (const uint8_t *)memchr(data, 0, size);
    size_t cfg_len = nul ? (size_t)(nul - data) : size;
    char p[4096];
    fuzz_path(p, sizeof p, "adapter_config.json");
    fuzz_write(p, data, cfg_len);
    if (nul) {
        fuzz_path(p, sizeof p, "adapter_model.safetensors");
        fuzz_write(p, nul + 1, size - cfg_len - 1);
    } else {
        fuzz_link_fixture("adapter_model.safetensors", "test/fixtures/tiny_gqa/peft_init/adapter_model.safetensors");
    }
    LoRA l;
    memset(&l, 0, sizeof l);
    fuzz_stderr_begin();
    int r = lora_load_peft(&l, fuzz_tmpdir(), n_layers, in, out, vocab, tied);
    int said = fuzz_stderr_end(fuzz_tmpdir()); // names adapter_config.json or adapter_model.safetensors
    if (r != 0) {
        FUZZ_ASSERT(said);
        return 0;
    }
    FUZZ_ASSERT(l.r >= 1 && l.targets != 0 && l.targets < (1u << LORA_N_TARGETS) && l.n_layers == n_layers);
    FUZZ_ASSERT(l.dropout >= 0 && l.dropout < 1 && isfinite(l.alpha) && isfinite(l.scale) && l.params && l.grads);
    size_t n = 0;
    for (int t = 0; t < LORA_N_TARGETS; t++)
        if (l.targets & (1u << t)) n += (size_t)n_layers * l.r * (in[t] + out[t]);
    FUZZ_ASSERT(l.num_params == n);
    lora_free(&l);
    return 0;
}
