// trainer/preference.h: preference tuning, --objective dpo | orpo (docs/preference.md), as TRL's
// DPOTrainer and ORPOTrainer train it.
//
// A micro-batch of B pairs is 2B rows, the chosen sequences then the rejected ones
// (dataset_fill_pairs), whose targets are their completions' tokens. Every objective's
// gradient is SFT's backward with a weight per predicted token in place of SFT's uniform
// 1 / N: the loss depends on a row only through its completion's log-probability
// S = -sum of the completion targets' cross-entropies (ORPO: also the chosen rows' mean
// cross-entropy), so d loss / d(a target's cross-entropy) = -d loss / dS for each of the
// row's completion targets. A step therefore runs, per micro-batch: a forward without
// gradients of the policy (each target's cross-entropy: model_forward with
// m->target_losses), for DPO one of the reference (model_reference_swap), the per-pair
// loss and its derivatives on the host (preference_pair), then the usual
// model_forward_backward with m->loss_weights. Chunks, recompute and activation
// checkpointing run unchanged: the weights are per token.
//
// The step's loss is the mean over every pair of the step (its micro-batches, every
// rank's); ORPO's nll is the mean over the chosen rows' predicted tokens of each
// micro-batch (of each rank), averaged over the step's micro-batches and ranks, as
// Hugging Face's Trainer averages the per-micro-batch losses TRL computes.
#ifndef TRAINER_PREFERENCE_H
#define TRAINER_PREFERENCE_H

// the metrics under TRL's names: DPO the first PM_DPO of them, ORPO all
enum { PM_REWARDS_CHOSEN, PM_REWARDS_REJECTED, PM_REWARDS_MARGINS, PM_REWARDS_ACCURACIES, PM_LOGPS_CHOSEN, PM_LOGPS_REJECTED,
       PM_DPO, PM_NLL_LOSS = PM_DPO, PM_LOG_ODDS_RATIO, PM_LOG_ODDS_CHOSEN, PM_N };
static const char *const preference_metric_names[PM_N] = {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                                                          "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"};
static int preference_metric_count(const TrainConfig *tc) { return !strcmp(tc->objective, "orpo") ? PM_N : PM_DPO; }

// what a pair's loss needs of its two rows: the completion's summed log-probability under the
// policy and (DPO) the reference, and its token count
typedef struct { double logp[2], ref[2]; int n[2]; } PairScores;

// log(1 - e^x) for x < 0, without cancellation on either side of -log 2
static double log1mexp(double x) { return x > -M_LN2 ? log(-expm1(x)) : log1p(-exp(x)); }
static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

// One pair's loss (ORPO: its odds-ratio term; the nll is the micro-batch's) in double; dl[s] =
// d loss / d p->logp[s] (0 chosen, 1 rejected); the pair's metrics added into pm.
static double preference_pair(const TrainConfig *tc, const PairScores *p, double dl[2], double *pm) {
    double beta = tc->beta, loss, reward[2];
    if (!strcmp(tc->objective, "orpo")) { // on the log-probabilities averaged over the completion
        double avg[2] = {p->logp[0] / p->n[0], p->logp[1] / p->n[1]};
        double lo = (avg[0] - avg[1]) - (log1mexp(avg[0]) - log1mexp(avg[1])), dlo = -beta * sigmoid(-lo);
        loss = -beta * log_sigmoid(lo);
        // d lo / d avg = 1 / (1 - e^avg) for the chosen, its negative for the rejected
        dl[0] = dlo / -expm1(avg[0]) / p->n[0];
        dl[1] = -dlo / -expm1(avg[1]) / p->n[1];
        for (int s = 0; s < 2; s++) reward[s] = beta * avg[s], pm[PM_LOGPS_CHOSEN + s] += avg[s];
        pm[PM_LOG_ODDS_RATIO] += log_sigmoid(lo);
        pm[PM_LOG_ODDS_CHOSEN] += lo;
    } else {
        double c = p->logp[0] - p->ref[0], r = p->logp[1] - p->ref[1], z = beta * (c - r), dz;
        if (!strcmp(tc->dpo_loss_type, "ipo")) { // on the log-ratios averaged over the completion
            double d = c / p->n[0] - r / p->n[1] - 1 / (2 * beta);
            loss = d * d;
            dl[0] = 2 * d / p->n[0];
            dl[1] = -2 * d / p->n[1];
        } else {
            if (!strcmp(tc->dpo_loss_type, "hinge")) loss = 1 - z > 0 ? 1 - z : 0, dz = 1 - z > 0 ? -1 : 0;
            else loss = -log_sigmoid(z), dz = -sigmoid(-z);
            dl[0] = beta * dz;
            dl[1] = -beta * dz;
        }
        reward[0] = beta * c, reward[1] = beta * r;
        for (int s = 0; s < 2; s++) pm[PM_LOGPS_CHOSEN + s] += p->logp[s];
    }
    pm[PM_REWARDS_CHOSEN] += reward[0];
    pm[PM_REWARDS_REJECTED] += reward[1];
    pm[PM_REWARDS_MARGINS] += reward[0] - reward[1];
    pm[PM_REWARDS_ACCURACIES] += reward[0] > reward[1];
    return loss;
}

