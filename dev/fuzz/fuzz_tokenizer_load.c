// tokenizer.model from arbitrary bytes: tokenizer_load_from_memory. A model
// that loads is then used (fuzz_check_tokenizer): a fixed text and the input's
// own first bytes are encoded (every id must be in range) and decoded, and the
// whole vocabulary and some out-of-range ids are decoded. (An input starting
// with '{' is read as a tokenizer.json: fuzz_tokenizer_json covers those.)
#include "../../tokenizer.h"
#include "fuzz.h"

FUZZ_TARGET(tokenizer_load) {
    Tokenizer t;
    fuzz_stderr_begin();
    int r = tokenizer_load_from_memory(&t, data, size, "fuzz");
    int said = fuzz_stderr_end("error: tokenizer fuzz: ");
    if (r != 0) {
        FUZZ_ASSERT(said && t.vocab_size == 0 && t.pieces == NULL && t.table == NULL);
        return 0;
    }
    fuzz_check_tokenizer(&t, data, size);
    tokenizer_free(&t);
    return 0;
}
