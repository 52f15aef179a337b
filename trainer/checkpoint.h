// trainer/checkpoint.h: checkpoints and exact resume (support/checkpoint.h makes each
// checkpoint folder atomic), and the stop signals and injected faults they serve.
//
// A checkpoint holds everything the rest of the run depends on: the trainable
// weights (a PEFT adapter, or the whole model for full fine-tuning, in F32),
// the optimizer's state (AdamW's moments, SGD's momentum buffer) and step
// count, the optimizer step and the data position.
// Dropout masks and the shuffle order are functions of --seed, the step and
// the epoch, so no RNG state needs saving: a resumed run is bit-identical.
#ifndef TRAINER_CHECKPOINT_H
#define TRAINER_CHECKPOINT_H


static volatile sig_atomic_t stop_requested = 0;
static void on_stop_signal(int sig) { (void)sig; stop_requested = 1; }

// Fault injection for the tests: LLAMA2TUNE_FAULT=<point>:<step> (or
// <point>:<first>-<last>, a range of steps) is on at <point> for those steps.
// At "step" and "checkpoint" the process is killed (SIGKILL, no cleanup); at
// "nan" and "huge" train_step scales the step's gradients by NaN or by 1e30.
static int fault_at(const char *point, int step) {
    const char *f = getenv("LLAMA2TUNE_FAULT");
    size_t n = strlen(point);
    if (!f || strncmp(f, point, n) != 0 || f[n] != ':') return 0;
    char *end;
    long first = strtol(f + n + 1, &end, 10), last = *end == '-' ? strtol(end + 1, NULL, 10) : first;
    return step >= first && step <= last;
}
static void fault_point(const char *point, int step) { if (fault_at(point, step)) raise(SIGKILL); }

// the options that shape the training trajectory: a resumed run must use the same
// (--max_steps and --num_epochs may change, to train longer; the schedule then
// spans the new length, so such a run differs from one planned that long)
// (and the global batch, the rows of an optimizer step over every rank: how they split
// into ranks, micro-batches and rows may change, e.g. the world size with --global_batch_size)
static const char *resume_must_match[] = {
    "model", "data", "max_seq_len", "lr", "optimizer", "momentum", "nesterov", "kahan_summation", "pure_bf16",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "lr_scheduler", "warmup_steps", "grad_clip", "seed",
    "shuffle", "full_finetune", "freeze_layers", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_rslora",
    "use_dora", "peft_method", "ia3_target_modules", "ia3_feedforward_modules", "adapter_len", "adapter_layers", "num_virtual_tokens",
    "from_peft_checkpoint", "data_format",
    "train_on_prompt", "batching", "max_samples", "data_slice", "val_split",
    "quantize", "double_quant", "s2_attn", "trainable_params", "objective", "beta", "dpo_loss_type", "precompute_ref_log_probs"};

// a file's identity for resume: the one the token cache keys on (dataloader.h's
// data_identity: size, modification time and a hash of its first and last MiB)
static void file_fingerprint(const char *path, char *out, size_t n) {
    CacheHeader h;
    memset(&h, 0, sizeof h);
    if (data_identity(path, &h) != 0) { snprintf(out, n, "unreadable"); return; }
    snprintf(out, n, "%llu:%lld:%016llx", (unsigned long long)h.data_size, (long long)h.data_mtime_ns,
             (unsigned long long)h.data_hash);
}

// DPO's starting point, what its reference was built from: --model's weights file (or the index
// of a sharded one) and --from_peft_checkpoint's adapter (a resume whose reference would differ is refused)
static void reference_fingerprint(const TrainConfig *tc, char *out, size_t n) {
    char path[PATH_MAX + 64], a[128], b[128] = "-";
    snprintf(path, sizeof path, "%s/model.safetensors", tc->model);
    if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s/model.safetensors.index.json", tc->model);
    file_fingerprint(path, a, sizeof a);
    if (tc->from_peft_checkpoint[0]) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", tc->from_peft_checkpoint);
        file_fingerprint(path, b, sizeof b);
    }
    snprintf(out, n, "%s %s", a, b);
}

// opt_t < step when steps were skipped (non-finite loss or gradient); bad_in_row counts the latest run of
// those that count as bad (train_run); the loss scale is part of the state (a resumed run goes on with it)
typedef struct { int step, opt_t, data_epoch, data_pos, bad_in_row; LossScale ls; } TrainState;

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