// Row r's completion (targets >= 0 of the loader's targets tg, T apart): its summed
// log-probability from the targets' cross-entropies ce, and its token count
static double completion_logp(const int *tg, const double *ce, int r, int T, int *n) {
    double s = 0;
    *n = 0;
    for (int t = 0; t < T; t++)
        if (tg[(size_t)r * T + t] >= 0) s -= ce[(size_t)r * T + t], (*n)++;
    return s;
}

// ORPO's nll targets: the chosen rows' (0 .. B - 1) every predicted token, their prompt's too
// (TRL's ORPO: the cross-entropy over the whole chosen sequence); the rejected rows' stay
// their completion's. From the loader's tokens and targets tg into nll_tg (2B, T).
static void orpo_targets(const int *tokens, const int *tg, int B, int T, int *nll_tg) {
    memcpy(nll_tg, tg, (size_t)2 * B * T * sizeof(int));
    for (int b = 0; b < B; b++) {
        const int *row = tg + (size_t)b * T;
        int first = 0; // the completion's first target: every position before it predicts a prompt token
        while (first < T && row[first] < 0) first++;
        for (int t = 0; t < first && t + 1 < T; t++) nll_tg[(size_t)b * T + t] = tokens[(size_t)b * T + t + 1];
    }
}

// --shared_prompt (docs/preference.md): the positions a micro-batch of B pairs (tokens, tg: 2B
// rows of T) can run once for both rows of each pair, the shortest of its pairs' shared prompts: a
// pair's rows hold the same tokens up to its prompt's last, where neither has a label (DPO's, tg)
// but ORPO's nll on the chosen row, which the shared run keeps; the prompt's last position
// predicts each response's first token, so it runs in both rows
static int pair_shared_positions(const int *tokens, const int *tg, int B, int T) {
    int S = T;
    for (int b = 0; b < B; b++) {
        const int *c = tokens + (size_t)b * T, *r = tokens + ((size_t)B + b) * T, *ct = tg + (size_t)b * T, *rt = tg + ((size_t)B + b) * T;
        int t = 0;
        while (t < S && c[t] == r[t] && ct[t] < 0 && rt[t] < 0) t++;
        S = t;
    }
    return S;
}

#ifdef BACKEND_PREFERENCE
// whether a forward now runs the pairs' prompts once: --shared_prompt on, or auto where no dropout
// runs (each row's own masks would differ), in a backend that runs them (BACKEND_SHARED_PROMPT) and a
// model whose carry holds the rows alone (no prefix, no context parallelism), every layer's (not the layer-major schedule's)
static int shared_prompt_runs(const Model *m, const TrainConfig *tc) {
#ifdef BACKEND_SHARED_PROMPT
    const HostModel *h = &m->host;
    int dropout = h->use_lora && h->lora.training && h->lora.dropout > 0.0f;
    return strcmp(tc->shared_prompt, "off") && !(!strcmp(tc->shared_prompt, "auto") && dropout) && !host_prefix(h) &&
           tc->context_parallel <= 1 && !(tc->activation_offloading && backend_activation_offloading);
#else
    (void)m, (void)tc;
    return 0;
#endif
}
// the positions of a micro-batch (tokens, tg) that run once (m->shared_prompt) now; 0: two rows
static int preference_shared(const Model *m, const TrainConfig *tc, const int *tokens, const int *tg, int B, int T) {
    return shared_prompt_runs(m, tc) ? pair_shared_positions(tokens, tg, B, T) : 0;
}
// S positions of the micro-batch's rows to run once (preference_shared) where the backend runs them
static void preference_set_shared(Model *m, int S) {
#ifdef BACKEND_SHARED_PROMPT
    m->shared_prompt = S;
#else
    (void)m, (void)S;
#endif
}

