// trainer/sample.h: sampling: continuations of --sample_prompt, printed before, during and
// after training. One sequence, with the KV carry as the cache.
#ifndef TRAINER_SAMPLE_H
#define TRAINER_SAMPLE_H

static int cmp_prob_desc(const void *a, const void *b) {
    float x = ((const float *)a)[0], y = ((const float *)b)[0];
    return (x < y) - (x > y);
}

// the next token from logits z (V): argmax at temperature 0, else a draw from
// softmax(z / temperature) restricted to the smallest set of tokens whose
// probability adds up to top_p (nucleus sampling). Ties go to the lower id.
static int sample_token(float *z, int V, float temperature, float top_p, uint64_t *rng) {
    int best = 0;
    for (int i = 1; i < V; i++) if (z[i] > z[best]) best = i;
    if (temperature <= 0.0f) return best;
    float (*pi)[2] = (float (*)[2])mallocCheck((size_t)V * sizeof *pi); // (probability, id) pairs
    double sum = 0;
    for (int i = 0; i < V; i++) { pi[i][0] = expf((z[i] - z[best]) / temperature); pi[i][1] = (float)i; sum += pi[i][0]; }
    qsort(pi, V, sizeof *pi, cmp_prob_desc);
    int n = 0;
    double kept = 0;
    while (n < V && (n == 0 || kept < top_p * sum)) kept += pi[n++][0];
    double r = rng_uniform(rng) * kept, acc = 0;
    int tok = (int)pi[n - 1][1];
    for (int i = 0; i < n; i++) if ((acc += pi[i][0]) > r) { tok = (int)pi[i][1]; break; }
    free(pi);
    return tok;
}

// Continues prompt (n_prompt >= 1 ids) by up to max_new tokens, stopping after eos.
// The prompt runs in chunks of the model's chunk size, then one token at a time,
// each step attending to the KV carry of everything before it. Returns the new
// tokens (malloc'd, *n_new of them); the length is capped by the model's T.
static int *generate(Model *m, const int *prompt, int n_prompt, int max_new, float temperature, float top_p,
                     uint64_t seed, int eos, int *n_new) {
    // positions the carry / a chunk's activations hold for one sequence: a row's, or with context
    // parallelism, whose carries hold B T / P positions a layer (every rank samples alike), at
    // most those
    int P = fsdp_context_size(m->fsdp), T = P > 1 && m->B < P ? m->B * m->T / P : m->T, cap = m->B * m->chunk_size;
    if (n_prompt > T - 1) n_prompt = T - 1;   // keep the end of a long prompt's room for one token
    if (max_new > T - n_prompt) max_new = T - n_prompt;
    int *seq = (int *)callocCheck(T, sizeof(int)), *out = (int *)mallocCheck((max_new + 1) * sizeof(int));
    memcpy(seq, prompt, n_prompt * sizeof(int));
    int training = m->host.lora.training;
    m->host.lora.training = 0; // no dropout
    uint64_t rng = seed;
    Chunk ch = {1, T, 0, 0, m->host.config.sliding_window, 0}; // full attention: --s2_attn is training's
    float *logits = NULL; // (V) of the last position run so far
    for (ch.t0 = 0; ch.t0 < n_prompt; ch.t0 += ch.len) {
        ch.len = n_prompt - ch.t0 < cap ? n_prompt - ch.t0 : cap;
        logits = model_next_logits(m, seq, &ch);
    }
    *n_new = 0;
    for (int pos = n_prompt; *n_new < max_new; pos++) {
        int tok = sample_token(logits, m->host.config.vocab_size, temperature, top_p, &rng);
        out[(*n_new)++] = tok;
        if (tok == eos || pos + 1 >= T) break;
        seq[pos] = tok;
        ch.t0 = pos; ch.len = 1;
        logits = model_next_logits(m, seq, &ch);
    }
    m->host.lora.training = training;
    free(seq);
    return out;
}

// writes s with its control bytes escaped (\n, \t, \xHH), so that a sample stays one
// line and a model's output can never move the cursor or recolour the user's terminal
static void fputs_escaped(const char *s, FILE *f) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '\n') fputs("\\n", f);
        else if (*c == '\t') fputs("\\t", f);
        else if (*c == '\\') fputs("\\\\", f);
        else if (*c < 0x20 || *c == 0x7f) fprintf(f, "\\x%02x", *c);
        else fputc(*c, f);
    }
}

static void print_samples(Model *m, const TrainConfig *tc, const Tokenizer *tok, int step) {
    for (int i = 0; i < tc->sample_prompt.n; i++) {
        const char *p = tc->sample_prompt.v[i];
        int n, k;
        int *ids = tokenizer_encode(tok, p, strlen(p), 1, 0, &n);
        if (!ids) die("--sample_prompt: cannot tokenize '%s'", p);
        int *gen = generate(m, ids, n, tc->max_new_tokens, tc->temperature, tc->top_p, (uint64_t)tc->seed + i, tok->eos_id, &k);
        if (k > 0 && gen[k - 1] == tok->eos_id) k--;
        char *text = tokenizer_decode(tok, gen, k, NULL);
        printf("sample at step %d | ", step);
        fputs_escaped(p, stdout);
        fputc('|', stdout);
        fputs_escaped(text ? text : "", stdout);
        fputc('\n', stdout);
        free(text); free(gen); free(ids);
    }
    fflush(stdout);
}

#endif
