// trainer/plan.h: what a run will take, known before it starts: its FLOPs (for TFLOP/s
// and MFU), its memory plan (printed, and alone with --dry_run), the batch that fits
// (--batch_size auto, --global_batch_size), and the host memory check that refuses a run
// too big for the machine before its weights load.
#ifndef TRAINER_PLAN_H
#define TRAINER_PLAN_H

// ----------------------------------------------------------------------------
// FLOPs and the memory plan

// Model FLOPs of one sequence of T tokens, forward and backward (docs/performance.md):
// a matmul with W (O, I) costs 2 O I per token forward; the backward costs the
// same again for dX, and again for dW when W trains. So full fine-tuning is
// 6 N T and LoRA 4 N T (plus its small adapters), N = the matmul parameters
// (the head included, the embedding lookup not). Causal attention adds
// 2 L NH hd T^2 forward (QK^T and PV over half the T x T scores) and twice
// that backward; with a sliding window of W < T keys only the scores inside
// it count, T^2 / 2 - (T - W)^2 / 2 of them; with --s2_attn (s2) those of the
// groups, G^2 / 2 a group of G = T / 4: 4 of them in the first half of the heads,
// 3 and two of G / 2 in the second, 15/64 of T^2 / 2 over all. Recomputed forwards
// (--chunk_memory recompute, --activation_checkpointing) are not counted (layer_forward_flops).
static double layer_matmul_params(const Config *c) { // (a decoder layer's seven projections)
    double D = c->dim, H = c->hidden_dim, Q = (double)c->n_heads * c->head_dim, KV = (double)c->n_kv_heads * c->head_dim;
    return D * Q * 2 + D * KV * 2 + 3 * D * H;
}
static double attention_flops(const Config *c, int T, int s2) { // (every layer's, forward)
    double Q = (double)c->n_heads * c->head_dim, outside = c->sliding_window && c->sliding_window < T ? (double)(T - c->sliding_window) : 0;
    return 2.0 * c->n_layers * Q * ((double)T * T - outside * outside) * (s2 ? 15.0 / 64 : 1.0);
}
static double flops_per_sequence(const HostModel *m, int T, int s2) {
    const Config *c = &m->config;
    double N = c->n_layers * layer_matmul_params(c) + (double)c->vocab_size * c->dim;
    double lora = 0;
    if (m->use_lora) {
        int in[LORA_N_TARGETS], out[LORA_N_TARGETS];
        lora_shapes(c, in, out);
        for (int t = 0; t < LORA_N_TARGETS; t++)
            if (m->lora.targets & (1u << t)) lora += c->n_layers * (double)m->lora.r * (in[t] + out[t]);
    }
    return (m->full_finetune ? 6 * N : 4 * N + 6 * lora) * T + 3 * attention_flops(c, T, s2);
}

