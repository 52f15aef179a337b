// A sharded checkpoint's model.safetensors.index.json from arbitrary bytes:
// weights_open on a folder holding it and two small valid shards
// (model-00001-of-00002.safetensors with tensors a and b, model-00002-of-00002
// with c). When it opens, every tensor of the shards it names is mapped, and
// every entry resolves to its shard and reads.
#include "../../support/weights.h"
#include "fuzz.h"

static void make_shard(const char *file, const char *const *names, int n) {
    static float data[4][4];
    StWriteTensor ts[4];
    memset(ts, 0, sizeof ts);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 4; j++) data[i][j] = (float)(names[i][0] * 10 + j);
        ts[i].name = names[i]; ts[i].dtype = ST_F32; ts[i].ndim = 1; ts[i].shape[0] = 4; ts[i].data = data[i];
    }
    char p[4096];
    fuzz_path(p, sizeof p, file);
    FUZZ_ASSERT(st_write(p, ts, n, NULL, 0) == 0);
}

FUZZ_TARGET(st_index) {
    static int init = 0;
    if (!init) {
        const char *s1[2] = {"a", "b"}, *s2[1] = {"c"};
        make_shard("model-00001-of-00002.safetensors", s1, 2);
        make_shard("model-00002-of-00002.safetensors", s2, 1);
        init = 1;
    }
    char p[4096];
    fuzz_path(p, sizeof p, "model.safetensors.index.json");
    fuzz_write(p, data, size);
    Weights m;
    fuzz_stderr_begin();
    int r = weights_open(&m, fuzz_tmpdir());
    int said = fuzz_stderr_end(fuzz_tmpdir()); // names the folder, the index or a shard
    if (r != 0) {
        FUZZ_ASSERT(said && m.files == NULL && m.entries == NULL && m.n_entries == 0);
        return 0;
    }
    // every tensor of every shard it names is mapped (an empty weight_map names none)
    int total = 0;
    for (int i = 0; i < m.n_files; i++) total += m.files[i].n_tensors;
    FUZZ_ASSERT(m.n_files >= 0 && m.n_files <= 2 && m.n_entries == total);
    for (int i = 0; i < m.n_entries; i++) {
        const WeightsEntry *e = weights_find(&m, m.entries[i].name);
        float v[4];
        FUZZ_ASSERT(e == &m.entries[i] && e->tensor == st_find(&m.files[e->file], e->name));
        FUZZ_ASSERT(weights_read_f32(&m, e, 0, 4, v) == 0 && v[1] == (float)(e->name[0] * 10 + 1));
        if (i > 0) FUZZ_ASSERT(strcmp(m.entries[i - 1].name, m.entries[i].name) < 0);
    }
    FUZZ_ASSERT(weights_find(&m, "d") == NULL);
    weights_close(&m);
    return 0;
}