// state tensor i of an optimizer, to be saved through optimizer_state_get (StFillFn)
typedef struct { Optimizer *o; int i; const HostModel *h; } StateRef;
static int state_fill(void *ctx, size_t first, size_t count, void *dst) {
    const StateRef *r = (const StateRef *)ctx;
    return optimizer_state_get(r->o, r->i, first, count, dst);
}
// ... and loaded through optimizer_state_set, a piece at a time (FsdpPutFn: a sharded resume)
static void state_put(void *ctx, size_t first, size_t count, const void *src) {
    const StateRef *r = (const StateRef *)ctx;
    optimizer_state_set(r->o, r->i, first, count, src);
}
// AdamW8bit's state tensor i in a sharded checkpoint: a part of each unit (FsdpPartFn)
static size_t state_part(void *ctx, int unit, size_t x) {
    const StateRef *r = (const StateRef *)ctx;
    return model_state_part(&r->h->units.units[unit], r->i % ADAMW8BIT_PARTS, x);
}

// the optimizer's state tensors with their names, each saved through its fill (refs: where
// they point); returns how many (of the units that train: a sharded checkpoint holds none
// for frozen ones). AdamW8bit's are parts of the units (its codes, absmax, fp32 moments).
static int optimizer_state(Optimizer *o, const Model *m, FsdpBuffer states[OPTIMIZER_MAX_STATES], StateRef refs[OPTIMIZER_MAX_STATES]) {
    int n = optimizer_n_states(&m->optimizer), a8 = m->optimizer.kind == OPTIMIZER_ADAMW8BIT;
    for (int i = 0; i < n; i++) {
        StDtype d;
        optimizer_state_count(&m->optimizer, &m->opt_tensors, o->n, i, &d);
        refs[i] = (StateRef){o, i, &m->host};
        states[i] = (FsdpBuffer){optimizer_state_names[m->optimizer.kind][i], NULL, m->host.frozen_units, state_fill, &refs[i], d,
                                 a8 ? state_part : NULL, &refs[i], state_put};
    }
    return n;
}

// the buffers of a sharded checkpoint (fsdp.h): this rank's shards of the weights and the optimizer state
static int sharded_buffers(Model *m, Optimizer *o, FsdpBuffer bufs[1 + OPTIMIZER_MAX_STATES], StateRef refs[OPTIMIZER_MAX_STATES],
                           char fingerprint[17]) {
    const HostModel *h = &m->host; // (the shards on the host, or where the backend keeps them)
    bufs[0] = (FsdpBuffer){"params", h->shards, 0, h->shards ? NULL : h->shards_get, h->weights_ctx, ST_F32, NULL, NULL,
                           h->shards ? NULL : h->shards_put};
    fsdp_fingerprint(&m->host.units, "", fingerprint);
    return 1 + optimizer_state(o, m, bufs + 1, refs);
}

// Every file's digest, each rank digesting its share (file i on rank i % W), so a
// sharded checkpoint's shards are read once and in parallel; every rank ends up
// with all n of them (*digests, freed by the caller). Collective; 0 ok, -1 on
// every rank when one failed (with its message).
static int digest_files(Fsdp *fs, const char *dir, CheckpointName *names, int n, CheckpointDigest **digests) {
    FsdpComm *w = &fs->world;
    int W = w->size, k = (n + W - 1) / W, lo, hi; // k: files per rank
    fsdp_int_range(w, n, &lo, &hi);
    if (lo != hi) { // every rank lists the folder its shards went into: it must be the same one
        if (w->rank == 0) fprintf(stderr, "error: the ranks see different files in '%s': --output_dir must be on a filesystem every rank shares\n", dir);
        return -1;
    }
    CheckpointDigest *all = (CheckpointDigest *)callocCheck((size_t)n + 1, sizeof *all);
    CheckpointDigest *mine = (CheckpointDigest *)callocCheck((size_t)k + 1, sizeof *mine), *got = (CheckpointDigest *)callocCheck((size_t)W * k + 1, sizeof *got);
    int rc = checkpoint_digest_part(dir, names, all, n, w->rank, W);
    for (int j = 0; w->rank + j * W < n; j++) memcpy(mine[j], all[w->rank + j * W], sizeof *mine);
    if (!fsdp_any(w, rc != 0)) {
        fsdp_all_gather_bytes(w, got, mine, (size_t)k * sizeof *mine);
        for (int i = 0; i < n; i++) memcpy(all[i], got[(size_t)(i % W) * k + i / W], sizeof *all);
    } else rc = -1;
    free(mine);
    free(got);
    *digests = all;
    return rc;
}

