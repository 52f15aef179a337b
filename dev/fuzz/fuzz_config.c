// config.json from arbitrary bytes: config_load (model.h) on a folder
// holding it. What it accepts must be a configuration the trainer can size
// buffers from: every field in its range, heads divisible, head_dim even,
// rope_theta and rms_norm_eps positive and finite, and RoPE scaling's parameters
// ones rope_inv_freq can compute with.
#define TESTING
#include "../../train_llama2.c"
#include "fuzz.h"

FUZZ_TARGET(config) {
    char p[4096];
    fuzz_path(p, sizeof p, "config.json");
    fuzz_write(p, data, size);
    Config c;
    memset(&c, 0, sizeof c);
    fuzz_stderr_begin();
    int r = config_load(&c, fuzz_tmpdir());
    int said = fuzz_stderr_end("config.json");
    if (r != 0) {
        FUZZ_ASSERT(said); // "error: <dir>/config.json: ..."
        return 0;
    }
    FUZZ_ASSERT(c.dim >= 1 && c.hidden_dim >= 1 && c.n_layers >= 1 && c.vocab_size >= 1 && c.max_pos >= 1);
    FUZZ_ASSERT(c.n_heads >= 1 && c.n_kv_heads >= 1 && c.n_heads % c.n_kv_heads == 0);
    FUZZ_ASSERT(c.head_dim >= 2 && c.head_dim % 2 == 0);
    // (a rope_theta or rms_norm_eps of 1e39 was once accepted as inf: test/fuzz_regress/config/)
    FUZZ_ASSERT(c.norm_eps > 0 && c.rope_theta > 0 && isfinite(c.rope_theta) && isfinite(c.norm_eps));
    FUZZ_ASSERT(c.tied == 0 || c.tied == 1);
    FUZZ_ASSERT(c.rope_type >= ROPE_DEFAULT && c.rope_type <= ROPE_LLAMA3);
    if (c.rope_type != ROPE_DEFAULT) FUZZ_ASSERT(c.rope_factor > 0 && c.rope_factor <= FLT_MAX);
    if (c.rope_type == ROPE_LLAMA3)
        FUZZ_ASSERT(c.rope_low_freq_factor > 0 && c.rope_high_freq_factor > c.rope_low_freq_factor &&
                    c.rope_high_freq_factor <= FLT_MAX && c.rope_original_max_pos >= 1);
    return 0;
}
