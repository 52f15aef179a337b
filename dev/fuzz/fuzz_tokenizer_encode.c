// Tokenizer encode and decode on arbitrary input, with fixed valid models:
// the first input byte picks one of the fixture tokenizers (Llama-2-like BPE
// with byte fallback, one with UNUSED pieces, one with user-defined pieces and
// other normalizer flags) and whether BOS/EOS are added; the rest is the text.
// Every id must be in range. The same bytes, read as little-endian int32 ids
// (any value, negative and out of range included), are decoded too.
#include "../../tokenizer.h"
#include "fuzz.h"

static const char *const models[] = {
    "test/fixtures/tiny_gqa/tokenizer.model",
    "test/fixtures/tokenizer/tok1000.model",
    "test/fixtures/tokenizer/unused.model",
    "test/fixtures/tokenizer/variant.model",
};
#define N_MODELS ((int)(sizeof models / sizeof models[0]))

FUZZ_TARGET(tokenizer_encode) {
    static Tokenizer toks[N_MODELS];
    static int init = 0;
    if (!init) {
        for (int i = 0; i < N_MODELS; i++) {
            size_t n;
            unsigned char *b = fuzz_slurp_fixture(models[i], &n);
            FUZZ_ASSERT(tokenizer_load_from_memory(&toks[i], b, n, models[i]) == 0);
            free(b);
        }
        init = 1;
    }
    if (size == 0) return 0;
    const Tokenizer *t = &toks[data[0] % N_MODELS];
    int bos = (data[0] >> 4) & 1, eos = (data[0] >> 5) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int n;
    int *ids = tokenizer_encode(t, text, len, bos, eos, &n);
    FUZZ_ASSERT(ids != NULL && n >= 0);
    for (int i = 0; i < n; i++) FUZZ_ASSERT(ids[i] >= 0 && ids[i] < t->vocab_size);
    if (len > 0) FUZZ_ASSERT(n > bos + eos || t->remove_extra_whitespaces); // only spaces can vanish
    size_t dl;
    char *s = tokenizer_decode(t, ids, n, &dl);
    FUZZ_ASSERT(s != NULL && s[dl] == 0);
    free(s);
    free(ids);
    // the bytes as ids
    int nid = (int)(len / 4);
    int *raw = (int *)malloc((size_t)nid * sizeof(int) + 1);
    FUZZ_ASSERT(raw != NULL);
    for (int i = 0; i < nid; i++) {
        uint32_t u = (uint32_t)(uint8_t)text[4 * i] | (uint32_t)(uint8_t)text[4 * i + 1] << 8 |
                     (uint32_t)(uint8_t)text[4 * i + 2] << 16 | (uint32_t)(uint8_t)text[4 * i + 3] << 24;
        // mostly in range, so that decode has pieces to work with
        raw[i] = (u >> 31) ? (int32_t)u : (int)(u % (uint32_t)(t->vocab_size + 2));
    }
    s = tokenizer_decode(t, raw, nid, &dl);
    FUZZ_ASSERT(s != NULL && s[dl] == 0);
    free(s);
    free(raw);
    return 0;
}
