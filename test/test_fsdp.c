// Tests for fsdp.h. test/test_fsdp.sh runs this program alone and under
// `mpirun -np 1, 2, 3`; the modes:
//   test_fsdp               everything below that runs in one process (shard
//                           arithmetic, units, rank-local loading and checkpoints
//                           for every rank of n = 1..5 in turn), then the collectives
//   test_fsdp collectives   the parts that need real ranks: collectives against
//                           plain loops, every strategy's gather and gradient
//                           reduction, loading and a checkpoint at this world size
//   test_fsdp save DIR      writes a sharded checkpoint of known values at this world size
//   test_fsdp load DIR      loads it at this world size: must be those values, bit for bit
//   test_fsdp fault KIND    rank 1 fails (abort: bad input and fsdp_abort; exit: die();
//                           kill: SIGKILL) while the others wait in a barrier; mismatch:
//                           rank 1 enters an all-gather of another size (the TCP
//                           backend's message headers catch it)
// The references are independent of fsdp.h: model_load of the trainer (which
// test_llama2 checks against transformers), element-by-element ownership, and
// sums written out as loops. Every comparison is exact (memcmp or ==): sharding
// moves floats without arithmetic, and the MPI backend's sums are defined to run
// in rank order, which the references follow.
#define TESTING
#include "../train_llama2.c"
#include "../fsdp.h"
#include "test_common.h"

// F32 single file; BF16 in 2 shards, tied; BF16 with head_dim != hidden_size / heads, tied; BF16 with 32016 rows
static const char *models[] = {"test/fixtures/tiny_gqa", "test/fixtures/tiny_tied", "test/fixtures/tiny_llama3",
                               "test/fixtures/tiny_codellama"};
enum { N_MODELS = sizeof models / sizeof models[0] };
static FsdpComm world;

// a check every rank takes part in: rank 0 prints it, failing ranks say why on stderr
static void check_all(int cond, const char *what, const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    int bad = fsdp_any(&world, !cond);
    if (!cond && world.rank != 0) fprintf(stderr, "rank %d: %s: %s\n", world.rank, what, detail);
    if (world.rank == 0) CHECK(!bad, what, "%s", cond ? "failed on another rank (see its message)" : detail);
    else if (bad) test_failed++;
}

// the trainer's copy of a tensor (model_load's layout: all layers of a kind together), and its numel
static const float *trainer_tensor(const HostModel *m, const char *name, size_t *numel) {
    float *ptrs[NUM_PARAM_TENSORS];
    param_tensors(&m->w, ptrs);
    char buf[256];
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        if (p == P_HEAD && m->config.tied) continue;
        int64_t rows, cols;
        param_shape(&m->config, p, &rows, &cols);
        for (int l = 0; l < (param_per_layer(p) ? m->config.n_layers : 1); l++) {
            param_name(p, l, buf, sizeof buf);
            *numel = (size_t)(rows * cols);
            if (strcmp(buf, name) == 0) return ptrs[p] + (size_t)l * *numel;
        }
    }
    return NULL;
}

// unit i whole, from model_load's weights (numel floats, malloc'd)
static float *reference_unit(const HostModel *m, const FsdpUnit *un) {
    float *x = (float *)mallocCheck(un->numel * sizeof(float));
    for (int j = 0; j < un->n_tensors; j++) {
        size_t n;
        const float *src = trainer_tensor(m, un->tensors[j].name, &n);
        if (!src || n != un->tensors[j].numel) { fprintf(stderr, "no trainer tensor %s\n", un->tensors[j].name); exit(2); }
        memcpy(x + un->tensors[j].offset, src, n * sizeof(float));
    }
    return x;
}

// ----------------------------------------------------------------------------
// shard arithmetic

static void test_shard_arithmetic(void) {
    size_t numels[] = {0, 1, 2, 3, 5, 7, 8, 9, 100, 101, 4099};
    int bad = 0;
    for (size_t a = 0; a < sizeof numels / sizeof *numels; a++)
        for (int n = 1; n <= 9; n++) {
            size_t numel = numels[a], S = fsdp_shard_size(numel, n, 1), next = 0;
            // S is the smallest size with n * S >= numel
            bad |= n * S < numel || (S > 0 && n * (S - 1) >= numel);
            for (int r = 0; r < n; r++) { // each element owned once, in order, element i by rank i / S
                size_t begin, count = fsdp_shard_range(numel, n, 1, r, &begin);
                bad |= count > S || (count > 0 && begin != next);
                for (size_t i = begin; i < begin + count; i++) bad |= i / S != (size_t)r;
                next = begin + count;
            }
            bad |= next != numel;
        }
    CHECK(!bad, "shard arithmetic: S = ceil(numel / n), ranks own [r*S, (r+1)*S) clipped, every element once (numel 0..4099, n 1..9)", "mismatch");
}

// every parameter of the trainer in exactly one unit, with its shape; units contiguous
static void test_units(const char *dir) {
    HostModel m = {0};
    if (model_load(&m, dir) != 0) { CHECK(0, "units: model_load", "%s", dir); return; }
    FsdpUnits u;
    model_units(&m.config, &u, 3);
    char what[300], name[256];
    int missing = 0, count = 0;
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        if (p == P_HEAD && m.config.tied) continue;
        int64_t rows, cols;
        param_shape(&m.config, p, &rows, &cols);
        for (int l = 0; l < (param_per_layer(p) ? m.config.n_layers : 1); l++, count++) {
            param_name(p, l, name, sizeof name);
            int hits = 0;
            for (int i = 0; i < u.n_units; i++)
                for (int j = 0; j < u.units[i].n_tensors; j++)
                    hits += strcmp(u.units[i].tensors[j].name, name) == 0 && u.units[i].tensors[j].numel == (size_t)(rows * cols);
            missing += hits != 1;
        }
    }
    int tensors = 0, gaps = 0;
    size_t total = 0, shard_total = 0;
    for (int i = 0; i < u.n_units; i++) {
        size_t off = 0;
        for (int j = 0; j < u.units[i].n_tensors; j++, tensors++) {
            gaps += u.units[i].tensors[j].offset != off;
            off += u.units[i].tensors[j].numel;
        }
        gaps += off != u.units[i].numel || u.units[i].shard_offset != shard_total;
        total += off;
        shard_total += u.units[i].shard;
    }
    snprintf(what, sizeof what, "units of %s: embed, %d layers, head; every parameter in exactly one unit, nothing else, no gaps",
             dir, m.config.n_layers);
    CHECK(missing == 0 && tensors == count && gaps == 0 && total == m.num_params && u.numel == m.num_params &&
          shard_total == u.shard_numel && u.n_units == m.config.n_layers + 2,
          what, "%d parameters not found once, %d unit tensors for %d parameters, %d gaps, %zu elements for %zu", missing,
          tensors, count, gaps, total, m.num_params);
    fsdp_units_free(&u);
    host_model_free(&m);
}