// trainer_state.json: the position, the digests of the checkpoint's files, and the
// options, data and world size it belongs to. Collective (the digests); rank 0 writes.
static int save_trainer_state(TrainConfig *tc, const TrainState *ts, Fsdp *fs, const char *dir) {
    CheckpointName *names = (CheckpointName *)mallocCheck(CHECKPOINT_MAX_FILES * sizeof *names);
    CheckpointDigest *digests = NULL;
    int n = 0, rc = checkpoint_files(dir, names, &n);
    rc = fsdp_any(&fs->world, rc != 0) ? -1 : digest_files(fs, dir, names, n, &digests);
    if (rc != 0 || fs->world.rank != 0) {
        free(names);
        free(digests);
        return rc;
    }
    char *js, val[4096], fp[300], path[PATH_MAX + 64];
    size_t len;
    FILE *f = open_memstream(&js, &len);
    if (!f) die("out of memory");
    file_fingerprint(tc->data, fp, sizeof fp);
    fprintf(f, "{\n  \"step\": %d,\n  \"optimizer_step\": %d,\n  \"data_epoch\": %d,\n  \"data_position\": %d,\n"
            "  \"bad_steps_in_row\": %d,\n  \"data_fingerprint\": \"%s\",\n  \"world_size\": %d,\n", ts->step,
            ts->opt_t, ts->data_epoch, ts->data_pos, ts->bad_in_row, fp, fsdp_data_size(fs));
    if (!strcmp(tc->objective, "dpo")) {
        reference_fingerprint(tc, fp, sizeof fp);
        fprintf(f, "  \"reference_fingerprint\": \"%s\",\n", fp);
    }
    if (ts->ls.on) // a power of two: %.9g is exact
        fprintf(f, "  \"loss_scale\": %.9g,\n  \"loss_scale_growth_tracker\": %d,\n", ts->ls.scale, ts->ls.growth_tracker);
    fprintf(f, "  \"files\": ");
    checkpoint_write_digests(f, names, digests, n); // what a resume checks before reading them
    free(names);
    free(digests);
    fprintf(f, ",\n  \"options\": {");
    Option opts[] = OPTIONS(tc);
    for (size_t i = 0, any = 0; i < sizeof opts / sizeof opts[0]; i++) {
        if (option_quiet(&opts[i])) continue;
        option_value(&opts[i], val, sizeof val, 1);
        fprintf(f, "%s\n    \"%s\": ", any++ ? "," : "", opts[i].name);
        json_write_string(f, val);
    }
    fprintf(f, "\n  }\n}\n");
    if (fclose(f) != 0) die("out of memory writing trainer_state.json");
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    if (rc == 0) rc = write_bytes_atomic(path, js, len);
    free(js);
    return rc;
}

#ifdef BACKEND_PREFERENCE
// DPO's reference in a checkpoint (reference.safetensors), so that a resume trains against the
// run's start and not the checkpoint's weights: with --precompute_ref_log_probs the pairs'
// log-probabilities ("train", "validation": (pairs, 2) F64, by row), else the reference weights
// ("reference": the trainable weights as the run started, F32; LoRA's: a copy of the starting
// adapter), which stay where the backend keeps them and go through a staging buffer
// (model_reference_get, _set). Sharded full fine-tuning keeps its reference in shards and saves
// none (its resume is refused: load_reference).
static size_t reference_numel(const HostModel *h) { return h->use_lora ? h->lora.num_params : h->num_params; }
static int reference_fill(void *m, size_t first, size_t count, void *dst) {
    return model_reference_get((Model *)m, first, count, (float *)dst);
}
// rank 0 writes. 0 ok, -1.
static int save_reference(Fsdp *fs, const char *dir, Model *m, const Dataset *train, const Dataset *val) {
    const HostModel *h = &m->host;
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (fs->world.rank != 0) return 0;
    if (train->ref_logps) {
        StWriteTensor t[2] = {{"train", ST_F64, 2, {train->n_rows, 2}, train->ref_logps, NULL, NULL},
                              {"validation", ST_F64, 2, {val->n_rows, 2}, val->ref_logps, NULL, NULL}};
        return st_write(path, t, val->ref_logps ? 2 : 1, NULL, 0);
    }
    if (!m->reference || (host_sharded(h) && !h->use_lora)) return 0;
    StWriteTensor t = {"reference", ST_F32, 1, {(int64_t)reference_numel(h)}, NULL, reference_fill, m};
    return st_write(path, &t, 1, NULL, 0);
}

