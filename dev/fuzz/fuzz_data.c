// A dataset file from arbitrary bytes through dataset_load (dataloader.h): the
// record reader (JSONL lines, or the elements of one JSON array), format
// detection, every format's record parser (text, prompt_response, alpaca,
// samsum, chat, preference pairs plain or conversational), tokenization with the tiny model's
// 512-piece tokenizer (Llama-2's chat template), the slice and max_samples selection, padding
// or packing, and the token cache.
// The first two bytes pick the options, the rest is the file:
//   byte 0: bits 0-2 the format (auto, text, prompt_response, alpaca, samsum,
//           chat, preference; 7: auto), bit 3 packing, bit 4 train_on_prompt,
//           bits 5-7 max_seq_len (2, 3, 5, 8, 16, 33, 64, 256)
//   byte 1: bits 0-2 the slice, bits 3-4 max_samples (0-3)
// A refusal must name the file. What loads must be consistent: every row's
// tokens in the vocabulary, targets either -100 or the next token, the label
// counts adding up; loading again must reuse the cache it wrote and give the
// same rows; a validation split must deal out every sample once.
#include "../../dataloader.h"
#include "fuzz.h"

static const int seq_lens[8] = {2, 3, 5, 8, 16, 33, 64, 256};
static const char *const slices[8] = {"", "[:50%]", "[1:]", "[-1:]", "train[10%:90%]", "[:2]", "[50%:]", "[0:0]"};

FUZZ_TARGET(data) {
    static Tokenizer tok;
    static char tokpath[4096];
    static int init = 0;
    if (!init) {
        fuzz_fixture(tokpath, sizeof tokpath, "test/fixtures/tiny_gqa/tokenizer.model");
        FUZZ_ASSERT(tokenizer_load(&tok, tokpath) == 0);
        init = 1;
    }
    if (size < 2) return 0;
    int fmt = data[0] & 7;
    DataOptions o;
    memset(&o, 0, sizeof o);
    o.format = data_format_names[fmt <= FORMAT_PREFERENCE ? fmt : FORMAT_AUTO];
    o.packing = (data[0] >> 3) & 1;
    o.train_on_prompt = (data[0] >> 4) & 1;
    o.max_seq_len = seq_lens[data[0] >> 5];
    o.slice = slices[data[1] & 7];
    o.max_samples = (data[1] >> 3) & 3;
    o.quiet = 1;
    char path[600]; // (short: gcc -O3 warns when a longer one could overflow a message)
    fuzz_path(path, sizeof path, "data.jsonl");
    fuzz_write(path, data + 2, size - 2);

    Dataset ds, again;
    if (dataset_load(&ds, path, &tok, tokpath, &o) != 0) {
        FUZZ_ASSERT(strstr(ds.error, path) != NULL); // "<path>: ..." or "<path>:<line>: ..."
        return 0;
    }
    FUZZ_ASSERT(ds.n_samples >= 1 && (!o.max_samples || ds.n_samples <= o.max_samples));
    FUZZ_ASSERT(ds.format >= FORMAT_TEXT && ds.format <= FORMAT_PREFERENCE && (fmt == FORMAT_AUTO || fmt > FORMAT_PREFERENCE || ds.format == fmt));
    size_t room = (size_t)2 * o.max_seq_len * sizeof(int); // (a pair is two rows)
    int *tokens = (int *)malloc(room), *targets = (int *)malloc(room), *tokens2 = (int *)malloc(room), *targets2 = (int *)malloc(room);
    FUZZ_ASSERT(tokens && targets && tokens2 && targets2);
    fuzz_check_rows(&ds, &tok, tokens, targets);

    // the cache just written is reused, with the same rows
    FUZZ_ASSERT(dataset_load(&again, path, &tok, tokpath, &o) == 0);
    FUZZ_ASSERT(again.cache_status == CACHE_REUSED && again.n_rows == ds.n_rows && again.n_labels == ds.n_labels &&
                again.n_tokens == ds.n_tokens && again.n_skipped == ds.n_skipped);
    for (long r = 0; r < ds.n_rows; r++) {
        int T, T2;
        dataset_get_rows(&ds, r, 1, tok.eos_id, tokens, targets, &T);
        dataset_get_rows(&again, r, 1, tok.eos_id, tokens2, targets2, &T2);
        size_t n = (size_t)(ds.format == FORMAT_PREFERENCE ? 2 : 1) * T * sizeof(int);
        FUZZ_ASSERT(T == T2 && !memcmp(tokens, tokens2, n) && !memcmp(targets, targets2, n));
    }
    dataset_free(&again);

    // a validation split of a third: disjoint halves holding every sample once
    if (ds.n_samples >= 3) {
        Dataset train, val;
        FUZZ_ASSERT(dataset_split(&ds, 1.0 / 3, 7, &train, &val) == 0);
        FUZZ_ASSERT(train.n_samples + val.n_samples == ds.n_samples && val.n_samples >= 1 && train.n_samples >= 1);
        fuzz_check_rows(&train, &tok, tokens, targets);
        fuzz_check_rows(&val, &tok, tokens, targets);
        dataset_free(&train);
        dataset_free(&val);
    }
    free(tokens); free(targets); free(tokens2); free(targets2);
    dataset_free(&ds);
    return 0;
}