// QLoRA's packed units: n = 1..5 ranks each quantize only their bytes of every layer's run
// (model_load_shard), and the ranks' shards laid side by side are the whole model's runs
// (model_load) byte for byte, zero-padded; no packed unit takes room among the floats
static void test_packed_units(const char *dir) {
    for (int dq = 0; dq <= 1; dq++) {
        HostModel whole = {0};
        whole.quant_type = QUANT_NF4, whole.double_quant = dq;
        if (model_load(&whole, dir) != 0) { CHECK(0, "packed units: model_load --quantize nf4", "%s", dir); return; }
        int bad = 0, layout = 0;
        for (int n = 1; n <= 5; n++)
            for (int r = 0; r < n; r++) {
                HostModel h = {0};
                h.quant_type = QUANT_NF4, h.double_quant = dq;
                if (model_load_shard(&h, dir, r, n) != 0) { bad++; continue; }
                for (int i = 0; i < h.units.n_units; i++) {
                    const FsdpUnit *un = &h.units.units[i];
                    int layer = i >= 1 && i <= h.config.n_layers;
                    layout += (layer != (un->packed == h.run_bytes)) || (layer && (un->shard != 0 || un->packed_shard % 16 ||
                               un->packed_shard * n < un->packed || un->packed_shard >= fsdp_shard_size(un->packed, n, 1) + 16));
                    if (!layer) continue;
                    size_t begin = (size_t)r * un->packed_shard;
                    for (size_t b = 0; b < un->packed_shard; b++) {
                        uint8_t want = begin + b < un->packed ? whole.quant_bytes[(size_t)(i - 1) * whole.run_bytes + begin + b] : 0;
                        bad += h.quant_shards[un->packed_offset + b] != want;
                    }
                }
                host_model_free(&h);
            }
        char what[256];
        snprintf(what, sizeof what, "packed units of %s (nf4, double quantization %d): every rank's bytes of the runs, "
                 "quantized alone, are the whole model's at n = 1..5", dir, dq);
        CHECK(bad == 0 && layout == 0, what, "%d bytes differ (or loads failed), %d units laid out wrong", bad, layout);
        host_model_free(&whole);
    }
}

// ----------------------------------------------------------------------------
// rank-local loading: every rank of n = 1..5, each read alone, against model_load

// Read spy: the checkpoint files' FILE streams are swapped for unbuffered ones
// that record which bytes are read, so the test sees every byte a rank reads.
typedef struct { int fd; unsigned char *hits; size_t size; } Spy;

static ssize_t spy_read(void *cookie, char *buf, size_t n) {
    Spy *s = (Spy *)cookie;
    off_t pos = lseek(s->fd, 0, SEEK_CUR);
    ssize_t k = read(s->fd, buf, n);
    for (ssize_t i = 0; i < k && (size_t)(pos + i) < s->size; i++)
        if (s->hits[pos + i] < 255) s->hits[pos + i]++;
    return k;
}
static int spy_seek(void *cookie, off64_t *off, int whence) {
    off_t r = lseek(((Spy *)cookie)->fd, *off, whence);
    if (r < 0) return -1;
    *off = r;
    return 0;
}
static int spy_close(void *cookie) { return close(((Spy *)cookie)->fd); }

static void spy_install(Weights *sm, Spy *spies) {
    cookie_io_functions_t io = {spy_read, NULL, spy_seek, spy_close};
    for (int i = 0; i < sm->n_files; i++) {
        StFile *f = &sm->files[i];
        spies[i].fd = dup(fileno(f->f));
        spies[i].size = f->file_size;
        spies[i].hits = (unsigned char *)callocCheck(f->file_size, 1);
        fclose(f->f);
        f->f = fopencookie(&spies[i], "rb", io);
        setvbuf(f->f, NULL, _IONBF, 0);
    }
}

// owner[file][byte]: the rank of n that must read the byte (the rank owning its element), else 255
static unsigned char **byte_owners(const FsdpUnits *u, const Weights *sm) {
    unsigned char **owner = (unsigned char **)callocCheck((size_t)sm->n_files, sizeof *owner);
    for (int i = 0; i < sm->n_files; i++) {
        owner[i] = (unsigned char *)mallocCheck(sm->files[i].file_size);
        memset(owner[i], 255, sm->files[i].file_size);
    }
    for (int i = 0; i < u->n_units; i++)
        for (int j = 0; j < u->units[i].n_tensors; j++) {
            const FsdpTensor *t = &u->units[i].tensors[j];
            const WeightsEntry *we = weights_find(sm, t->name);
            const StTensor *st = we->tensor;
            size_t es = (size_t)st_dtype_size(st->dtype), S = u->units[i].shard;
            for (size_t e = 0; e < t->numel; e++)
                memset(owner[we->file] + st->begin + e * es, (int)((t->offset + e) / S), es);
        }
    // a tied model's stored lm_head (pytorch_model.bin keeps one): each rank compares its own
    // range of it with the embedding's (fsdp_check_tied_head)
    const WeightsEntry *head = u->tied ? weights_find(sm, "lm_head.weight") : NULL;
    const FsdpTensor *embed = &u->units[0].tensors[0];
    size_t hs = head ? (size_t)st_dtype_size(head->tensor->dtype) : 0;
    for (size_t e = 0; head && e < embed->numel; e++)
        memset(owner[head->file] + head->tensor->begin + e * hs, (int)((embed->offset + e) / u->units[0].shard), hs);
    return owner;
}