// tensor name of sf (path), n elements of dtype d, for load_reference; NULL with a message
static const StTensor *reference_tensor(StFile *sf, const char *path, const char *name, StDtype d, size_t n) {
    const StTensor *t = st_find(sf, name);
    if (!t || t->dtype != d || t->numel != n) {
        fprintf(stderr, "error: %s: expected a %s tensor %s of %zu elements (DPO's reference)\n", path, st_dtype_name(d), name, n);
        return NULL;
    }
    return t;
}
static int read_logps(StFile *sf, const char *path, const char *name, const Dataset *ds) {
    const StTensor *t = reference_tensor(sf, path, name, ST_F64, (size_t)ds->n_rows * 2);
    return t ? st_read_stored(sf, t, ST_F64, 0, (size_t)ds->n_rows * 2, ds->ref_logps) : -1;
}

// A DPO resume's reference from the checkpoint dir (save_reference): the precomputed
// log-probabilities into the datasets, or the reference weights into m, a staging buffer at a
// time (a full model's are as large as the model). 0 ok, -1 with a message.
static int load_reference(const TrainConfig *tc, const char *dir, Model *m, Dataset *train, Dataset *val) {
    const HostModel *h = &m->host;
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (!tc->precompute_ref_log_probs && host_sharded(h) && !h->use_lora) {
        fprintf(stderr, "error: --resume %s: sharded full fine-tuning with DPO keeps its reference in shards, which a checkpoint "
                "does not save: train with --precompute_ref_log_probs 1 to resume\n", dir);
        return -1;
    }
    StFile sf;
    if (st_open(&sf, path) != 0) return -1;
    int rc;
    if (tc->precompute_ref_log_probs) {
        train->ref_logps = (double *)mallocCheck((size_t)train->n_rows * 2 * sizeof(double));
        rc = read_logps(&sf, path, "train", train);
        if (rc == 0 && has_validation(tc)) {
            val->ref_logps = (double *)mallocCheck((size_t)val->n_rows * 2 * sizeof(double));
            rc = read_logps(&sf, path, "validation", val);
        }
    } else {
        size_t n = reference_numel(h), piece = st_staging_bytes() / sizeof(float);
        if (piece > n) piece = n;
        const StTensor *t = reference_tensor(&sf, path, "reference", ST_F32, n);
        float *buf = t ? (float *)mallocCheck(piece * sizeof(float)) : NULL;
        rc = t ? 0 : -1;
        for (size_t first = 0; first < n && rc == 0; first += piece) {
            size_t k = n - first < piece ? n - first : piece;
            rc = st_read_stored(&sf, t, ST_F32, first, k, buf);
            if (rc == 0) model_reference_set(m, first, k, buf);
        }
        free(buf);
    }
    st_close(&sf);
    return rc;
}
#endif

