// trainer/load.h: what a run loads: the model as the options say (model_load_host: LoRA
// or full fine-tuning, whole or this rank's shards, fresh or from a checkpoint; model_setup:
// then the backend's model_alloc), and the tokenizer and the data (load_data) into the
// Trainer, which holds everything a run loads and allocates.
#ifndef TRAINER_LOAD_H
#define TRAINER_LOAD_H

// ----------------------------------------------------------------------------
// setting up the model

// a checkpoint written by sharded full fine-tuning: fsdp.h's shards and index, no model.safetensors
static int checkpoint_is_sharded(const char *dir) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, FSDP_INDEX_NAME);
    return access(path, F_OK) == 0;
}

// sets up the model for training as tc says: LoRA adapters (fresh or from a PEFT folder) or full
// fine-tuning; resume_dir, when given, is a checkpoint whose trained weights replace the starting ones
// (a sharded one's in load_checkpoint, so then nothing is read from --model but config.json). The base weights are whole, or with a shard group of more than
// one rank (f) this rank's shards. model_load_host sets up the host model; model_setup then has the
// backend's model_alloc take it from there, for micro-batches of B rows. -1 (nothing left allocated) on failure.
static int model_load_host(Model *m, Fsdp *f, const TrainConfig *tc, const char *resume_dir) {
    memset(m, 0, sizeof *m);
    m->fsdp = f;
    HostModel *h = &m->host;
    int resume_sharded = resume_dir && tc->full_finetune && checkpoint_is_sharded(resume_dir);
    const char *weights = resume_dir && tc->full_finetune ? resume_dir : tc->model;
    int G = f ? f->shard.size : 1, rc;
    h->quant_type = tc->quant_type;
    h->double_quant = tc->double_quant;
    h->align_blocks = tc->optim.kind == OPTIMIZER_ADAMW8BIT && tc->full_finetune;
    // a base whole on one rank, or full fine-tuning's shards of it, which the backend reads where it
    // keeps it (the GPU's): none here (--pure_bf16 --cpu_offload: the GPU's bf16 weights, copied
    // down once into the host's bf16 parameters); but --cpu_offload's fp32 masters, which are the
    // host's, a sharded checkpoint read into a whole model, LoRA's shards, and the shards of units
    // frozen in fp32 (a sharded checkpoint's could not be read again for a save: no --pure_bf16
    // weights hold them)
    int fp32_offload = tc->cpu_offload && !tc->pure_bf16;
    h->base_deferred = backend_streams_base && tc->quant_type == QUANT_NONE &&
                       (G == 1 ? !(tc->full_finetune && (fp32_offload || resume_sharded))
                               : tc->full_finetune && !fp32_offload && !(tc->freeze_layers && !tc->pure_bf16));
    h->base_resumed = h->base_deferred && resume_sharded; // (its weights come with its optimizer state)
    h->base_dir = weights, h->base_random = tc->random_init, h->base_seed = (uint64_t)tc->seed;
    int read_now = !tc->dry_run && !h->base_deferred;
    if (tc->random_init) rc = model_init_random(h, tc->model, (uint64_t)tc->seed, G > 1 ? f->shard.rank : 0, G, read_now);
    else if (resume_sharded) rc = model_shape(h, tc->model, G, read_now); // load_checkpoint reads every weight: none from --model
    else if (!read_now) rc = model_check(h, weights, G); // the shapes alone: nothing of the model's size
    else rc = G > 1 ? model_load_shard(h, weights, f->shard.rank, G) : model_load(h, weights);
    if (rc != 0) { host_model_free(h); return -1; }
    if (tc->pure_bf16 && read_now) model_round_bf16(h);
    h->full_finetune = tc->full_finetune;
    h->use_lora = !tc->full_finetune;
    if (tc->freeze_layers > h->config.n_layers) {
        fprintf(stderr, "error: --freeze_layers %d is more than the %d decoder layers of %s (num_hidden_layers)\n", tc->freeze_layers,
                h->config.n_layers, tc->model);
        host_model_free(h);
        return -1;
    }
    if (tc->offload_every > h->config.n_layers) {
        fprintf(stderr, "error: --offload_every %d is more than the %d decoder layers of %s (num_hidden_layers)\n", tc->offload_every,
                h->config.n_layers, tc->model);
        host_model_free(h);
        return -1;
    }
    if (tc->s2_attn && (h->config.sliding_window || h->config.n_heads % 2)) { // S2-Attn's mask replaces the causal one
        if (h->config.sliding_window)
            fprintf(stderr, "error: --s2_attn: %s has a sliding window of %d keys (sliding_window), which shifted sparse "
                    "attention does not combine with\n", tc->model, h->config.sliding_window);
        else
            fprintf(stderr, "error: --s2_attn splits the query heads in halves: %s has %d (num_attention_heads), an odd "
                    "number\n", tc->model, h->config.n_heads);
        host_model_free(h);
        return -1;
    }
    h->frozen_units = tc->freeze_layers ? tc->freeze_layers + 1 : 0; // the embedding's unit, then the layers'
    if (h->use_lora) {
        int in[LORA_N_TARGETS], out[LORA_N_TARGETS];
        lora_shapes(&h->config, in, out);
        const char *adapter = resume_dir ? resume_dir : tc->from_peft_checkpoint;
        unsigned saved;
        lora_parse_saved(tc->trainable_params, &saved, "--trainable_params");
        if (adapter[0]) {
            if (lora_load_peft(&h->lora, adapter, h->config.n_layers, in, out, h->config.vocab_size, h->config.tied) != 0) {
                host_model_free(h);
                return -1;
            }
            if (h->lora.saved && (host_sharded(h) || h->quant_type != QUANT_NONE)) {
                fprintf(stderr, "error: %s saves base tensors (modules_to_save), which this trainer, sharded or with "
                        "--quantize, does not train yet\n", adapter);
                host_model_free(h);
                return -1;
            }
            if (saved && saved != h->lora.saved) {
                fprintf(stderr, "error: --trainable_params %s: %s trains %s (its modules_to_save)\n", tc->trainable_params,
                        adapter, lora_saved_json(h->lora.saved));
                host_model_free(h);
                return -1;
            }
            const char *kind = lora_method(&h->lora);
            if (!resume_dir && strcmp(tc->peft_method, "lora") && strcmp(tc->peft_method, kind)) { // (a resume's options match its own)
                fprintf(stderr, "error: --peft_method %s, but --from_peft_checkpoint %s holds %s\n", tc->peft_method, adapter,
                        !strcmp(kind, "lora") ? "a LoRA adapter" : !strcmp(kind, "ia3") ? "an IA3 adapter"
                        : !strcmp(kind, "prefix") ? "a prefix" : "a llama_adapter");
                host_model_free(h);
                return -1;
            }
        } else if (!strcmp(tc->peft_method, "llama_adapter")) {
            if (tc->adapter_layers > h->config.n_layers) { // (peft refuses it too)
                fprintf(stderr, "error: --adapter_layers %d is more than the %d decoder layers of %s (num_hidden_layers)\n",
                        tc->adapter_layers, h->config.n_layers, tc->model);
                host_model_free(h);
                return -1;
            }
            adapter_alloc(&h->lora, h->config.n_layers, in, out, tc->adapter_len, tc->adapter_layers, (uint64_t)tc->seed);
        } else if (!strcmp(tc->peft_method, "prefix")) {
            prefix_alloc(&h->lora, h->config.n_layers, in, out, tc->num_virtual_tokens, (uint64_t)tc->seed);
        } else if (!strcmp(tc->peft_method, "ia3")) {
            unsigned targets, feedforward;
            ia3_modules(tc, &targets, &feedforward); // (parse_args checked them)
            ia3_alloc(&h->lora, h->config.n_layers, in, out, targets, feedforward);
        } else {
            unsigned targets;
            lora_parse_targets(tc->lora_target_modules, "--lora_target_modules", &targets);
            lora_alloc(&h->lora, h->config.n_layers, in, out, tc->lora_r, tc->lora_alpha, tc->lora_dropout,
                       tc->use_rslora, tc->use_dora, targets);
            lora_init(&h->lora, (uint64_t)tc->seed);
            if (saved && host_sharded(h)) {
                fprintf(stderr, "error: --trainable_params with sharded base weights is not supported yet\n");
                host_model_free(h);
                return -1;
            }
            if (saved) { // they start as the base's (a dry run has no weights; a streamed base seeds them as it streams)
                lora_add_saved(&h->lora, saved, h->config.vocab_size, h->config.dim, h->config.tied, !tc->dry_run);
                if (!tc->dry_run && h->base_deferred) h->saved_from_base = 1;
                else if (!tc->dry_run) model_saved_copy(h, 1);
            }
        }
        h->lora.kv_heads = h->config.n_kv_heads;
        if (h->lora.prefix && h->config.sliding_window) { // (its window would count the virtual positions: untested)
            fprintf(stderr, "error: a prefix on %s, a model with a sliding window (sliding_window %d), is not supported yet\n",
                    tc->model, h->config.sliding_window);
            host_model_free(h);
            return -1;
        }
        if ((h->lora.adapter_len || h->lora.prefix) && (tc->merge_adapter || tc->export_gguf[0] || tc->export_gguf_adapter[0])) {
            fprintf(stderr, "error: %s: %s no weight change, so it cannot be merged into the model or exported (drop it)\n",
                    tc->merge_adapter ? "--merge_adapter" : tc->export_gguf[0] ? "--export_gguf" : "--export_gguf_adapter",
                    h->lora.prefix ? "a prefix's keys and values are" : "a llama_adapter's prompt is");
            host_model_free(h);
            return -1;
        }
        if (h->quant_type != QUANT_NONE && h->lora.use_dora) { // DoRA's row norms read W, which QLoRA keeps packed
            fprintf(stderr, "error: --quantize with DoRA (%s) is not supported yet\n", adapter[0] ? adapter : "--use_dora");
            host_model_free(h);
            return -1;
        }
    }
    m->fp32 = !strcmp(tc->precision, "fp32");
    m->fp16 = !strcmp(tc->precision, "fp16");
    m->collectives = tc->collectives;
    m->dry_run = tc->dry_run;
    m->activation_checkpointing = tc->activation_checkpointing;
    m->cpu_offload = tc->cpu_offload && tc->full_finetune;
#ifdef BACKEND_BASE_OFFLOAD
    m->base_offload = tc->cpu_offload && !tc->full_finetune; // (an adapter's frozen base in host memory)
    m->peak_tflops = tc->peak_tflops;
#endif
#ifdef BACKEND_ACTIVATION_OFFLOAD
    m->activation_offloading = tc->activation_offloading; // (with activation checkpointing: model_plan)
    m->offload_every = tc->offload_every;
#endif
    m->pure_bf16 = tc->pure_bf16;
    m->s2_attn = tc->s2_attn;
    m->optimizer = tc->optim;
#ifdef BACKEND_PREFERENCE
    m->reference = !strcmp(tc->objective, "dpo") && !tc->precompute_ref_log_probs; // (its copy counts in the plans)
#endif
    return 0;
}
static int model_setup(Model *m, Fsdp *f, const TrainConfig *tc, int B, int T, const char *resume_dir) {
    if (model_load_host(m, f, tc, resume_dir) != 0) return -1;
    model_alloc(m, B, T, tc->chunk_size, strcmp(tc->chunk_memory, "recompute") == 0, tc->num_output_chunks);
    return 0;
}