// Meta's layout (weights.h reassembles each tensor from its parts): need[file][byte] 1 for
// the bytes of every part (of a replicated tensor, part 0's), else 0
static unsigned char **meta_bytes(const Weights *sm) {
    unsigned char **need = (unsigned char **)callocCheck((size_t)sm->n_files, sizeof *need);
    for (int i = 0; i < sm->n_files; i++) need[i] = (unsigned char *)callocCheck(sm->files[i].file_size, 1);
    for (int i = 0; i < sm->n_entries; i++) {
        const WeightsEntry *e = &sm->entries[i];
        for (int k = 0; k < (e->cat < 0 ? 1 : e->n_parts); k++) memset(need[k] + e->parts[k]->begin, 1, e->parts[k]->end - e->parts[k]->begin);
    }
    return need;
}

static void test_load(const char *dir) {
    HostModel m = {0};
    if (model_load(&m, dir) != 0) { CHECK(0, "load: model_load", "%s", dir); return; }
    char what[300];
    for (int n = 1; n <= 5; n++) {
        FsdpUnits u;
        model_units(&m.config, &u, n);
        Weights sm;
        if (weights_open(&sm, dir) != 0) exit(2);
        float *shards = (float *)mallocCheck((size_t)n * u.shard_numel * sizeof(float)); // rank r's at r * shard_numel
        int rc = 0, wrong = 0, padding = 0, foreign = 0, missed = 0;
        int meta = sm.whole != NULL; // Meta's layout: a tensor's elements come from several files
        unsigned char **owner = meta ? meta_bytes(&sm) : byte_owners(&u, &sm);
        Spy *spies = (Spy *)callocCheck((size_t)sm.n_files, sizeof(Spy));
        spy_install(&sm, spies);
        for (int r = 0; r < n; r++) {
            rc |= fsdp_load_model(&u, &sm, r, shards + (size_t)r * u.shard_numel);
            // the bytes read so far must be rank <= r's, each once; then mark this rank's as done
            for (int i = 0; i < sm.n_files && !meta; i++)
                for (size_t b = 0; b < spies[i].size; b++) {
                    if (spies[i].hits[b] && owner[i][b] != r) foreign++;
                    if (owner[i][b] == r && spies[i].hits[b] != 1) missed++;
                    spies[i].hits[b] = 0;
                }
        }
        for (int i = 0; i < sm.n_files && meta; i++) // all ranks together: each byte once, nothing else
            for (size_t b = 0; b < spies[i].size; b++) {
                foreign += spies[i].hits[b] > owner[i][b];
                missed += spies[i].hits[b] < owner[i][b];
            }
        // concatenating the ranks' shards of a unit gives model_load's unit, then zeros
        for (int i = 0; i < u.n_units; i++) {
            const FsdpUnit *un = &u.units[i];
            float *ref = reference_unit(&m, un);
            float *cat = (float *)mallocCheck((size_t)n * un->shard * sizeof(float));
            for (int r = 0; r < n; r++)
                memcpy(cat + (size_t)r * un->shard, shards + (size_t)r * u.shard_numel + un->shard_offset, un->shard * sizeof(float));
            wrong += memcmp(cat, ref, un->numel * sizeof(float)) != 0;
            for (size_t k = un->numel; k < (size_t)n * un->shard; k++) padding += cat[k] != 0.0f;
            free(cat);
            free(ref);
        }
        snprintf(what, sizeof what, "rank-local load of %s, n = %d: the ranks' shards concatenated equal model_load, bit for bit, padding zero", dir, n);
        CHECK(rc == 0 && wrong == 0 && padding == 0, what, "rc %d, %d units differ, %d padding elements not zero", rc, wrong, padding);
        snprintf(what, sizeof what, meta ? "rank-local load of %s, n = %d: the ranks together read each byte of the tensors once, nothing else"
                                         : "rank-local load of %s, n = %d: each rank read exactly the bytes of its own elements, once", dir, n);
        CHECK(foreign == 0 && missed == 0, what, "%d bytes read by a rank that does not own them, %d own bytes not read exactly once",
              foreign, missed);
        for (int i = 0; i < sm.n_files; i++) { free(owner[i]); free(spies[i].hits); }
        free(owner);
        weights_close(&sm); // closes the spy streams
        free(spies);
        free(shards);
        fsdp_units_free(&u);
    }
    host_model_free(&m);
}

// ----------------------------------------------------------------------------
// bad input: the failing call's message, captured from stderr

static char tmpdir[256];

// runs fn(arg) with stderr sent to a file; returns its result, and what it printed in msg
static int capture(int (*fn)(void *), void *arg, char *msg, size_t n) {
    char path[300];
    snprintf(path, sizeof path, "%s/stderr.txt", tmpdir);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    int rc = fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t len;
    char *text = read_file(path, &len);
    snprintf(msg, n, "%s", text ? text : "");
    free(text);
    return rc;
}

typedef struct { const char *dir; const FsdpUnits *u; FsdpBuffer *bufs; int nb, rank; const char *fp; } LoadArgs;
static int load_args(void *a) {
    LoadArgs *l = (LoadArgs *)a;
    return fsdp_load(l->dir, l->u, l->bufs, l->nb, l->rank, l->fp);
}
static int load_model_args(void *a) {
    LoadArgs *l = (LoadArgs *)a;
    Weights sm;
    if (weights_open(&sm, l->dir) != 0) return -1;
    int rc = fsdp_load_model(l->u, &sm, l->rank, l->bufs[0].data);
    weights_close(&sm);
    return rc;
}

