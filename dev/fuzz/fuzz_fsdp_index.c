// A sharded checkpoint (fsdp.h) from arbitrary bytes, read as a resume reads it:
// fsdp_load of every rank's shard of two buffers ("params", "exp_avg") of a
// one-layer model, resharded 2 ways from whatever shard count the index claims.
// The input is sections separated by the line "=====": first fsdp_index.json,
// then the shard files fsdp-<k>-of-<m>.safetensors, k = 0 .. m-1 for m shard
// sections (an index that claims another count finds files missing).
// Properties: a refusal says why, naming the checkpoint folder or a file in it;
// an accepted checkpoint leaves every shard's padding zero.
#define _GNU_SOURCE // memmem
#include "../../fsdp.h"
#include "fuzz.h"

#define SEP "\n=====\n"
#define MAX_SHARD_FILES 8

FUZZ_TARGET(fsdp_index) {
    static FsdpUnits u;
    static char fp[17], dir[600];
    static float *bufs_data[2];
    static int init = 0;
    if (!init) {
        fsdp_units_llama(&u, 1, 4, 8, 4, 2, 6, 0, 2); // layers, dim, hidden, q_dim, kv_dim, vocab, untied, 2 shards
        fsdp_fingerprint(&u, "fuzz", fp);
        for (int b = 0; b < 2; b++) bufs_data[b] = (float *)mallocCheck(u.shard_numel * sizeof(float));
        fuzz_path(dir, sizeof dir, "ckpt");
        init = 1;
    }
    FUZZ_ASSERT(remove_tree(dir) == 0 && mkdir(dir, 0755) == 0);
    // split into sections: the index, then up to MAX_SHARD_FILES shards
    const uint8_t *p = data, *end = data + size, *sec[1 + MAX_SHARD_FILES];
    size_t len[1 + MAX_SHARD_FILES];
    int n = 0;
    do { // (an empty input is an empty index)
        const uint8_t *at = size ? (const uint8_t *)memmem(p, (size_t)(end - p), SEP, strlen(SEP)) : NULL;
        sec[n] = p;
        len[n++] = (size_t)((at ? at : end) - p);
        p = at ? at + strlen(SEP) : NULL;
    } while (p && n < 1 + MAX_SHARD_FILES);
    char path[FSDP_PATH_MAX];
    FUZZ_ASSERT(fsdp__path(path, dir, FSDP_INDEX_NAME, 0, 0) == 0);
    fuzz_write(path, sec[0], len[0]);
    for (int k = 1; k < n; k++) {
        FUZZ_ASSERT(fsdp__path(path, dir, NULL, k - 1, n - 1) == 0);
        fuzz_write(path, sec[k], len[k]);
    }
    for (int rank = 0; rank < u.n_shards; rank++) {
        FsdpBuffer bufs[2] = {{"params", bufs_data[0], 0, NULL, NULL, ST_F32, NULL, NULL},
                              {"exp_avg", bufs_data[1], 0, NULL, NULL, ST_F32, NULL, NULL}};
        for (int b = 0; b < 2; b++) memset(bufs_data[b], 0xff, u.shard_numel * sizeof(float)); // NaN: padding must be written
        fuzz_stderr_begin();
        int r = fsdp_load(dir, &u, bufs, 2, rank, fp);
        int said = fuzz_stderr_end(dir);
        if (r != 0) { FUZZ_ASSERT(said); return 0; }
        for (int b = 0; b < 2; b++)
            for (int i = 0; i < u.n_units; i++) {
                size_t begin, count = fsdp_shard_range(u.units[i].numel, u.n_shards, u.align, rank, &begin);
                for (size_t j = count; j < u.units[i].shard; j++)
                    FUZZ_ASSERT(bufs_data[b][u.units[i].shard_offset + j] == 0.0f);
            }
    }
    return 0;
}
