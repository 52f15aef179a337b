// dev/bench_fsdp: peak resident memory per rank while each rank loads only its
// own shards of a model (fsdp.h), against the trainer's whole-model loader.
// dev/bench_fsdp.sh runs it all and prints the table of dev/bench_fsdp.md.
//   dev/bench_fsdp make DIR                  a random Llama (dim 1024, 12 layers, vocab 32000:
//                                            220 M parameters) in BF16, one safetensors file per unit
//   mpirun -np W dev/bench_fsdp load DIR     rank-local load (model_load_shard); rank 0 prints a row per rank
//   dev/bench_fsdp whole DIR                 model_load (model.h), all of it in one process
//   mpirun -np W dev/bench_fsdp collectives  the collectives' time and bandwidth (also under dev/launch.sh W)
// Memory is the process's peak resident set (model_peak_mb: getrusage), so it includes the
// program and, under MPI, the MPI runtime: the "before" column is what the
// process held before loading.
#define TESTING
#include "../train_llama2.c"
#include "../fsdp.h"

enum { LAYERS = 12, DIM = 1024, HIDDEN = 2816, HEADS = 16, VOCAB = 32000 };

static int make_model(const char *dir) {
    char path[FSDP_PATH_MAX], file[64], config[512];
    int n = snprintf(config, sizeof config, "{\"model_type\": \"llama\", \"hidden_size\": %d, \"intermediate_size\": %d, "
                     "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"vocab_size\": %d, "
                     "\"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": false}\n", DIM, HIDDEN, LAYERS, HEADS, HEADS, VOCAB);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (mkdir_p(dir) != 0 || write_bytes_atomic(path, config, (size_t)n) != 0) { fprintf(stderr, "error: cannot write %s\n", path); return 1; }
    FsdpUnits u;
    fsdp_units_llama(&u, LAYERS, DIM, HIDDEN, DIM, DIM, VOCAB, 0, 1);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *ix = fopenCheck(path, "w");
    fprintf(ix, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; i < u.n_units; i++) { // one file per unit, so making it holds one unit at a time
        const FsdpUnit *un = &u.units[i];
        StWriteTensor ts[FSDP_UNIT_TENSORS_MAX] = {{0}};
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", i + 1, u.n_units);
        for (int j = 0; j < un->n_tensors; j++) {
            const FsdpTensor *t = &un->tensors[j];
            uint16_t *x = (uint16_t *)mallocCheck(t->numel * sizeof(uint16_t));
            for (size_t k = 0; k < t->numel; k++) { // bf16: the top half of a float, uniform in +-0.035 (std 0.02)
                float v = (2.0f * hash_uniform((uint64_t)i << 8 | (uint64_t)j, k) - 1.0f) * 0.0346f;
                uint32_t bits;
                memcpy(&bits, &v, 4);
                x[k] = (uint16_t)(bits >> 16);
            }
            ts[j] = (StWriteTensor){t->name, ST_BF16, t->ndim, {t->shape[0], t->shape[1]}, x};
            fprintf(ix, "%s\"%s\": \"%s\"", i || j ? ", " : "", t->name, file);
        }
        snprintf(path, sizeof path, "%s/%s", dir, file);
        int rc = st_write(path, ts, un->n_tensors, NULL, 0);
        for (int j = 0; j < un->n_tensors; j++) free((void *)ts[j].data);
        if (rc) return 1;
    }
    fprintf(ix, "}}\n");
    fclose(ix);
    printf("%s: %zu parameters in %d files (BF16, %.0f MB)\n", dir, u.numel, u.n_units, u.numel * 2 / 1e6);
    fsdp_units_free(&u);
    return 0;
}