// Collective: rank 0 makes the .tmp folder, the trainable state goes in (each
// rank its shards in sharded full fine-tuning; else rank 0 writes the adapter
// or the model, and the moments), rank 0 commits. The ranks agree after each
// part, so a failure on any rank is a failure on every rank.
static int save_checkpoint(TrainConfig *tc, Fsdp *fs, Model *m, Optimizer *o, const TrainState *ts, const char *tokpath, const Dataset *train,
                           const Dataset *val) {
    char dir[PATH_MAX], path[PATH_MAX + 64];
    model_sync_host(m);
    // finite losses and gradients can still overflow the update (AdamW's g^2 above FLT_MAX without --grad_clip): never save that
    const HostModel *h = &m->host;
    const float *w = h->use_lora ? h->lora.params : host_sharded(h) ? h->shards : h->params;
    size_t nw = h->use_lora ? h->lora.num_params : host_sharded(h) ? h->units.shard_numel : h->num_params;
    FsdpBuffer states[OPTIMIZER_MAX_STATES];
    StateRef refs[OPTIMIZER_MAX_STATES];
    int finite = h->weights_finite && !h->use_lora ? h->weights_finite(h->weights_ctx) : all_finite(w, nw);
    int n_states = optimizer_state(o, m, states, refs), bad = !finite || !optimizer_state_finite(o);
    if (fsdp_any(&fs->world, bad)) {
        if (fs->world.rank == 0)
            fprintf(stderr, "error: not saving checkpoint %d: the trainable weights or the optimizer state hold NaN or inf (an update "
                    "overflowed: a gradient above 1e19; keep --grad_clip on, lower --lr); the checkpoints before it are intact\n", ts->step);
        return -1;
    }
    int rank0 = fs->world.rank == 0, rc = rank0 ? checkpoint_begin(tc->output_dir, ts->step, dir, sizeof dir) : 0;
    if (fsdp_any(&fs->world, rc != 0)) return -1;
    snprintf(dir, sizeof dir, "%s/checkpoint-%d.tmp", tc->output_dir, ts->step);
    if (host_sharded(&m->host) && !m->host.use_lora) {
        FsdpBuffer bufs[1 + OPTIMIZER_MAX_STATES];
        char fp[17];
        rc = fsdp_save(fs, dir, &m->host.units, bufs, sharded_buffers(m, o, bufs, refs, fp), fp);
    } else if (rank0) { // optimizer.safetensors: the state tensors under their names (none for plain SGD)
        rc = m->host.use_lora ? lora_save_peft(&m->host.lora, dir, tc->model) : model_save_hf(&m->host, dir, tc->model, tokpath);
        StWriteTensor t[OPTIMIZER_MAX_STATES];
        for (int i = 0; i < n_states; i++) {
            StDtype d;
            size_t count = optimizer_state_count(&m->optimizer, &m->opt_tensors, o->n, i, &d);
            t[i] = (StWriteTensor){states[i].name, d, 1, {(int64_t)count}, NULL, state_fill, &refs[i]};
        }
        snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
        if (rc == 0) rc = st_write(path, t, n_states, NULL, 0);
    }
#ifdef BACKEND_PREFERENCE
    if (!fsdp_any(&fs->world, rc != 0)) rc = save_reference(fs, dir, m, train, val);
#else
    (void)train, (void)val;
#endif
    fault_point("checkpoint", ts->step); // the tests kill the run here, halfway through a checkpoint
    rc = fsdp_any(&fs->world, rc != 0) ? -1 : save_trainer_state(tc, ts, fs, dir); // every rank: the digests
    if (fsdp_any(&fs->world, rc != 0)) {
        if (rank0) {
            fprintf(stderr, "error: writing checkpoint step %d failed; the previous checkpoints are intact\n", ts->step);
            remove_tree(dir);
        }
        return -1;
    }
    rc = rank0 ? checkpoint_commit(tc->output_dir, ts->step, tc->keep_checkpoints) : 0;
    return fsdp_any(&fs->world, rc != 0) ? -1 : 0;
}

// Where tensor j of unit u keeps its share of state buffer b in a whole model's state (w:
// the whole model's trainable tensors, AdamW8bit's): [*in_unit, *in_unit + count) of the
// unit's elements (or of its part: AdamW8bit's) lie at *at of the whole state tensor
// (model_tensor_offset_from's layout, or the part's); returns count.
static size_t state_whole_at(const HostModel *h, const OptimTensors *w, const FsdpBuffer *b, int u, int j, size_t *in_unit, size_t *at) {
    const FsdpTensor *t = &h->units.units[u].tensors[j];
    size_t off = model_tensor_offset_from(&h->config, h->frozen_units, u, j);
    if (!b->part) { *in_unit = t->offset, *at = off; return t->numel; }
    *in_unit = b->part(b->part_ctx, u, t->offset);
    int k = 0;
    while (k + 1 < w->n && w->first[k] != off) k++; // (w holds every trainable tensor)
    *at = ((const StateRef *)b->part_ctx)->i % ADAMW8BIT_PARTS == ADAMW8BIT_ABSMAX ? w->at[k] / ADAMW8BIT_BLOCK : w->at[k];
    return b->part(b->part_ctx, u, t->offset + t->numel) - *in_unit;
}

// A sharded checkpoint's weights and optimizer state into a whole model (one
// process, or NO_SHARD): each buffer read as one shard, in the units' order, then
// put into the whole model's layout (the state tensor by tensor through
// optimizer_state_set); it costs one more copy of the model meanwhile.
static int load_sharded_whole(const char *dir, Model *m, Optimizer *o) {
    const HostModel *h = &m->host;
    FsdpUnits one;
    model_units(&h->config, &one, 1);
    FsdpBuffer bufs[1 + OPTIMIZER_MAX_STATES];
    StateRef refs[OPTIMIZER_MAX_STATES];
    char fp[17];
    int nb = sharded_buffers(m, o, bufs, refs, fp), rc = 0;
    char *buf = (char *)mallocCheck(one.shard_numel * sizeof(float)); // (every buffer's whole is at most that)
    for (int b = 0; b < nb && rc == 0; b++) {
        FsdpBuffer one_buf = bufs[b];
        one_buf.data = buf, one_buf.fill = NULL, one_buf.put = NULL;
        rc = fsdp_load(dir, &one, &one_buf, 1, 0, fp);
        for (int i = one_buf.first; i < one.n_units && rc == 0; i++) {
            const char *unit = (const char *)fsdp__buffer_unit(&one, &one_buf, i, 0);
            if (b == 0) { model_put_unit(h, 0, i, (const float *)unit, m->host.params); continue; } // (sharded_buffers named the shards)
            for (int j = 0; j < one.units[i].n_tensors; j++) {
                size_t in_unit, at, n = state_whole_at(h, &m->opt_tensors, &bufs[b], i, j, &in_unit, &at);
                if (n) optimizer_state_set(o, b - 1, at, n, unit + in_unit * (size_t)st_dtype_size(one_buf.dtype));
            }
        }
    }
    free(buf);
    fsdp_units_free(&one);
    return rc;
}