// What training holds, known before it starts: printed as the memory plan
// (and alone with --dry_run). Per process; this trainer runs one rank, which holds
// step_rows rows of a step's batch at once (its micro-batches x rows: train_begin).
// Returns the backend memory's total (the GPU's, or the CPU's resident memory);
// *host (when not NULL) the host memory's: the same on the CPU, and beside a GPU the
// host model as loaded, LoRA's weights, the checkpoint staging buffer and the data.
static double memory_plan(const Model *m, const Dataset *train, const Dataset *val, long step_rows, int print, double *host) {
    const double MiB = 1048576.0;
    double weights = m->weight_bytes, trainable = m->param_bytes, data = step_rows * (double)m->T * 2 * sizeof(int);
    for (int i = 0; i < 2; i++) {
        const Dataset *d = i ? val : train;
        if (d && d->store) data += d->n_tokens * 5.0 + d->n_rows * 8.0; // tokens and label flags (mapped cache)
    }
#ifdef BACKEND_HOST_PLAN
    double part[HOST_PLAN_PARTS], total = weights + trainable + m->act_bytes + m->carry_bytes, host_total = data;
    for (int i = 0; i < HOST_PLAN_PARTS; i++) host_total += part[i] = model_host_bytes(m, i);
#else // the plan is host memory
    double total = weights + trainable + m->act_bytes + m->carry_bytes + data, host_total = total;
#endif
    if (host) *host = host_total;
    if (print) {
        printf("memory plan (%s of this process):\n", backend_memory);
        const char *stored = m->pure_bf16 ? (m->fp32 ? "weights (bf16 values in fp32)" : "weights (bf16, no fp32 copy)")
                             : m->fp32 ? "base weights (fp32)" : m->fp16 ? "base weights (fp16)" : "base weights (bf16)";
        printf("  %-34s %10.1f MiB\n", stored, weights / MiB);
#ifdef BACKEND_BASE_OFFLOAD
        if (m->base_offload) base_offload_plan(m); else // (the layers' ring, and their stream's bytes and time)
#endif
        if (m->host.quant_type != QUANT_NONE) {
            printf("    %-32s %10.1f MiB   (%s%s, blocks of %d%s)\n", "of which 4-bit layers", model_run_bytes_held(&m->host) / MiB,
                   quant_type_names[m->host.quant_type], m->host.double_quant ? ", double quantization" : "", QUANT_BLOCK,
                   m->host.units.n_shards > 1 ? "; this rank's shards" : "");
            printf("    %-32s %10.1f MiB   (%s, %s)\n", "of which dequantize scratch", model_dequant_scratch_bytes(m) / MiB,
                   backend_dequant_scratch, m->fp32 ? "fp32" : m->fp16 ? "fp16" : "bf16");
        }
        char what[64];
        snprintf(what, sizeof what, "trainable weights, grads%s%s", optimizer_n_states(&m->optimizer) ? ", " : "",
                 optimizer_n_states(&m->optimizer) ? optimizer_state_what[m->optimizer.kind] : "");
        printf("  %-34s %10.1f MiB\n", what, trainable / MiB);
        printf("  %-34s %10.1f MiB   (%s of %d, %s%s)\n", "activations and scratch", m->act_bytes / MiB,
               m->fsdp && m->fsdp->context.size > 1 ? "context-parallel pieces" : "chunks", m->chunk_size, m->recompute ? "recompute" : "keep", m->activation_checkpointing ? ", activation checkpointing" : "");
        printf("  %-34s %10.1f MiB\n", "KV and dKV carry", m->carry_bytes / MiB);
#ifdef BACKEND_ACTIVATION_OFFLOAD
        if (m->activation_offloading) activation_offload_plan(m); // (one layer's carries; the layers' inputs on the host)
#endif
#ifdef BACKEND_HOST_PLAN
        printf("  %-34s %10.1f MiB\n", "total", total / MiB);
        printf("host memory plan (of this process; ranks on one machine share it):\n");
        for (int i = 0; i < HOST_PLAN_PARTS; i++)
            if (i < host_plan_always || part[i] > 0) printf("  %-34s %10.1f MiB\n", host_plan_names[i], part[i] / MiB);
#endif
        printf("  %-34s %10.1f MiB\n", "tokenized data and the batch", data / MiB);
        printf("  %-34s %10.1f MiB\n", "total", host_total / MiB);
    }
    return total;
}

// ----------------------------------------------------------------------------
// the batch: rows per micro-batch (--batch_size, or auto) and micro-batches per
// optimizer step (--gradient_accumulation_steps, or from --global_batch_size)

// --gradient_accumulation_steps from --global_batch_size G: G / (B x W), refused
// when that does not divide or disagrees with one given; with neither given, 1.
// Then G is the rows of a step either way (what a resume must keep). The same on
// every rank: 0 ok, -1 (rank 0 says why).
static int batch_derive(TrainConfig *tc, int W, int rank0) {
    long rows = (long)tc->batch_size * W, G = tc->global_batch_size; // rows: one global micro-batch
    if (!G) {
        if (!tc->grad_accum) tc->grad_accum = 1;
        G = rows * tc->grad_accum;
        if (G > INT_MAX) {
            if (rank0) fprintf(stderr, "error: %d rank(s) x %d micro-batches x %d rows is more rows per step than this trainer counts\n",
                               W, tc->grad_accum, tc->batch_size);
            return -1;
        }
        tc->global_batch_size = (int)G;
        return 0;
    }
    if (G % rows) {
        if (rank0) fprintf(stderr, "error: --global_batch_size %ld is not a multiple of --batch_size %d x %d rank(s) = %ld rows\n",
                           G, tc->batch_size, W, rows);
        return -1;
    }
    if (tc->grad_accum && tc->grad_accum != G / rows) {
        if (rank0) fprintf(stderr, "error: --global_batch_size %ld with --batch_size %d on %d rank(s) means --gradient_accumulation_steps "
                           "%ld, not %d (give one of the two)\n", G, tc->batch_size, W, G / rows, tc->grad_accum);
        return -1;
    }
    tc->grad_accum = (int)(G / rows);
    return 0;
}