// ----------------------------------------------------------------------------
// the tokenizer and the data, into the run's Trainer

// everything a run loads and allocates: train() frees it on one path, however
// far train_run got
typedef struct {
    Fsdp fsdp;              // the ranks (a world of one without a launcher) and the strategy
    char tokpath[4096];     // the tokenizer file (--tokenizer, else the model's)
    int pad_id;             // what pads a row: EOS, or 0 for a tokenizer without one (never a label, never attended)
    char resume_dir[PATH_MAX]; // the checkpoint --resume names, resolved
    Tokenizer tok;
    Dataset all_ds, train_ds, val_ds; // all_ds: the file when --val_split cuts it in two
    Model m;
    Optimizer opt;
    DataLoader dl;
    FILE *metrics;
    TbWriter tb;            // --tensorboard_dir's event file (rank 0)
    int *tokens, *targets;  // (GA, B, T) a step's micro-batches (this rank's rows)
    int *Ts;                // (GA) their lengths
    double pair_positions[2]; // preference tuning: the positions its steps ran, and as two rows a pair (--shared_prompt)
    int32_t *rows;          // (GA, B) their rows of the training set (preference tuning: pairs)
} Trainer;

// a validation set: --val_data, or --val_split cutting one off the training data
static int has_validation(const TrainConfig *tc) { return tc->val_data[0] || tc->val_split > 0; }

