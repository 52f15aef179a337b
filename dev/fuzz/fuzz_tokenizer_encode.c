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
    static int loaded = 0;
    fuzz_load_tokenizers(toks, models, N_MODELS, &loaded);
    if (size == 0) return 0;
    const Tokenizer *t = &toks[data[0] % N_MODELS];
    int bos = (data[0] >> 4) & 1, eos = (data[0] >> 5) & 1, n;
    const char *text = (const char *)data + 1;
    size_t len = size - 1, dl;
    free(fuzz_encode_decode(t, text, len, bos, eos, &n, &dl));
    if (len > 0) FUZZ_ASSERT(n > bos + eos || t->remove_extra_whitespaces); // only spaces can vanish
    fuzz_decode_bytes_as_ids(t, text, len);
    return 0;
}