// --batch_size auto: the most rows per micro-batch (up to BATCH_SIZE_MAX) whose memory
// plan (memory_plan with the backend's model_plan) fits model_memory_budget on every rank;
// with --global_batch_size, the most of those whose global micro-batch (B x W rows)
// divides it, gradient accumulation making up the rest. Sets tc->batch_size. The plan
// grows with B, so a bisection finds it. Collective: 0 ok, -1 on every rank (a failing
// rank says why).
static int batch_auto(TrainConfig *tc, Model *m, Fsdp *f, const Dataset *train, const Dataset *val, int T) {
    const double MiB = 1048576.0;
    int W = fsdp_data_size(f), recompute = !strcmp(tc->chunk_memory, "recompute"), lo = 0, hi = BATCH_SIZE_MAX; // lo fits (0: none)
    double budget = model_memory_budget(m, tc->memory_limit * 1073741824.0), need[2];
    long G = tc->global_batch_size, GA = tc->grad_accum ? tc->grad_accum : 1;
    #define STEP_ROWS(B) (G ? G / W : GA * (B)) // a rank's rows of a step
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        model_plan(m, mid, T, tc->chunk_size, recompute, tc->num_output_chunks);
        if (memory_plan(m, train, val, STEP_ROWS(mid), 0, NULL) <= budget) lo = mid;
        else hi = mid - 1;
    }
    if (G % W) lo = 0; // no B x W rows divide it (batch_derive would say so, later)
    while (lo > 0 && G && G % ((long)lo * W)) lo--;
    for (int i = 0; i < 2; i++) { // what the chosen batch and one more row need (for the message)
        model_plan(m, lo + i > 0 ? lo + i : 1, T, tc->chunk_size, recompute, tc->num_output_chunks);
        need[i] = memory_plan(m, train, val, STEP_ROWS(lo + i > 0 ? lo + i : 1), 0, NULL);
    }
    #undef STEP_ROWS
    if (!lo && G % W) fprintf(stderr, "error: --global_batch_size %ld is not a multiple of the %d ranks\n", G, W);
    else if (!lo)
        fprintf(stderr, "error: --batch_size auto: even one row per micro-batch needs a memory plan of %.1f MiB, more than the "
                "%.1f MiB %s for it%s (less memory: --chunk_size with --chunk_memory recompute, --activation_checkpointing, "
                "--max_seq_len, sharding over more ranks)\n", need[0] / MiB, fmax(budget, 0) / MiB,
                tc->memory_limit > 0 ? "--memory_limit leaves" : "free", f->world.size > 1 ? " on this rank" : "");
    float mine = (float)lo, *all = (float *)mallocCheck((size_t)f->world.size * sizeof(float)); // exact: lo <= 2^16
    fsdp_all_gather(&f->world, all, &mine, 1);
    int B = BATCH_SIZE_MAX;
    for (int i = 0; i < f->world.size; i++) B = all[i] < B ? (int)all[i] : B;
    free(all);
    if (B == 0) return -1;
    tc->batch_size = B;
    if (f->world.rank == 0)
        printf("--batch_size auto: %d rows per micro-batch%s: a memory plan of %.1f MiB of the %.1f MiB %s (%d rows: %.1f MiB)\n",
               B, f->world.size > 1 ? " (the least of every rank's)" : "", need[0] / MiB, budget / MiB,
               tc->memory_limit > 0 ? "--memory_limit leaves for it" : "free", lo + 1, need[1] / MiB);
    return 0;
}

// ----------------------------------------------------------------------------
// the host memory plan against what the machine has

// the host memory available now (/proc/meminfo's MemAvailable: free, and what the kernel can
// reclaim without swapping), in bytes; 0 when it cannot tell
static double host_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib * 1024.0;
}