// The tokenizer and the data into r, and *T, the longest row (or sample) there
// is room for. Local to this rank. 0 ok, -1 with a message.
static int load_data(const TrainConfig *tc, Trainer *r, const char *tokpath, int *T) {
    Tokenizer *tok = &r->tok;
    char tokdir[4096];
    snprintf(tokdir, sizeof tokdir, "%s", tokpath);
    char *slash = strrchr(tokdir, '/');
    if (slash) *slash = 0;
    else snprintf(tokdir, sizeof tokdir, ".");
    if (tokenizer_load(tok, tokpath) != 0 || tokenizer_configure(tok, tc->tokenizer[0] ? NULL : tc->model, tokdir) != 0) return -1;
    r->pad_id = tok->eos_id >= 0 ? tok->eos_id : 0;
    Dataset *train_ds = &r->train_ds, *val_ds = &r->val_ds;
    DataOptions dopt = {tc->data_format, tc->train_on_prompt, !strcmp(tc->batching, "packing"), tc->max_seq_len,
                        tc->max_samples, tc->data_slice, tc->data_cache_dir, 0};
    if (dataset_load(&r->all_ds, tc->data, tok, tokpath, &dopt) != 0) return -1;
    if (tc->val_split > 0) {
        if (dataset_split(&r->all_ds, tc->val_split, (uint64_t)tc->seed, train_ds, val_ds) != 0) return -1;
    } else {
        *train_ds = r->all_ds; // no split: the training set is the whole file
        memset(&r->all_ds, 0, sizeof r->all_ds);
        DataOptions vopt = dopt; // a separate validation file takes all its samples
        vopt.max_samples = 0; vopt.slice = "";
        if (tc->val_data[0] && dataset_load(val_ds, tc->val_data, tok, tokpath, &vopt) != 0) return -1;
    }
    int pairs = train_ds->format == FORMAT_PREFERENCE;
    if (pairs != preference(tc)) {
        if (pairs) fprintf(stderr, "error: %s holds preference pairs ({prompt, chosen, rejected}): train on them with --objective dpo or orpo\n", tc->data);
        else fprintf(stderr, "error: --objective %s trains on preference pairs: %s is in format %s (give {\"prompt\", \"chosen\", \"rejected\"} records)\n",
                     tc->objective, tc->data, data_format_names[train_ds->format]);
        return -1;
    }
    if (has_validation(tc) && (val_ds->format == FORMAT_PREFERENCE) != pairs) { // (the SFT formats may differ)
        fprintf(stderr, "error: --val_data %s is in format %s, the training data in %s: both preference pairs or neither\n", tc->val_data,
                data_format_names[val_ds->format], data_format_names[train_ds->format]);
        return -1;
    }
    *T = dataset_max_len(train_ds);
    if (tc->s2_attn && *T % 4) { // packing's rows are --max_seq_len long, but for a lone shorter one
        fprintf(stderr, "error: --s2_attn cuts rows in 4 groups: %s packs into one row of %d tokens, not a multiple of 4\n",
                tc->data, *T);
        return -1;
    }
    if (has_validation(tc) && dataset_max_len(val_ds) > *T) *T = dataset_max_len(val_ds);
    int sample_len = 0; // room for the samples' prompts and continuations
    for (int i = 0; i < tc->sample_prompt.n; i++) {
        int n = (int)strlen(tc->sample_prompt.v[i]) + 1 + tc->max_new_tokens; // a token has at least one byte
        sample_len = n > sample_len ? n : sample_len;
    }
    if (sample_len > *T) *T = sample_len < tc->max_seq_len ? sample_len : tc->max_seq_len;
    return 0;
}

#endif
