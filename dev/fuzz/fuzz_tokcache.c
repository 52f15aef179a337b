// A token cache (`<data>.tokcache`, dataloader.h) from arbitrary bytes, next to
// a fixed data file: cache_open must refuse it with a reason, or accept only a
// cache that the loader can then use safely. The first byte is for the harness
// (so that fuzzing gets past the checks a random file never passes), the rest
// is the cache file:
//   bit 0: copy the identity fields (magic, version, endianness, format, the
//          template, tokenizer and data hashes, the data's size and mtime) from
//          the real cache's header
//   bit 1: set file_size to the input's size
//   bit 2: recompute the checksum (a forged cache: the checksum is not
//          cryptographic, it only catches damage)
// What is accepted is then loaded by dataset_load: it must refuse the cache
// with a message naming it (or the data file), or give rows whose tokens are in the vocabulary,
// whose targets are -100 or the next token, and whose label counts add up.
#include "../../dataloader.h"
#include "fuzz.h"

FUZZ_TARGET(tokcache) {
    static Tokenizer tok;
    static char tokpath[4096], path[600], cache[4096]; // (short: gcc -O3 warns when a longer one could overflow a message)
    static CacheHeader real;
    static int init = 0;
    DataOptions o;
    memset(&o, 0, sizeof o);
    o.max_seq_len = 64; // room for the chat samples' responses (else all are skipped)
    o.quiet = 1;
    if (!init) { // the fixture data in a file of our own, its cache built once
        size_t n;
        unsigned char *b = fuzz_slurp_fixture("test/fixtures/data/chat.jsonl", &n);
        fuzz_path(path, sizeof path, "data.jsonl");
        fuzz_write(path, b, n);
        free(b);
        fuzz_fixture(tokpath, sizeof tokpath, "test/fixtures/tiny_gqa/tokenizer.model");
        FUZZ_ASSERT(tokenizer_load(&tok, tokpath) == 0);
        Dataset ds;
        FUZZ_ASSERT(dataset_load(&ds, path, &tok, tokpath, &o) == 0 && ds.cache_path[0]);
        snprintf(cache, sizeof cache, "%s", ds.cache_path);
        dataset_free(&ds);
        FILE *f = fopen(cache, "rb");
        FUZZ_ASSERT(f && fread(&real, 1, sizeof real, f) == sizeof real);
        fclose(f);
        init = 1;
    }
    if (size < 1) return 0;
    int flags = data[0];
    size_t n = size - 1;
    unsigned char *c = (unsigned char *)malloc(n + sizeof(CacheHeader)); // room to patch a header in
    FUZZ_ASSERT(c != NULL);
    memcpy(c, data + 1, n);
    CacheHeader h;
    if (n >= sizeof h && (flags & 7)) {
        memcpy(&h, c, sizeof h);
        if (flags & 1) {
            memcpy(h.magic, real.magic, sizeof h.magic);
            h.version = real.version; h.endian = real.endian;
            h.requested_format = real.requested_format; h.format = real.format;
            h.templates_hash = real.templates_hash; h.tokenizer_hash = real.tokenizer_hash;
            h.data_size = real.data_size; h.data_mtime_ns = real.data_mtime_ns; h.data_hash = real.data_hash;
        }
        if (flags & 2) h.file_size = n;
        if ((flags & 4) && n % 8 == 0) h.checksum = cache_checksum(&h, data_hash_words(DATA_HASH_SEED, c + sizeof h, n - sizeof h));
        memcpy(c, &h, sizeof h);
    }
    fuzz_write(cache, c, n);
    free(c);

    char why[256];
    DataStore *s = cache_open(cache, &real, why, sizeof why);
    if (!s) {
        FUZZ_ASSERT(why[0]); // the file exists: a reason, not "no cache"
        return 0;
    }
    store_release(s);
    // accepted: the loader reuses it (a refusal must name the data or the cache)
    Dataset ds;
    int r = dataset_load(&ds, path, &tok, tokpath, &o);
    if (r != 0) {
        FUZZ_ASSERT(strstr(ds.error, path) != NULL); // the data file or its cache (the same name + .tokcache)
        return 0;
    }
    FUZZ_ASSERT(ds.cache_status == CACHE_REUSED);
    int tokens[2 * 64], targets[2 * 64]; // (a pair's two rows, should a forged header say preference)
    fuzz_check_rows(&ds, &tok, tokens, targets);
    dataset_free(&ds);
    return 0;
}