static void copy_model(const char *from, const char *to, const char *config_edit_from, const char *config_edit_to) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && sed -i 's/%s/%s/' '%s/config.json'", to, from, to,
             config_edit_from, config_edit_to, to);
    if (system(cmd) != 0) { fprintf(stderr, "cannot run: %s\n", cmd); exit(2); }
}

static void test_load_refusals(void) {
    Config c;
    if (config_load(&c, models[0]) != 0) exit(2);
    char dir[300], msg[4096];
    // a tied config over weights whose lm_head is not the embedding: every rank's range differs
    snprintf(dir, sizeof dir, "%s/tied_lie", tmpdir);
    copy_model(models[0], dir, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
    c.tied = 1;
    FsdpUnits u;
    model_units(&c, &u, 2);
    float *out = (float *)mallocCheck(u.shard_numel * sizeof(float));
    FsdpBuffer b = {"params", out, 0, NULL, NULL, ST_F32, NULL, NULL, NULL};
    int refused = 0;
    for (int r = 0; r < 2; r++) {
        LoadArgs a = {dir, &u, &b, 1, r, ""};
        refused += capture(load_model_args, &a, msg, sizeof msg) != 0 && strstr(msg, "differs from model.embed_tokens.weight");
    }
    CHECK(refused == 2, "rank-local load refuses a tied config whose stored lm_head differs (each rank, its own range)", "%s", msg);
    fsdp_units_free(&u);
    // config.json with more layers than the weights
    snprintf(dir, sizeof dir, "%s/more_layers", tmpdir);
    copy_model(models[0], dir, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    if (config_load(&c, dir) != 0) exit(2);
    model_units(&c, &u, 2);
    b.data = (float *)reallocCheck(out, u.shard_numel * sizeof(float));
    LoadArgs a = {dir, &u, &b, 1, 1, ""};
    int rc = capture(load_model_args, &a, msg, sizeof msg);
    CHECK(rc != 0 && strstr(msg, "model.layers.2.input_layernorm.weight' is missing"), "rank-local load refuses weights missing a layer, naming the tensor", "%s", msg);
    fsdp_units_free(&u);
    free(b.data);
}

// ----------------------------------------------------------------------------
// sharded checkpoints

// the value of element i of unit `unit` of buffer b: a function of the element, not of the sharding
static float ckpt_value(int b, int unit, size_t i) { return hash_uniform(((uint64_t)b << 32) ^ (uint64_t)unit, i) - 0.5f; }

// the part the third buffer holds of each unit: its matrices' elements (as AdamW8bit's codes
// are those of its 8-bit tensors), a function of the units' layout alone (ctx), not of the sharding
static size_t matrix_part(void *ctx, int unit, size_t x) {
    const FsdpUnit *un = &((const FsdpUnits *)ctx)->units[unit];
    size_t n = 0;
    for (int j = 0; j < un->n_tensors; j++) {
        const FsdpTensor *t = &un->tensors[j];
        if (t->ndim == 2 && x > t->offset) n += x - t->offset < t->numel ? x - t->offset : t->numel;
    }
    return n;
}

#define NBUF 3
static const char *buf_names[NBUF] = {"params", "exp_avg", "exp_avg.codes"};

// rank's buffers: two in the weights' layout (F32), one of bytes holding matrix_part, its units'
// pieces one after another (the layout worked out here from the shard ranges, not by fsdp.h);
// each element's value a function of its place in the unit (or in the unit's part). The sizes
// into bytes (when not NULL).
static void fill_buffers(const FsdpUnits *u, int rank, FsdpBuffer *bufs, size_t bytes[NBUF]) {
    for (int b = 0; b < NBUF; b++) {
        int part = b == 2;
        bufs[b] = (FsdpBuffer){buf_names[b], NULL, 0, NULL, NULL, part ? ST_U8 : ST_F32, part ? matrix_part : NULL, (void *)u, NULL};
        size_t n = 0; // the rank's part of every unit
        for (int i = 0; part && i < u->n_units; i++) {
            size_t begin, count = fsdp_shard_range(u->units[i].numel, u->n_shards, u->align, rank, &begin);
            n += matrix_part((void *)u, i, begin + count) - matrix_part((void *)u, i, begin);
        }
        if (bytes) bytes[b] = part ? n : u->shard_numel * sizeof(float);
        bufs[b].data = callocCheck((part ? n : u->shard_numel) + 1, part ? 1 : sizeof(float));
        for (int i = 0, at = 0; i < u->n_units; i++) {
            size_t begin, count = fsdp_shard_range(u->units[i].numel, u->n_shards, u->align, rank, &begin);
            if (!part) {
                for (size_t k = 0; k < count; k++) ((float *)bufs[b].data)[u->units[i].shard_offset + k] = ckpt_value(b, i, begin + k);
                continue;
            }
            size_t lo = matrix_part((void *)u, i, begin), hi = matrix_part((void *)u, i, begin + count);
            for (size_t k = lo; k < hi; k++) ((uint8_t *)bufs[b].data)[at++] = (uint8_t)(ckpt_value(b, i, k) * 1000.0f);
        }
    }
}
static void free_buffers(FsdpBuffer *bufs) { for (int b = 0; b < NBUF; b++) free(bufs[b].data); }

// a put (FsdpPutFn) into memory standing in for a buffer kept elsewhere (the CUDA trainer's, on
// its GPU): src's elements at first; most: the longest piece put
typedef struct { char *data; size_t es, most; } PutTarget;
static void put_into(void *ctx, size_t first, size_t count, const void *src) {
    PutTarget *t = (PutTarget *)ctx;
    memcpy(t->data + first * t->es, src, count * t->es);
    t->most = count > t->most ? count : t->most;
}

// loads rank's shards from dir; 1 if they are the expected values bit for bit, padding zero: into
// the buffers' data, and through their put (data NULL) into zeroed memory, no piece longer than a block
static int ckpt_matches(const char *dir, const FsdpUnits *u, int rank, const char *fp) {
    FsdpBuffer got[NBUF], want[NBUF], put[NBUF];
    PutTarget to[NBUF];
    size_t bytes[NBUF];
    fill_buffers(u, rank, want, bytes);
    fill_buffers(u, rank, got, NULL);
    fill_buffers(u, rank, put, NULL);
    for (int b = 0; b < NBUF; b++) {
        memset(got[b].data, 0xff, bytes[b]); // NaN: must all be overwritten
        memset(put[b].data, 0, bytes[b]);
        to[b] = (PutTarget){(char *)put[b].data, (size_t)st_dtype_size(put[b].dtype), 0};
        put[b].data = NULL, put[b].put = put_into, put[b].ctx = &to[b];
    }
    int ok = fsdp_load(dir, u, got, NBUF, rank, fp) == 0 && fsdp_load(dir, u, put, NBUF, rank, fp) == 0;
    for (int b = 0; b < NBUF; b++) {
        ok &= memcmp(got[b].data, want[b].data, bytes[b]) == 0 && memcmp(to[b].data, want[b].data, bytes[b]) == 0;
        ok &= to[b].most > 0 && to[b].most <= FSDP_CKPT_BLOCK;
        put[b].data = to[b].data;
    }
    free_buffers(got);
    free_buffers(want);
    free_buffers(put);
    return ok;
}

// every rank of n writes its shard, then the index: what fsdp_save does over n processes
// the units of c sharded n ways, each shard a multiple of align elements
static void units_aligned(const Config *c, FsdpUnits *u, int n, size_t align) {
    model_units(c, u, n);
    u->align = align;
    fsdp_units_set_shards(u, n);
}

static void save_all_ranks(const char *dir, const Config *c, int n, size_t align, const char *fp) {
    FsdpUnits u;
    units_aligned(c, &u, n, align);
    mkdir_p(dir);
    for (int r = 0; r < n; r++) {
        FsdpBuffer bufs[NBUF];
        fill_buffers(&u, r, bufs, NULL);
        if (fsdp_save_shard(dir, &u, bufs, NBUF, r, fp) != 0) exit(2);
        if (r == 0 && fsdp_save_index(dir, &u, bufs, NBUF, fp) != 0) exit(2);
        free_buffers(bufs);
    }
    fsdp_units_free(&u);
}

static void test_checkpoints(void) {
    Config c;
    if (config_load(&c, models[0]) != 0) exit(2);
    FsdpUnits u;
    char fp[17], dir[300], what[200];
    model_units(&c, &u, 1);
    fsdp_fingerprint(&u, "", fp);
    fsdp_units_free(&u);
    // shards aligned to 1 element or to 64 (as AdamW8bit aligns them to its blocks), saved
    // and loaded at another count and alignment
    for (int saved = 1; saved <= 4; saved++) {
        size_t saved_align = saved % 2 ? 1 : 64;
        snprintf(dir, sizeof dir, "%s/ckpt%d", tmpdir, saved);
        save_all_ranks(dir, &c, saved, saved_align, fp);
        for (int n = 1; n <= 4; n++) {
            size_t align = n == 3 ? 64 : 1;
            units_aligned(&c, &u, n, align);
            int ok = 1;
            for (int r = 0; r < n; r++) ok &= ckpt_matches(dir, &u, r, fp);
            snprintf(what, sizeof what, "checkpoint saved at n = %d (shards aligned to %zu), loaded at n = %d (to %zu): every rank's "
                     "buffers bit-identical, a byte buffer of a part of each unit's elements too, into memory and through put", saved,
                     saved_align, n, align);
            CHECK(ok, what, "mismatch or load error");
            fsdp_units_free(&u);
        }
    }
    // refusals, each on a fresh copy of the n = 3 checkpoint, loaded at n = 2 (rank 1 reads shards 1 and 2)
    char ref[300], msg[4096];
    snprintf(ref, sizeof ref, "%s/ckpt3", tmpdir);
    snprintf(dir, sizeof dir, "%s/bad", tmpdir);
    model_units(&c, &u, 2);
    FsdpBuffer bufs[NBUF];
    fill_buffers(&u, 1, bufs, NULL);
    LoadArgs a = {dir, &u, bufs, NBUF, 1, fp};
    struct { const char *what, *cmd, *expect, *expect2; } cases[] = {
        {"a flipped data byte in a shard", "printf '\\x55' | dd of=$D/fsdp-00002-of-00003.safetensors bs=1 seek=$(( $(stat -c %s $D/fsdp-00002-of-00003.safetensors) - 100 )) conv=notrunc 2>/dev/null",
         "fsdp-00002-of-00003.safetensors: tensor 'params/layers.1': elements [0, ", "do not match their checksum (corrupt file)"},
        {"a truncated shard", "truncate -s -4 $D/fsdp-00001-of-00003.safetensors", "fsdp-00001-of-00003.safetensors", "truncated"},
        {"a missing shard", "rm $D/fsdp-00002-of-00003.safetensors", "fsdp-00002-of-00003.safetensors: cannot open", NULL},
        {"a shard of another checkpoint", "cp $D/fsdp-00002-of-00003.safetensors $D/fsdp-00001-of-00003.safetensors",
         "fsdp-00001-of-00003.safetensors: not shard 1 of 3 of this checkpoint", NULL},
        {"a garbled shard header", "printf 'x' | dd of=$D/fsdp-00001-of-00003.safetensors bs=1 seek=8 conv=notrunc 2>/dev/null",
         "fsdp-00001-of-00003.safetensors: header is not valid JSON", NULL},
        {"a missing index (an incomplete checkpoint)", "rm $D/fsdp_index.json", "no fsdp_index.json", NULL},
        {"an index of another version", "sed -i 's/\"version\": 1/\"version\": 7/' $D/fsdp_index.json", "unsupported \"version\"", NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char cmd[1500];
        snprintf(cmd, sizeof cmd, "D='%s'; rm -rf $D && cp -r '%s' $D && %s", dir, ref, cases[k].cmd);
        if (system(cmd) != 0) { fprintf(stderr, "cannot run: %s\n", cmd); exit(2); }
        int rc = capture(load_args, &a, msg, sizeof msg);
        snprintf(what, sizeof what, "checkpoint load refuses %s, naming the file and the problem", cases[k].what);
        CHECK(rc != 0 && strstr(msg, cases[k].expect) && (!cases[k].expect2 || strstr(msg, cases[k].expect2)), what,
              "rc %d, message: %s", rc, msg);
    }
    // another model's checkpoint (the tied model's units), and the same layout with another identity
    FsdpUnits other;
    Config oc;
    if (config_load(&oc, models[1]) != 0) exit(2);
    model_units(&oc, &other, 2);
    char ofp[17], xfp[17];
    fsdp_fingerprint(&other, "", ofp);
    FsdpBuffer obufs[NBUF];
    fill_buffers(&other, 1, obufs, NULL);
    LoadArgs oa = {ref, &other, obufs, NBUF, 1, ofp};
    int rc = capture(load_args, &oa, msg, sizeof msg);
    CHECK(rc != 0 && strstr(msg, "the checkpoint is of another model"), "checkpoint load refuses another model's checkpoint", "%s", msg);
    fsdp_fingerprint(&u, "another base model", xfp);
    LoadArgs xa = {ref, &u, bufs, NBUF, 1, xfp};
    rc = capture(load_args, &xa, msg, sizeof msg);
    CHECK(rc != 0 && strstr(msg, "the checkpoint is of another model") && strcmp(fp, xfp) != 0,
          "checkpoint load refuses the same shapes with another model identity", "%s", msg);
    FsdpBuffer more[NBUF + 1] = {bufs[0], bufs[1], bufs[2], {"exp_avg_sq", bufs[1].data, 0, NULL, NULL, ST_F32, NULL, NULL, NULL}};
    LoadArgs ma = {ref, &u, more, NBUF + 1, 1, fp};
    rc = capture(load_args, &ma, msg, sizeof msg);
    CHECK(rc != 0 && strstr(msg, "has no buffer \"exp_avg_sq\""), "checkpoint load refuses a buffer it does not hold", "%s", msg);
    free_buffers(obufs);
    free_buffers(bufs);
    fsdp_units_free(&other);
    fsdp_units_free(&u);
}

// ----------------------------------------------------------------------------
// collectives, at the world size this runs at

// rank q's value of element i of test array `key`: every rank can compute every rank's data
static float rank_value(int key, int q, size_t i) { return hash_uniform((uint64_t)key * 1000 + (uint64_t)q, i) - 0.5f; }
// the same with bits beyond float's (a function, so the sums below are plain additions: no contraction into an FMA)
static double rank_value64(int key, int q, size_t i) { return rank_value(key, q, i) + rank_value(key + 100, q, i) * 0x1p-30; }

static void test_collectives(void) {
    int W = world.size, me = world.rank;
    size_t sizes[] = {1, 2, 3, 5, 7, 64, 1000, 4099};
    char what[200];
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++) {
        size_t S = sizes[a], n = sizes[a];
        float *shard = (float *)mallocCheck(S * sizeof(float)), *full = (float *)mallocCheck(W * S * sizeof(float));
        int bad = 0;
        // all-gather: rank order
        for (size_t i = 0; i < S; i++) shard[i] = rank_value(1, me, i);
        fsdp_all_gather(&world, full, shard, S);
        for (int q = 0; q < W; q++)
            for (size_t i = 0; i < S; i++) bad |= (full[q * S + i] != rank_value(1, q, i)) << 0;
        // reduce-scatter: my block, summed over the ranks in rank order
        for (size_t i = 0; i < W * S; i++) full[i] = rank_value(2, me, i);
        fsdp_reduce_scatter(&world, shard, full, S);
        for (size_t i = 0; i < S; i++) {
            float acc = rank_value(2, 0, me * S + i);
            for (int q = 1; q < W; q++) acc += rank_value(2, q, me * S + i);
            bad |= (shard[i] != acc) << 1;
        }
        // all-reduce, fp32 and fp64, n not a multiple of W
        for (size_t i = 0; i < n; i++) full[i] = rank_value(3, me, i);
        fsdp_all_reduce(&world, full, n, FSDP_F32);
        double *d = (double *)mallocCheck(n * sizeof(double));
        for (size_t i = 0; i < n; i++) d[i] = rank_value64(4, me, i);
        fsdp_all_reduce(&world, d, n, FSDP_F64);
        for (size_t i = 0; i < n; i++) {
            float acc = rank_value(3, 0, i);
            double dacc = rank_value64(4, 0, i);
            for (int q = 1; q < W; q++) acc += rank_value(3, q, i), dacc += rank_value64(4, q, i);
            bad |= (full[i] != acc) << 2 | (d[i] != dacc) << 3;
        }
        // broadcast from the last rank
        for (size_t i = 0; i < n; i++) d[i] = rank_value(5, me, i);
        fsdp_broadcast(&world, d, n * sizeof(double), W - 1);
        for (size_t i = 0; i < n; i++) bad |= (d[i] != (double)rank_value(5, W - 1, i)) << 4;
        snprintf(what, sizeof what, "collectives at W = %d, %zu elements: all-gather, reduce-scatter, all-reduce (fp32, fp64) in rank order, broadcast", W, S);
        check_all(!bad, what, "differs from the plain loop: %s%s%s%s%s", bad & 1 ? "all-gather " : "", bad & 2 ? "reduce-scatter " : "",
                  bad & 4 ? "all-reduce fp32 " : "", bad & 8 ? "all-reduce fp64 " : "", bad & 16 ? "broadcast" : "");
        free(d);
        free(shard);
        free(full);
    }
    fsdp_barrier(&world);
    int any_none = fsdp_any(&world, 0), any_last = fsdp_any(&world, me == W - 1);
    check_all(!any_none && any_last, "fsdp_any: set on the last rank only, every rank sees it; set nowhere, none does", "%d %d", any_none, any_last);
}

// every strategy, and HYBRID_SHARD with every group size that divides W and with
// 0 (the ranks of a node: all of them here): (strategy, --shard_group) pairs
static int strategy_configs(int W, int strategy[], int group[]) {
    int n = 0;
    for (int s = 0; s < FSDP_N_STRATEGIES; s++)
        for (int G = 0; G <= W; G++)
            if (s == FSDP_HYBRID_SHARD ? G == 0 || W % G == 0 : G == 1) {
                strategy[n] = s;
                group[n++] = s == FSDP_HYBRID_SHARD ? G : 0;
            }
    return n;
}

// each configuration: gather a unit from the shards, and reduce every rank's gradients into the shards
static void test_strategies(void) {
    int W = world.size, me = world.rank, strategy[64], group[64], n = strategy_configs(W, strategy, group);
    size_t numel = 1001; // not a multiple of 2 or 3
    char what[200];
    for (int c = 0; c < n; c++) {
        int s = strategy[c], G = group[c];
        Fsdp f;
        if (fsdp_init(&f, (FsdpStrategy)s, G) != 0) { check_all(0, "fsdp_init", "failed"); continue; }
        int g = f.shard.size;
        // a unit of numel elements, sharded over the group
        FsdpUnit un = {0};
        un.numel = numel;
        un.shard = fsdp_shard_size(numel, g, 1);
        float *shards = (float *)callocCheck(un.shard, sizeof(float)), *buf = (float *)mallocCheck(g * un.shard * sizeof(float));
        size_t begin, count = fsdp_shard_range(numel, g, 1, f.shard.rank, &begin);
        for (size_t k = 0; k < count; k++) shards[k] = rank_value(6, 0, begin + k);
        const float *whole = fsdp_gather(&f, &un, shards, buf);
        int bad = 0;
        for (size_t i = 0; i < numel; i++) bad |= whole[i] != rank_value(6, 0, i);
        for (size_t i = numel; i < g * un.shard; i++) bad |= whole[i] != 0.0f;
        // gradients: rank q's gradient of element i is rank_value(7, q, i); the padding is zero
        float *grad = (float *)callocCheck(g * un.shard, sizeof(float)), *gshard = (float *)callocCheck(un.shard, sizeof(float));
        for (size_t i = 0; i < numel; i++) grad[i] = rank_value(7, me, i);
        fsdp_reduce_grads(&f, &un, gshard, grad);
        for (size_t k = 0; k < un.shard; k++) { // within each group in rank order, then over the groups in order
            size_t i = f.shard.rank * un.shard + k;
            float total = 0;
            for (int h = 0; h < W / g; h++) {
                float part = i < numel ? rank_value(7, h * g, i) : 0.0f;
                for (int q = h * g + 1; q < (h + 1) * g; q++) part += i < numel ? rank_value(7, q, i) : 0.0f;
                total = h ? total + part : part;
            }
            bad |= gshard[k] != total;
        }
        snprintf(what, sizeof what, "%s at W = %d (groups of %d%s): gather equals the unit, reduced gradients equal the ordered sums",
                 fsdp_strategies[s].name, W, g, s == FSDP_HYBRID_SHARD && !G ? ", one per node" : "");
        check_all(!bad && g == (s == FSDP_NO_SHARD ? 1 : s == FSDP_HYBRID_SHARD && G ? G : W) && f.replica.size == W / g, what,
                  "mismatch (group size %d, replicas %d)", g, f.replica.size);
        free(grad);
        free(gshard);
        free(shards);
        free(buf);
        fsdp_free(&f);
    }
}

// each rank loads its own shards, the units are gathered: model_load's units
static void test_load_distributed(const char *dir) {
    HostModel m = {0};
    if (model_load(&m, dir) != 0) exit(2);
    FsdpUnits u;
    model_units(&m.config, &u, world.size);
    Weights sm;
    if (weights_open(&sm, dir) != 0) exit(2);
    float *shards = (float *)mallocCheck(u.shard_numel * sizeof(float));
    int rc = fsdp_load_model(&u, &sm, world.rank, shards), wrong = 0;
    for (int i = 0; i < u.n_units && rc == 0; i++) {
        float *full = (float *)mallocCheck(world.size * u.units[i].shard * sizeof(float)), *ref = reference_unit(&m, &u.units[i]);
        fsdp_all_gather(&world, full, shards + u.units[i].shard_offset, u.units[i].shard);
        wrong += memcmp(full, ref, u.units[i].numel * sizeof(float)) != 0;
        free(full);
        free(ref);
    }
    char what[300];
    snprintf(what, sizeof what, "W = %d ranks each load their shards of %s; the gathered units equal model_load's", world.size, dir);
    check_all(rc == 0 && wrong == 0, what, "rc %d, %d units differ", rc, wrong);
    weights_close(&sm);
    free(shards);
    fsdp_units_free(&u);
    host_model_free(&m);
}

// the trainer's sequence: rank 0 makes the .tmp folder, every rank writes, rank 0 commits
static int save_collective(Fsdp *f, const char *out_dir, const FsdpUnits *u, FsdpBuffer *bufs, const char *fp) {
    char tmp[PATH_MAX];
    int rc = f->world.rank == 0 ? checkpoint_begin(out_dir, 1, tmp, sizeof tmp) : 0;
    if (fsdp_any(&f->world, rc != 0)) return -1;
    snprintf(tmp, sizeof tmp, "%s/checkpoint-1.tmp", out_dir);
    if (fsdp_save(f, tmp, u, bufs, NBUF, fp) != 0) return -1;
    rc = f->world.rank == 0 ? checkpoint_commit(out_dir, 1, 0) : 0;
    return fsdp_any(&f->world, rc != 0) ? -1 : 0;
}

static void ckpt_units(FsdpUnits *u, int n, char fp[17]) {
    Config c;
    if (config_load(&c, models[0]) != 0) exit(2);
    model_units(&c, u, n);
    fsdp_fingerprint(u, "", fp);
}

// a checkpoint at this world size, every strategy's layout (one copy per shard group), loaded back
static void test_save_distributed(const char *out_dir) {
    int strategy[64], group[64], n = strategy_configs(world.size, strategy, group);
    for (int c = 0; c < n; c++) {
        Fsdp f;
        if (fsdp_init(&f, (FsdpStrategy)strategy[c], group[c]) != 0) exit(2);
        FsdpUnits u;
        char fp[17], dir[PATH_MAX], what[200];
        ckpt_units(&u, f.shard.size, fp);
        FsdpBuffer bufs[NBUF];
        fill_buffers(&u, f.shard.rank, bufs, NULL);
        int rc = save_collective(&f, out_dir, &u, bufs, fp);
        snprintf(dir, sizeof dir, "%s/checkpoint-1", out_dir);
        int ok = rc == 0 && ckpt_matches(dir, &u, f.shard.rank, fp);
        snprintf(what, sizeof what, "%s (shard_group %d) at W = %d: sharded checkpoint (%d shards) saved by the ranks, loaded back bit for bit",
                 fsdp_strategies[strategy[c]].name, group[c], world.size, f.shard.size);
        check_all(ok, what, "rc %d", rc);
        free_buffers(bufs);
        fsdp_units_free(&u);
        fsdp_free(&f);
    }
}

// ----------------------------------------------------------------------------

static void make_tmpdir(void) {
    if (world.rank == 0) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/test_fsdp.XXXXXX");
        if (!mkdtemp(tmpdir)) { perror("mkdtemp"); exit(2); }
    }
    fsdp_broadcast(&world, tmpdir, sizeof tmpdir, 0);
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--mpi-build")) { // test_fsdp.sh asks whether mpirun can run several ranks of it
#ifdef USE_MPI
        return 0;
#else
        return 1;
#endif
    }
    fsdp_world_init(&world);
    const char *mode = argc > 1 ? argv[1] : "all";
    if (!strcmp(mode, "all") || !strcmp(mode, "collectives")) {
        make_tmpdir();
        if (!strcmp(mode, "all")) {
            test_shard_arithmetic();
            for (int i = 0; i < N_MODELS; i++) test_units(models[i]);
            test_packed_units("test/fixtures/tiny_gqa");
            for (int i = 0; i < N_MODELS; i++) test_load(models[i]);
            test_load("test/fixtures/torch/tiny_tied_sharded"); // pytorch_model.bin shards
            test_load("test/fixtures/meta/tiny_gqa");           // Meta's layout, 2 files
            test_load_refusals();
            test_checkpoints();
        }
        test_collectives();
        test_strategies();
        for (int i = 0; i < N_MODELS; i++) test_load_distributed(models[i]);
        char out[300];
        snprintf(out, sizeof out, "%s/dist", tmpdir);
        test_save_distributed(out);
        fsdp_barrier(&world);
        if (world.rank == 0) remove_tree(tmpdir);
    } else if ((!strcmp(mode, "save") || !strcmp(mode, "load")) && argc == 3) {
        Fsdp f;
        if (fsdp_init(&f, FSDP_FULL_SHARD, 0) != 0) exit(2);
        FsdpUnits u;
        char fp[17], what[300], dir[PATH_MAX];
        ckpt_units(&u, world.size, fp);
        snprintf(dir, sizeof dir, "%s/checkpoint-1", argv[2]);
        if (!strcmp(mode, "save")) {
            FsdpBuffer bufs[NBUF];
            fill_buffers(&u, world.rank, bufs, NULL);
            snprintf(what, sizeof what, "FULL_SHARD checkpoint saved by W = %d ranks into %s", world.size, argv[2]);
            check_all(save_collective(&f, argv[2], &u, bufs, fp) == 0, what, "save failed");
            free_buffers(bufs);
        } else {
            snprintf(what, sizeof what, "W = %d ranks load %s: their shards bit-identical to the saved values", world.size, argv[2]);
            check_all(ckpt_matches(dir, &u, world.rank, fp), what, "mismatch or load error");
        }
        fsdp_units_free(&u);
        fsdp_free(&f);
    } else if (!strcmp(mode, "fault") && argc == 3) {
        if (!strcmp(argv[2], "mismatch")) { // rank 1 gathers 3 floats where the others gather 2
            float part[3] = {0}, full[3 * 64];
            if (world.size > 64) return 2;
            fsdp_all_gather(&world, full, part, world.rank == 1 ? 3 : 2);
        }
        if (world.rank == 1) {
            if (!strcmp(argv[2], "kill")) raise(SIGKILL);
            if (!strcmp(argv[2], "exit")) die("rank 1 gives up (test_fsdp fault exit)");
            Weights sm; // rank 1 alone is given a folder without weights
            if (weights_open(&sm, "test/fixtures") != 0) fsdp_abort(&world, "cannot load the model (see above)");
        }
        fsdp_barrier(&world); // the other ranks wait here: only the abort path can free them
    } else {
        fprintf(stderr, "usage: %s [collectives | save DIR | load DIR | fault abort|exit|kill|mismatch]\n", argv[0]);
        return 2;
    }
    fsdp_world_finalize();
    return test_summary();
}