// a flat state tensor of an unsharded full fine-tuning checkpoint (model_tensor_offset_from's
// layout of the units from `from` on: they have state, the frozen ones none), read by unit
typedef struct { StFile *sf; const StTensor *t; const Config *c; int from; } StateFile;
static int read_state(void *ctx, int unit, int tensor, size_t first, size_t count, float *dst) {
    const StateFile *sf = (const StateFile *)ctx;
    if (unit < sf->from) return 0; // frozen: fsdp_read_shard left it zero
    return st_read_f32(sf->sf, sf->t, model_tensor_offset_from(sf->c, sf->from, unit, tensor) + first, count, dst);
}

// this rank's pieces of AdamW8bit's state tensor b (a part of each unit) out of a whole
// checkpoint's tensor t (sf) into dst, the rank's layout of it: each piece of a tensor in
// the rank's shard read from where the whole state keeps it. 0 ok, -1 with a message.
static int read_state_part(StFile *sf, const StTensor *t, const Model *m, const OptimTensors *whole, const FsdpBuffer *b, char *dst) {
    const HostModel *h = &m->host;
    const FsdpUnits *u = &h->units;
    int rank = m->fsdp->shard.rank, rc = 0;
    size_t es = (size_t)st_dtype_size(b->dtype);
    for (int i = b->first; i < u->n_units && rc == 0; i++) {
        const FsdpUnit *un = &u->units[i];
        size_t begin, count = fsdp_shard_range(un->numel, u->n_shards, u->align, rank, &begin);
        size_t mine = b->part(b->part_ctx, i, begin); // the rank's piece of the unit's part starts there
        char *piece = dst + fsdp__unit_start(u, b, i, rank) * es;
        for (int j = 0; j < un->n_tensors && rc == 0; j++) {
            const FsdpTensor *tt = &un->tensors[j];
            size_t lo, n = range_overlap(begin, count, tt->offset, tt->numel, &lo);
            size_t p0 = b->part(b->part_ctx, i, lo), p1 = b->part(b->part_ctx, i, lo + n), in_unit, at;
            if (p0 == p1) continue; // (none of the tensor here, or none of it in this part)
            state_whole_at(h, whole, b, i, j, &in_unit, &at);
            rc = st_read_stored(sf, t, b->dtype, at + (p0 - in_unit), p1 - p0, piece + (p0 - mine) * es);
        }
    }
    return rc;
}