// One forward of a micro-batch's 2B rows without gradients (each target's cross-entropy into ce,
// (2B, T) scratch, of the targets fwd_tg), the prompts once where they run so: each pair's
// completion log-probabilities into ps[b].logp and their token counts into ps[b].n, or with ref
// into ps[b].ref
static void preference_forward(Model *m, const TrainConfig *tc, const int *tokens, const int *fwd_tg, const int *tg, int B, int T,
                               double *ce, PairScores *ps, int ref) {
    m->target_losses = ce;
    memset(ce, 0, (size_t)2 * B * T * sizeof(double));
    preference_set_shared(m, preference_shared(m, tc, tokens, tg, B, T));
    model_forward(m, tokens, fwd_tg, 2 * B, T, NULL);
    preference_set_shared(m, 0);
    m->target_losses = NULL;
    for (int b = 0; b < B; b++)
        for (int s = 0; s < 2; s++) {
            int n;
            double lp = completion_logp(tg, ce, s * B + b, T, &n);
            if (ref) ps[b].ref[s] = lp;
            else ps[b].logp[s] = lp, ps[b].n[s] = n;
        }
}

// One micro-batch of B pairs (tokens, tg: 2B rows of T; ORPO: nll_tg its nll targets) scored
// without gradients: the pairs' PairScores into ps; ORPO's nll (the chosen rows' mean
// cross-entropy) returned with its token count in *nll_n. ce: (2B, T) scratch. Dropout as the
// backward will have it (the same m->dropout_key). DPO's reference: the precomputed ref (B, 2),
// or (NULL) its forward, without dropout, after the policy's.
static double preference_score(Model *m, const TrainConfig *tc, const int *tokens, const int *tg, const int *nll_tg, int B, int T,
                               const double *ref, double *ce, PairScores *ps, long *nll_n) {
    int orpo = !strcmp(tc->objective, "orpo"), training = m->host.lora.training;
    double nll = 0;
    *nll_n = 0;
    if (orpo) { // (its nll from the policy's forward's cross-entropies)
        preference_forward(m, tc, tokens, nll_tg, tg, B, T, ce, ps, 0);
        for (size_t i = 0; i < (size_t)B * T; i++)
            if (nll_tg[i] >= 0) nll += ce[i], (*nll_n)++;
        return nll;
    }
    preference_forward(m, tc, tokens, tg, tg, B, T, ce, ps, 0);
    for (int b = 0; ref && b < B; b++) ps[b].ref[0] = ref[2 * b], ps[b].ref[1] = ref[2 * b + 1];
    if (ref) return 0;
    model_reference_swap(m), m->host.lora.training = 0;
    preference_forward(m, tc, tokens, tg, tg, B, T, ce, ps, 1);
    model_reference_swap(m), m->host.lora.training = training;
    return 0;
}

// --precompute_ref_log_probs: every pair of ds scored by the model as it is (the starting one,
// which is the reference), B pairs at a time in file order without dropout, into
// ds->ref_logps (n_rows, 2). Every rank scores every pair: the loader deals the pairs to the
// ranks anew each epoch. Collective where the forward is.
static void preference_precompute(Model *m, const TrainConfig *tc, Dataset *ds, int B, int pad_id) {
    size_t cells = (size_t)2 * B * m->T;
    int *tokens = (int *)mallocCheck(cells * sizeof(int)), *tg = (int *)mallocCheck(cells * sizeof(int));
    double *ce = (double *)mallocCheck(cells * sizeof(double));
    PairScores *ps = (PairScores *)mallocCheck((size_t)B * sizeof *ps);
    free(ds->ref_logps);
    ds->ref_logps = (double *)mallocCheck((size_t)ds->n_rows * 2 * sizeof(double));
    int training = m->host.lora.training;
    m->host.lora.training = 0;
    for (long r = 0; r < ds->n_rows; r += B) {
        int n = ds->n_rows - r < B ? (int)(ds->n_rows - r) : B, T;
        dataset_get_rows(ds, r, n, pad_id, tokens, tg, &T);
        preference_forward(m, tc, tokens, tg, tg, n, T, ce, ps, 1);
        for (int b = 0; b < n; b++) ds->ref_logps[2 * (r + b)] = ps[b].ref[0], ds->ref_logps[2 * (r + b) + 1] = ps[b].ref[1];
    }
    m->host.lora.training = training;
    free(tokens); free(tg); free(ce); free(ps);
}