// what the host memory plan may take: --host_memory_limit, or what the machine had
// available when the run started (0: unknown, no limit)
static double host_limit(const TrainConfig *tc, double available) {
    return tc->host_memory_limit > 0 ? tc->host_memory_limit * 1073741824.0 : available;
}
static int host_plan_fits(const TrainConfig *tc, double plan, double available) {
    double limit = host_limit(tc, available);
    return limit <= 0 || plan <= limit;
}
// A run whose host memory plan does not fit is refused (a dry run: said). 0 ok, -1.
static int check_host_plan(const TrainConfig *tc, double plan, double available) {
    const double GiB = 1073741824.0, limit = host_limit(tc, available);
    if (host_plan_fits(tc, plan, available)) return 0;
    fflush(stdout); // (after the plan)
    fprintf(stderr, "%s: the host memory plan (%.1f GiB) exceeds the %.1f GiB %s (less: %s--quantize nf4, sharding over "
                "more machines%s)\n", tc->dry_run ? "note" : "error", plan / GiB, limit / GiB,
                tc->host_memory_limit > 0 ? "of --host_memory_limit" : "this machine had available at start (--host_memory_limit sets it)",
                tc->full_finetune ? "LoRA rather than --full_finetune, " : "", model_host_advice);
    return tc->dry_run ? 0 : -1;
}

// Before the weights load: the model set up as a dry run's (shapes, no weights), planned at
// the run's batch (auto: one row) and checked, so that a model too big for the host is
// refused in seconds, with its plan, not after minutes of loading or by the kernel's
// out-of-memory killer. 0 ok, -1.
static int check_host_plan_first(TrainConfig *tc, Trainer *r, int T, double available) {
    TrainConfig dry = *tc;
    dry.dry_run = 1;
    int B = tc->batch_size ? tc->batch_size : 1, GA = tc->grad_accum ? tc->grad_accum : 1;
    Model *m = &r->m;
    const Dataset *val = has_validation(tc) ? &r->val_ds : NULL;
    if (model_load_host(m, &r->fsdp, &dry, tc->resume[0] ? r->resume_dir : NULL) != 0) return -1;
    model_plan(m, preference(tc) ? 2 * B : B, T, tc->chunk_size, strcmp(tc->chunk_memory, "recompute") == 0, tc->num_output_chunks);
    double host;
    memory_plan(m, &r->train_ds, val, (long)GA * B, 0, &host);
    if (!host_plan_fits(tc, host, available)) memory_plan(m, &r->train_ds, val, (long)GA * B, 1, NULL);
    model_free(m);
    return check_host_plan(tc, host, available);
}

// what the run will do: the model, the steps and their rows, and the memory plan;
// returns the host memory it plans
static double print_plan(const TrainConfig *tc, Trainer *r, int T, int total) {
    const Model *m = &r->m;
    const Config *c = &m->host.config;
    printf("model %s: %d layers, dim %d, %d heads (%d kv) of %d, vocab %d, RoPE %s theta %g, %.2fM parameters", tc->model,
           c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, rope_type_names[c->rope_type],
           c->rope_theta, m->host.num_params / 1e6);
    if (c->sliding_window) printf(", a sliding window of %d keys", c->sliding_window);
    printf("\n");
    if (m->s2_attn) printf("attention in training: shifted sparse (--s2_attn), rows of %d cut in 4 groups of %d; full in evaluation\n", T, T / 4);
    char frozen[96];
    snprintf(frozen, sizeof frozen, "all weights but the embedding%s and the first %d layer(s)", c->tied ? " (the head too: tied)" : "",
             m->host.frozen_units - 1);
    static const char *saved[4] = {"", " with the embedding", " with the norms", " with the embedding and the norms"};
    const char *rows = preference(tc) ? "pairs" : "rows"; // (a pair is two rows)
    printf("training %s%s: %zu trainable parameters%s, %ld %s, %d steps of %d x %d x %d %s (micro-batches x ranks x %s), T <= %d\n",
           !m->host.use_lora ? (m->host.frozen_units ? frozen : "all weights") : m->host.lora.adapter_len ? "llama_adapter" : m->host.lora.prefix ? "a prefix" : m->host.lora.ia3 ? "IA3" : m->host.lora.use_dora ? "DoRA" : "LoRA",
           saved[m->host.lora.saved & 3], r->opt.n,
           host_sharded(&m->host) && !m->host.use_lora ? " (this rank's shard)" : "",
           r->train_ds.n_rows, rows, total, tc->grad_accum, fsdp_data_size(&r->fsdp), tc->batch_size, rows, rows, T);
    double host;
    memory_plan(m, &r->train_ds, has_validation(tc) ? &r->val_ds : NULL, (long)tc->grad_accum * tc->batch_size, 1, &host);
    return host;
}

#endif
