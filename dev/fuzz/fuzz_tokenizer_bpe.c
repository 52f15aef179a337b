// tokenizer.json's encode and decode on arbitrary text, with fixed valid
// tokenizers: the first input byte picks one of the fixture tokenizers
// (Llama-3's pre-tokenizer with every byte in the vocab; GPT-2's with some
// bytes missing, dropped or, with an unk_token, fused into <unk>) and whether
// BOS/EOS are asked for (a tokenizer.json has none); the rest is the text.
// Every id must be in range; with the Llama-3 one, decode(encode(text)) must
// give the text back (ill-formed UTF-8 as U+FFFD, as it is encoded). The same
// bytes, read as little-endian int32 ids, are decoded too.
#include "../../tokenizer.h"
#include "fuzz.h"

static const char *const models[] = {
    "test/fixtures/tokenizer/bpe_llama3.json",
    "test/fixtures/tokenizer/bpe_gpt2.json",
    "test/fixtures/tokenizer/bpe_unk.json",
};
#define N_MODELS ((int)(sizeof models / sizeof models[0]))

FUZZ_TARGET(tokenizer_bpe) {
    static Tokenizer toks[N_MODELS];
    static int loaded = 0;
    fuzz_load_tokenizers(toks, models, N_MODELS, &loaded);
    if (size == 0) return 0;
    int which = data[0] % N_MODELS, bos = (data[0] >> 4) & 1, eos = (data[0] >> 5) & 1, n;
    const Tokenizer *t = &toks[which];
    const char *text = (const char *)data + 1;
    size_t len = size - 1, dl;
    char *s = fuzz_encode_decode(t, text, len, bos, eos, &n, &dl);
    if (which == 0) { // every byte is in this vocab, so nothing is lost
        char *clean = (char *)malloc(3 * len + 1);
        FUZZ_ASSERT(clean != NULL);
        size_t cl = tok_utf8_lossy((const unsigned char *)text, len, clean);
        FUZZ_ASSERT(dl == cl && memcmp(s, clean, cl) == 0);
        FUZZ_ASSERT(n <= (int)cl); // each id stands for a byte or more
        free(clean);
    }
    free(s);
    fuzz_decode_bytes_as_ids(t, text, len);
    return 0;
}
