// The files of a model folder that --export_gguf's vocabulary reads, from arbitrary bytes:
// tokenizer.json is the input up to its first NUL byte, tokenizer_config.json the bytes after
// it (none without a NUL). gguf_check_tokenizer loads the tokenizer, then the folder as
// llama.cpp's converter reads it (added tokens, merges, post_processor, special tokens,
// add_*_token, add_prefix_space, the chat template) into a GGUF header in memory. A refusal
// must say why in an "error: " line; an accepted folder builds again with a config.json of
// special ids and a chat template of the run's, the header complete (no allocation failed).
#define TESTING
#include "../../train_llama2.c"
#include "fuzz.h"

FUZZ_TARGET(gguf_vocab) {
    const uint8_t *nul = (const uint8_t *)memchr(data, 0, size);
    size_t tj_len = nul ? (size_t)(nul - data) : size;
    char tj[4096], tc[4096];
    fuzz_path(tj, sizeof tj, "tokenizer.json");
    fuzz_path(tc, sizeof tc, "tokenizer_config.json");
    fuzz_write(tj, data, tj_len);
    if (nul) fuzz_write(tc, nul + 1, size - tj_len - 1);
    else remove(tc);
    fuzz_stderr_begin();
    int r = gguf_check_tokenizer(tj);
    int said = fuzz_stderr_end(NULL);
    if (r != 0) {
        FUZZ_ASSERT(said);
        return 0;
    }
    static const char cfg_text[] = "{\"bos_token_id\": 1, \"eos_token_id\": [2, 3], \"pad_token_id\": 0, \"unk_token_id\": -1}";
    JsonValue cfg;
    char err[256];
    FUZZ_ASSERT(json_parse(cfg_text, strlen(cfg_text), &cfg, err, sizeof err) == 0);
    GgufWriter w;
    gguf_init(&w);
    fuzz_stderr_begin();
    r = gguf_llama_vocab(&w, tj, &cfg, 0, CHAT_JINJA_LLAMA3);
    fuzz_stderr_end(NULL);
    FUZZ_ASSERT(r == 0 && !w.oom && w.n_kv >= 5); // model, pre, tokens, types, merges at least
    gguf_free(&w);
    json_free(&cfg);
    return 0;
}
