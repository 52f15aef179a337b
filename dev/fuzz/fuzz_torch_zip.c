// A whole torch.save file (pytorch_model.bin) from arbitrary bytes: pt_open on it (the ZIP
// end records, central directory, local headers, byteorder, and data.pkl through the
// restricted unpickler), and pt_parse_bytes on the same bytes, which must agree. A refusal
// must say why, naming the file; an accepted file's tensors must lie in the file, be
// F32/F16/BF16 with their byte size, sorted and unique, and read back whole and in part.
#include "../../support/torch_zip.h"
#include "fuzz.h"

static void check_tensors(StFile *sf, uint64_t size) {
    for (int i = 0; i < sf->n_tensors; i++) {
        const StTensor *t = &sf->tensors[i];
        FUZZ_ASSERT(t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16);
        FUZZ_ASSERT(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        FUZZ_ASSERT(t->begin <= t->end && t->end <= size && t->end - t->begin == t->numel * (uint64_t)st_dtype_size(t->dtype));
        if (i > 0) FUZZ_ASSERT(strcmp(sf->tensors[i - 1].name, t->name) < 0);
        FUZZ_ASSERT(st_find(sf, t->name) == t);
        // numel <= the file size: every element is at least two bytes of it
        float *f = (float *)malloc((size_t)t->numel * sizeof(float) + 1);
        FUZZ_ASSERT(f);
        FUZZ_ASSERT(st_read_f32(sf, t, 0, t->numel, f) == 0);
        FUZZ_ASSERT(st_read_f32(sf, t, t->numel / 2, t->numel - t->numel / 2, f) == 0);
        fuzz_stderr_begin();
        FUZZ_ASSERT(st_read_f32(sf, t, t->numel, 1, f) == -1); // past the end
        FUZZ_ASSERT(fuzz_stderr_end(sf->path));
        free(f);
    }
}

FUZZ_TARGET(torch_zip) {
    char p[4096];
    fuzz_path(p, sizeof p, "pytorch_model.bin");
    fuzz_write(p, data, size);
    StFile sf, pure;
    fuzz_stderr_begin();
    int r = pt_open(&sf, p);
    int said = fuzz_stderr_end(p); // "error: <path>: ..."
    fuzz_stderr_begin();
    int r2 = pt_parse_bytes(&pure, p, data, size);
    fuzz_stderr_end(NULL);
    FUZZ_ASSERT(r == r2);
    if (r != 0) {
        FUZZ_ASSERT(said && sf.tensors == NULL && sf.f == NULL && sf.n_tensors == 0);
        FUZZ_ASSERT(pure.tensors == NULL && pure.n_tensors == 0);
        return 0;
    }
    FUZZ_ASSERT(pure.f == NULL && pure.n_tensors == sf.n_tensors);
    for (int i = 0; i < sf.n_tensors; i++)
        FUZZ_ASSERT(strcmp(pure.tensors[i].name, sf.tensors[i].name) == 0 && pure.tensors[i].begin == sf.tensors[i].begin &&
                    pure.tensors[i].end == sf.tensors[i].end);
    check_tensors(&sf, size);
    st_close(&pure);
    st_close(&sf);
    return 0;
}
