// tokenizer.json from arbitrary bytes: tokenizer_load_from_memory with a
// ".json" name (the JSON parse, then every field's checks). A refusal must say
// why, naming the file; a tokenizer that loads is used as in fuzz_tokenizer_load
// (fuzz_check_tokenizer), and each added token of the first pass (normalized
// false) must encode, alone, to its own id: matched leftmost-longest, the whole
// text is the longest match there can be.
#include "../../tokenizer.h"
#include "fuzz.h"

FUZZ_TARGET(tokenizer_json) {
    Tokenizer t;
    fuzz_stderr_begin();
    int r = tokenizer_load_from_memory(&t, data, size, "fuzz.json");
    int said = fuzz_stderr_end("error: tokenizer fuzz.json: ");
    if (r != 0) {
        FUZZ_ASSERT(said && t.vocab_size == 0 && t.pieces == NULL && t.table == NULL);
        return 0;
    }
    FUZZ_ASSERT(t.kind == TOKENIZER_BPE_JSON && t.bos_id == -1 && t.eos_id == -1);
    fuzz_check_tokenizer(&t, data, size);
    for (int i = 0; i < t.vocab_size && i < 5000; i++) {
        if (!(t.literal[i] & TOK_LIT_PASS1)) continue;
        int n, *ids = tokenizer_encode(&t, t.pieces[i], (size_t)t.piece_len[i], 0, 0, &n);
        FUZZ_ASSERT(ids != NULL && n == 1 && ids[0] == i);
        free(ids);
    }
    tokenizer_free(&t);
    return 0;
}