static int load_sharded(const char *dir) {
    Fsdp f;
    if (fsdp_init(&f, FSDP_FULL_SHARD, 0) != 0) return 1;
    HostModel m = {0};
    float row[4] = {(float)model_peak_mb(NULL), 0, 0, 0}; // before, shard, peak, seconds
    double t0 = now_ms();
    if (model_load_shard(&m, dir, f.world.rank, f.world.size) != 0) fsdp_abort(&f.world, "loading %s failed", dir);
    row[1] = (float)(m.units.shard_numel * 4 / 1048576.0);
    row[2] = (float)model_peak_mb(NULL);
    row[3] = (float)((now_ms() - t0) / 1000);
    float *rows = (float *)mallocCheck((size_t)f.world.size * sizeof row);
    fsdp_all_gather(&f.world, rows, row, 4);
    for (int r = 0; f.world.rank == 0 && r < f.world.size; r++)
        printf("| %d | %d | %.0f | %.0f | %.0f | %.0f | %.2f |\n", f.world.size, r, rows[4 * r + 1], rows[4 * r],
               rows[4 * r + 2], rows[4 * r + 2] - rows[4 * r], rows[4 * r + 3]);
    free(rows);
    host_model_free(&m);
    fsdp_free(&f);
    fsdp_world_finalize();
    return 0;
}

static int load_whole(const char *dir) {
    HostModel m = {0};
    double before = model_peak_mb(NULL), t0 = now_ms();
    if (model_load(&m, dir) != 0) return 1;
    printf("| model_load | - | %.0f | %.0f | %.0f | %.0f | %.2f |\n", m.num_params * 4 / 1048576.0, before, model_peak_mb(NULL),
           model_peak_mb(NULL) - before, (now_ms() - t0) / 1000);
    host_model_free(&m);
    return 0;
}

// The collectives' speed at this world size, over whichever host backend
// started it (MPI under mpirun, TCP under dev/launch.sh): all-gather,
// reduce-scatter (the shard is S floats, a rank's part of a unit) and
// all-reduce (S floats), each timed over enough repetitions to take about a
// second, after one warm-up. Rank 0 prints a row per collective and size: the
// bandwidth is the unit's bytes (W * S floats, or S for the all-reduce) over the time.
static int collectives(void) {
    Fsdp f;
    if (fsdp_init(&f, FSDP_FULL_SHARD, 0) != 0) return 1;
    FsdpComm *c = &f.world;
    int W = c->size;
    const char *launch = c->host == FSDP_BACKEND_MPI ? "mpirun" : c->host == FSDP_BACKEND_TCP ? "TCP (dev/launch.sh)" : "one process";
    size_t sizes[] = {(size_t)1 << 14, (size_t)1 << 20, (size_t)1 << 24}; // 64 KiB, 4 MiB, 64 MiB of fp32 per rank
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t S = sizes[k];
        float *full = (float *)callocCheck((size_t)W * S, sizeof(float)), *shard = (float *)callocCheck(S, sizeof(float));
        const char *names[3] = {"all-gather", "reduce-scatter", "all-reduce"};
        for (int op = 0; op < 3; op++) {
            int reps = 1;
            double ms = 0;
            for (int round = 0; round < 2; round++) { // a warm-up round sizes the repetitions, then the timed one
                fsdp_barrier(c);
                double t0 = now_ms();
                for (int i = 0; i < reps; i++) {
                    if (op == 0) fsdp_all_gather(c, full, shard, S);
                    else if (op == 1) fsdp_reduce_scatter(c, shard, full, S);
                    else fsdp_all_reduce(c, shard, S, FSDP_F32);
                }
                double t = now_ms() - t0;
                fsdp_broadcast(c, &t, sizeof t, 0); // every rank the same repetitions
                if (round == 0) reps = t > 1000 ? 1 : (int)(1000 / (t + 1e-3)) + 1;
                else ms = t / reps;
            }
            double bytes = (op == 2 ? 1.0 : (double)W) * S * sizeof(float);
            if (c->rank == 0)
                printf("| %s | %d | %s | %.2f | %.3f | %.2f |\n", launch, W, names[op], S * sizeof(float) / 1048576.0, ms,
                       bytes / (ms * 1e-3) / 1e9);
        }
        free(full);
        free(shard);
    }
    fsdp_free(&f);
    fsdp_world_finalize();
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "collectives")) return collectives();
    if (argc == 3 && !strcmp(argv[1], "make")) return make_model(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "load")) return load_sharded(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "whole")) return load_whole(argv[2]);
    fprintf(stderr, "usage: %s make|load|whole DIR | collectives\n", argv[0]);
    return 2;
}
