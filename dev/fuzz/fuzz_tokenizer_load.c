// tokenizer.model from arbitrary bytes: tokenizer_load_from_memory. A model
// that loads is then used: a fixed text and the input's own first bytes are
// encoded (every id must be in range) and decoded, and the whole vocabulary
// and some out-of-range ids are decoded.
#include "../../tokenizer.h"
#include "fuzz.h"

static void use(const Tokenizer *t, const char *text, size_t len) {
    int n;
    int *ids = tokenizer_encode(t, text, len, 1, 1, &n);
    FUZZ_ASSERT(ids != NULL && n >= 0);
    for (int i = 0; i < n; i++) FUZZ_ASSERT(ids[i] >= 0 && ids[i] < t->vocab_size);
    size_t dl;
    char *s = tokenizer_decode(t, ids, n, &dl);
    FUZZ_ASSERT(s != NULL && s[dl] == 0);
    free(s);
    free(ids);
}

FUZZ_TARGET(tokenizer_load) {
    Tokenizer t;
    fuzz_stderr_begin();
    int r = tokenizer_load_from_memory(&t, data, size, "fuzz");
    int said = fuzz_stderr_end("error: tokenizer fuzz: ");
    if (r != 0) {
        FUZZ_ASSERT(said && t.vocab_size == 0 && t.pieces == NULL && t.table == NULL);
        return 0;
    }
    FUZZ_ASSERT(t.vocab_size > 0 && t.unk_internal >= 0 && t.unk_internal < t.vocab_size);
    int special[4] = {t.bos_id, t.eos_id, t.unk_id, t.pad_id};
    for (int k = 0; k < 4; k++) FUZZ_ASSERT(special[k] >= -1 && special[k] < t.vocab_size);
    static const char sample[] = "Hello  world! \xE2\x96\x81 caf\xC3\xA9 \xF0\x9F\x98\x80 \xFF\xFE <s> x\ty\n";
    use(&t, sample, sizeof sample - 1);
    use(&t, (const char *)data, size < 512 ? size : 512);
    use(&t, "", 0);
    int nv = t.vocab_size < 70000 ? t.vocab_size + 3 : 70003;
    int *all = (int *)malloc((size_t)nv * sizeof(int));
    FUZZ_ASSERT(all != NULL);
    for (int i = 0; i < nv - 3; i++) all[i] = i;
    all[nv - 3] = -1; all[nv - 2] = t.vocab_size; all[nv - 1] = 0x7fffffff;
    size_t dl;
    char *s = tokenizer_decode(&t, all, nv, &dl);
    FUZZ_ASSERT(s != NULL);
    free(s);
    free(all);
    for (int i = 0; i < t.vocab_size && i < 70000; i++) FUZZ_ASSERT(tokenizer_piece(&t, i) != NULL);
    tokenizer_free(&t);
    return 0;
}