// The checkpoint's optimizer state (and a sharded checkpoint's weights) into o
// (and m): a sharded checkpoint at any shard count (fsdp.h), or
// optimizer.safetensors of a whole one (into a sharded model: this rank's
// shard of it). 0 ok, -1 with a message.
static int load_trainable(const char *dir, Model *m, Optimizer *o) {
    if (checkpoint_is_sharded(dir)) {
        if (m->host.use_lora) { fprintf(stderr, "error: --resume %s: a full fine-tuning checkpoint, and this run trains LoRA\n", dir); return -1; }
        if (!host_sharded(&m->host)) return load_sharded_whole(dir, m, o);
        FsdpBuffer bufs[1 + OPTIMIZER_MAX_STATES];
        StateRef refs[OPTIMIZER_MAX_STATES];
        char fp[17];
        // the weights into the host's shards or through the backend's shards_put, the state through
        // optimizer_state_set, a block of the file at a time
        int nb = sharded_buffers(m, o, bufs, refs, fp);
        return fsdp_load(dir, &m->host.units, bufs, nb, m->fsdp->shard.rank, fp);
    }
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    StFile sf;
    if (st_open(&sf, path) != 0) return -1;
    FsdpBuffer states[OPTIMIZER_MAX_STATES];
    StateRef refs[OPTIMIZER_MAX_STATES];
    HostModel *h = &m->host;
    int n_states = optimizer_state(o, m, states, refs), shard = host_sharded(h) && !h->use_lora, rc = 0;
    // whole: a staging buffer at a time; sharded: this rank's shard of every unit
    size_t staging = st_staging_bytes();
    void *buf = mallocCheck(shard ? h->units.shard_numel * sizeof(float) : optimizer_staging_bytes(&m->optimizer, &m->opt_tensors, o->n) + 1);
    OptimTensors whole; // (AdamW8bit's) the checkpoint's: every trainable tensor whole
    memset(&whole, 0, sizeof whole);
    model_optim_tensors(h, &m->optimizer, -1, &whole);
    for (int i = 0; i < n_states && rc == 0; i++) {
        const StTensor *t = st_find(&sf, states[i].name);
        StDtype d;
        // an unsharded checkpoint holds the state of every weight that trains
        size_t n = optimizer_state_count(&m->optimizer, &whole, shard ? model_numel_from(&h->config, h->frozen_units) : o->n, i, &d);
        size_t piece = staging / (size_t)st_dtype_size(d);
        if (!t || t->numel != n || t->dtype != d) {
            fprintf(stderr, "error: %s: expected a %s tensor %s of %zu elements\n", path, st_dtype_name(d), states[i].name, n);
            rc = -1;
        } else if (!shard) {
            for (size_t first = 0; first < n && rc == 0; first += piece) {
                size_t k = n - first < piece ? n - first : piece;
                rc = st_read_stored(&sf, t, d, first, k, buf);
                if (rc == 0) optimizer_state_set(o, i, first, k, buf);
            }
        } else if (states[i].part) { // AdamW8bit's: this rank's pieces of it
            if ((rc = read_state_part(&sf, t, m, &whole, &states[i], (char *)buf)) == 0)
                optimizer_state_set(o, i, 0, optimizer_state_count(&m->optimizer, &m->opt_tensors, o->n, i, &d), buf);
        } else { // this rank's shard of it, tensor by tensor out of the trainable units' layout (the frozen
                 // units' shards, which have no state, read as zeros and dropped)
            StateFile ctx = {&sf, t, &h->config, h->frozen_units};
            rc = fsdp_read_shard(&h->units, m->fsdp->shard.rank, (float *)buf, read_state, &ctx);
            float *mine = (float *)buf + h->units.units[h->frozen_units].shard_offset;
            if (d == ST_BF16) // (read as floats, exactly: back to bf16 in place, each element over one already read)
                for (size_t j = 0; j < o->n; j++) ((uint16_t *)mine)[j] = bf16_from_f32(mine[j]);
            if (rc == 0) optimizer_state_set(o, i, 0, o->n, mine);
        }
    }
    free(buf);
    optim_tensors_free(&whole);
    if (rc == 0 && sf.n_tensors != n_states) { // what it holds and what this run expects differ: not this optimizer's
        fprintf(stderr, "error: %s: %d tensors, and --optimizer %s keeps %d\n", path, sf.n_tensors, optimizer_names[m->optimizer.kind], n_states);
        rc = -1;
    }
    st_close(&sf);
    return rc;
}

// The loss scale a checkpoint's state st (from path) saved into *ls, when ls->on
// (a checkpoint without one, written with no scaler: the initial scale). 0 ok, -1 with a message.
static int load_loss_scale(const JsonValue *st, const char *path, LossScale *ls) {
    double scale;
    long long tracker;
    if (!ls->on || !json_get(st, "loss_scale")) return 0;
    if (json_get_number(st, "loss_scale", &scale) != 0 || !(scale > 0) || !isfinite((float)scale) ||
        json_get_int(st, "loss_scale_growth_tracker", &tracker) != 0 || tracker < 0 || tracker >= LOSS_SCALE_GROWTH_INTERVAL) {
        fprintf(stderr, "error: %s: 'loss_scale' is not a positive finite number or 'loss_scale_growth_tracker' not an "
                "integer in [0, %d)\n", path, LOSS_SCALE_GROWTH_INTERVAL);
        return -1;
    }
    ls->scale = (float)scale;
    ls->growth_tracker = (int)tracker;
    return 0;
}