// Each target's weight (2B, T) into w: -d loss / dS / P of its row's completion, P the
// step's pairs; ORPO adds the nll's 1 / (its tokens x the step's micro-batches, every rank's)
// on every target of a chosen row
static void preference_weights(const int *tg, const int *nll_tg, const double (*dl)[2], int B, int T, double pairs,
                               double nll_share, float *w) {
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < B; b++) {
            size_t row = ((size_t)s * B + b) * T;
            for (int t = 0; t < T; t++)
                w[row + t] = (float)((tg[row + t] >= 0 ? -dl[b][s] / pairs : 0) + (!s && nll_tg && nll_tg[row + t] >= 0 ? nll_share : 0));
        }
}

// The loss over a dataset's pairs in file order, B at a time, without dropout (the mean pair
// loss, and ORPO's nll averaged over the batches), and their metrics into pm (PM_N)
static double preference_evaluate(Model *m, const TrainConfig *tc, const Dataset *ds, int B, int pad_id, double *pm) {
    size_t cells = (size_t)2 * B * m->T;
    int *tokens = (int *)mallocCheck(cells * sizeof(int)), *tg = (int *)mallocCheck(cells * sizeof(int));
    int *nll_tg = (int *)mallocCheck(cells * sizeof(int)), orpo = !strcmp(tc->objective, "orpo"), batches = 0;
    double *ce = (double *)mallocCheck(cells * sizeof(double)), loss = 0, nll_sum = 0, dl[2];
    PairScores *ps = (PairScores *)mallocCheck((size_t)B * sizeof *ps);
    memset(pm, 0, PM_N * sizeof *pm);
    m->host.lora.training = 0;
    for (long r = 0; r < ds->n_rows; r += B, batches++) {
        int n = ds->n_rows - r < B ? (int)(ds->n_rows - r) : B, T;
        long nll_n;
        dataset_get_rows(ds, r, n, pad_id, tokens, tg, &T);
        if (orpo) orpo_targets(tokens, tg, n, T, nll_tg);
        double nll = preference_score(m, tc, tokens, tg, nll_tg, n, T, ds->ref_logps ? ds->ref_logps + 2 * r : NULL, ce, ps, &nll_n);
        for (int b = 0; b < n; b++) loss += preference_pair(tc, &ps[b], dl, pm);
        if (orpo) nll_sum += nll / nll_n;
    }
    m->host.lora.training = 1;
    for (int k = 0; k < PM_N; k++) pm[k] /= ds->n_rows;
    pm[PM_NLL_LOSS] = nll_sum / batches;
    free(tokens); free(tg); free(nll_tg); free(ce); free(ps);
    return loss / ds->n_rows + pm[PM_NLL_LOSS];
}

// The plan's line for the pairs of ds, one a micro-batch (more share their shortest prompt): the
// prompts' positions that run once (--shared_prompt) against two rows a pair. The memory plan is two
// rows' either way, the most a micro-batch can take.
static void preference_plan(const Model *m, const TrainConfig *tc, const Dataset *ds, int pad_id) {
    int *tokens = (int *)mallocCheck((size_t)2 * 2 * m->T * sizeof(int)), *tg = tokens + (size_t)2 * m->T, T;
    double shared = 0, rows = 0;
    for (long i = 0; i < ds->n_rows; i++) {
        dataset_get_rows(ds, i, 1, pad_id, tokens, tg, &T);
        shared += pair_shared_positions(tokens, tg, 1, T), rows += 2.0 * T;
    }
    free(tokens);
    double prompt = ds->n_rows ? shared / ds->n_rows + 1 : 0, saved = rows > 0 ? 100 * shared / rows : 0;
    if (shared_prompt_runs(m, tc))
        printf("pairs: prompts of %.1f tokens on average, run once (--shared_prompt %s): %.1f%% fewer positions than two rows a pair\n",
               prompt, tc->shared_prompt, saved);
    else
        printf("pairs: prompts of %.1f tokens on average, run in both rows (--shared_prompt %s; run once they would save %.1f%% of the positions)\n",
               prompt, tc->shared_prompt, saved);
}
#endif
#endif