// Reads a checkpoint's state, moments (and sharded weights), after checking
// that it belongs to this run (same trajectory-shaping options, same global
// batch, same data file).
static int load_checkpoint(TrainConfig *tc, const char *dir, int world, Model *m, Optimizer *o, TrainState *ts) {
    char path[PATH_MAX + 64], val[4096], def[64], fp[300];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    JsonValue st;
    if (json_load_file(path, &st) != 0) return -1;
    int rc = -1;
    long long v[5], saved_world = 1, saved_batch, saved_ga;
    const char *keys[5] = {"step", "optimizer_step", "data_epoch", "data_position", "bad_steps_in_row"}, *saved;
    const JsonValue *opts_saved = json_get(&st, "options");
    Option opts[] = OPTIONS(tc);
    for (int i = 0; i < 5; i++)
        if (json_get_int(&st, keys[i], &v[i]) != 0 || v[i] < 0 || v[i] > INT32_MAX) {
            fprintf(stderr, "error: %s: '%s' missing or not a non-negative integer\n", path, keys[i]); goto done;
        }
    if (!opts_saved || opts_saved->type != JSON_OBJECT) { fprintf(stderr, "error: %s: no \"options\" object\n", path); goto done; }
    for (size_t k = 0; k < sizeof resume_must_match / sizeof resume_must_match[0]; k++)
        for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
            if (strcmp(opts[i].name, resume_must_match[k])) continue;
            option_value(&opts[i], val, sizeof val, 1);
            // an option newer than the checkpoint is absent from it: the run had its default
            if (json_get_string(opts_saved, opts[i].name, &saved, NULL) != 0) {
                if (opts[i].type == OPT_FLOAT) snprintf(def, sizeof def, "%.9g", (float)strtod(opts[i].def, NULL));
                else snprintf(def, sizeof def, "%s", opts[i].def);
                saved = def;
            }
            if (strcmp(saved, val) != 0) {
                fprintf(stderr, "error: --resume %s: --%s was '%s' in the checkpoint but is '%s' now; resume with the same value\n",
                        dir, opts[i].name, saved, val);
                goto done;
            }
        }
    if (json_get(&st, "world_size") && (json_get_int(&st, "world_size", &saved_world) != 0 || saved_world < 1)) {
        fprintf(stderr, "error: %s: 'world_size' is not a positive integer\n", path); goto done;
    }
    if (json_get_string(opts_saved, "batch_size", &saved, NULL) != 0 || (saved_batch = atoll(saved)) < 1 ||
        json_get_string(opts_saved, "gradient_accumulation_steps", &saved, NULL) != 0 || (saved_ga = atoll(saved)) < 1) {
        fprintf(stderr, "error: %s: no --batch_size or --gradient_accumulation_steps in \"options\"\n", path); goto done;
    }
    if (saved_world * saved_ga * saved_batch != (long long)world * tc->grad_accum * tc->batch_size) {
        fprintf(stderr, "error: --resume %s: the global batch was %lld rows in the checkpoint (%lld rank(s) x %lld micro-batches "
                "x %lld rows) and is %lld now (%d x %d x %d); resume with the same rows per optimizer step (--global_batch_size "
                "%lld)\n", dir, saved_world * saved_ga * saved_batch, saved_world, saved_ga, saved_batch,
                (long long)world * tc->grad_accum * tc->batch_size, world, tc->grad_accum, tc->batch_size,
                saved_world * saved_ga * saved_batch);
        goto done;
    }
    file_fingerprint(tc->data, fp, sizeof fp);
    if (json_get_string(&st, "data_fingerprint", &saved, NULL) != 0 || strcmp(saved, fp) != 0) {
        fprintf(stderr, "error: --resume %s: the data file '%s' has changed since the checkpoint (size, time or contents)\n", dir, tc->data);
        goto done;
    }
    if (!strcmp(tc->objective, "dpo")) {
        reference_fingerprint(tc, fp, sizeof fp);
        if (json_get_string(&st, "reference_fingerprint", &saved, NULL) != 0 || strcmp(saved, fp) != 0) {
            fprintf(stderr, "error: --resume %s: DPO's reference is the model the run started from, and --model's weights or "
                    "--from_peft_checkpoint's adapter have changed since (size, time or contents)\n", dir);
            goto done;
        }
    }
    // (a dry run's plan needs none of the trained values, and has no room for them)
    if (load_loss_scale(&st, path, &ts->ls) != 0 || (!tc->dry_run && load_trainable(dir, m, o) != 0)) goto done;
    ts->step = (int)v[0]; ts->opt_t = (int)v[1]; ts->data_epoch = (int)v[2]; ts->data_pos = (int)v[3]; ts->bad_in_row = (int)v[4];
    o->t = ts->opt_t;
    rc = 0;
done:
    json_free(&st);
    return rc;
}

#endif
