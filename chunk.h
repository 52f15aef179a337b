// chunk.h: a chunk of the sequence against the KV carry, for both trainers and every kernel:
// which rows and positions a chunk holds (Chunk), where they sit in the carry (a prefix's
// virtual positions, context parallelism's pieces) and which keys each of its queries sees
// (the attention mask, one definition for attention.h on the CPU and attention.cuh on the GPU);
// and for both trainers' hosts, how a micro-batch's rows are cut in chunks, or context
// parallelism's pieces (Rows, rows_chunk, carry_rows).
#ifndef CHUNK_H
#define CHUNK_H
#include "support/utils.h" // HOST_DEVICE, die

// Where the N rows of a layer's input sit in the batch: the trainer runs a
// batch of B sequences of T tokens in chunks, and row n of a chunk is position
// t0 + n % len of sequence n / len. Whole-sequence training is t0 = 0, len = T.
// window and s2_group, which only attention reads (below): the sliding
// window (Config's sliding_window: the query at position p sees keys
// p - window + 1 .. p) and the group size of shifted sparse attention (--s2_attn,
// in training); 0 (what an initializer that leaves them out gives): keys 0 .. p,
// plain causal.
typedef struct { int B, T, t0, len, window, s2_group; } Chunk;

// The chunk as the KV carry, RoPE and attention see it with a prefix of P virtual positions
// ahead of the sequence (prefix tuning, peft/prefix.h): real position p is carry row and RoPE
// position P + p, in rows of P + T (peft's positions), so every query sees the prefix in its
// one causal softmax. P = 0: the chunk itself.
static inline Chunk carry_chunk(const Chunk *ch, int P) {
    Chunk c = *ch;
    c.t0 += P, c.T += P;
    return c;
}

// Context parallelism (docs/long_context.md): the P ranks of a context group hold different
// positions of the same rows. A row of T positions is padded to *Tp and cut in pieces of
// *len, P to a group; rank r takes one piece of each group, piece r in even groups and
// P - 1 - r in odd ones. C = 0 (no --chunk_size): a row is 2P pieces, two groups, and rank r
// holds pieces r and 2P - 1 - r (the head-tail layout of torchtitan and ring-flash-attention,
// which gives each rank the same causal work); C > 0: pieces of C, as many groups as the row
// needs. Pads come last: never attended, never labels.
static inline void context_layout(int P, int C, int T, int *Tp, int *len) {
    int group = C ? P * C : 2 * P;
    *Tp = (T + group - 1) / group * group;
    *len = C ? C : *Tp / (2 * P);
}

// rank r's piece of group j, in rows of T positions cut in pieces of len
static inline Chunk context_piece(int P, int B, int T, int len, int j, int r, int window) {
    int at = j * P + (j % 2 ? P - 1 - r : r);
    Chunk ch = {B, T, at * len, len, window, 0};
    return ch;
}

// ----------------------------------------------------------------------------
// The attention mask: which keys a query sees. It is causal, aligned
// bottom-right: the query at position p sees keys attention_first_key .. p, the
// first key being
//   0                        plain causal;
//   p - W + 1 (or 0)         Mistral's sliding window of W keys (ch->window);
//   the start of p's group   LongLoRA's shifted sparse attention, S2-Attn
//                            (ch->s2_group = G, in training only): query heads
//                            h < NH / 2 attend within groups of G positions from 0,
//                            the others within groups shifted by G / 2 (floored),
//                            with no wrap-around: the first half-group 0 .. G/2 - 1
//                            is a group of its own, and so is the last, which ends
//                            at T (LongLoRA's flash-attention form, forward_flashattn).
// GQA: the mask belongs to the query head. A KV head whose query heads fall in both
// halves serves each with that head's mask, as in LongLoRA, which repeats the KV heads
// to one per query head before it splits them in halves.
// Every mask is a run of keys ending at the query, whose start never decreases
// along the sequence: so both attentions skip whole tiles before a query tile's
// first key (and the GPU's dk, dv kernels the query tiles after a key's last query).
// Whole-sequence and chunked attention see the same mask, as positions are absolute
// (a chunk's queries see the KV carry's keys only within their group).

// LongLoRA's group size for rows of T positions: a quarter of them (4 groups; the
// trainer refuses other row lengths with --s2_attn before it trains)
static inline int s2_group_size(int T) {
    if (T <= 0 || T % 4) die("--s2_attn: rows of %d positions, not a multiple of 4 (S2-Attn cuts them in 4 groups)", T);
    return T / 4;
}

// whether query head h of NH attends within the shifted groups (the second half)
static inline HOST_DEVICE int s2_shifted(int h, int NH) { return 2 * h >= NH; }

// the start of the group of G positions that holds position p; shifted groups start at
// G / 2 + k G, and the positions before G / 2 form a group of their own
static inline HOST_DEVICE int s2_group_start(int p, int G, int shifted) {
    int off = shifted ? G / 2 : 0;
    return p < off ? 0 : (p - off) / G * G + off;
}

// the first key that the query at position p of query head h (of NH) sees
static inline HOST_DEVICE int attention_first_key(const Chunk *ch, int p, int h, int NH) {
    if (ch->s2_group) return s2_group_start(p, ch->s2_group, s2_shifted(h, NH));
    return ch->window && p >= ch->window ? p - ch->window + 1 : 0;
}

// the first key that any query of the chunk sees (its first query's, of either half of the heads)
static inline HOST_DEVICE int attention_chunk_first_key(const Chunk *ch, int NH) {
    int a = attention_first_key(ch, ch->t0, 0, NH), b = attention_first_key(ch, ch->t0, NH - 1, NH);
    return a < b ? a : b;
}

// one past the last position of the chunk whose query (of head h) sees key s, the first
// being s itself: the window's end s + W, or the end of s's group, at most t0 + len
// (W is compared as W < end - s, which cannot overflow)
static inline HOST_DEVICE int attention_query_end(const Chunk *ch, int s, int h, int NH) {
    int end = ch->t0 + ch->len;
    if (ch->s2_group) {
        int G = ch->s2_group, shifted = s2_shifted(h, NH);
        int next = shifted && s < G / 2 ? G / 2 : s2_group_start(s, G, shifted) + G;
        return next < end ? next : end;
    }
    return ch->window && ch->window < end - s ? s + ch->window : end;
}

// ----------------------------------------------------------------------------
// A micro-batch's rows as the model runs them (docs/chunked.md, docs/long_context.md): B rows of
// T positions in chunks of C, or with context parallelism this rank's pieces of the rows padded to
// the group's layout. Both trainers hold the rows running now (the Model's rows: rows_begin sets
// them, the micro-batch's end clears them) and cut them with rows_chunk.

typedef struct {
    int B, T;    // B rows of T positions (context parallel: padded to the group's layout)
    int T_real;  // their length before that padding (== T without it)
    int len;     // the chunks' length C (the last may be shorter), or context parallel the pieces'
    int n;       // the chunks of a row, or context parallel this rank's pieces of it (one a group)
    int P, rank; // the context group that runs the pieces (P > 1) and this rank in it; 0, 0 when
                 // no micro-batch runs (sampling: whole rows, its own chunks)
    int window;  // Config's sliding_window (the chunks' attention mask)
    int s2_attn; // --s2_attn: training's chunks attend within S2-Attn's groups (s2_group_size)
    int share;   // a shared prompt (rows_share): rows B/2 .. B - 1 repeat the first `share` positions of
                 // rows 0 .. B/2 - 1, which run once; 0: none
} Rows;

// B rows of T positions in chunks of C (>= T: one; the Model's chunk_size), or with a context
// group of P > 1 ranks (rank: this one) padded and cut in pieces of context_len (context_layout's
// C: 0, each row in 2P pieces)
static inline Rows rows_layout(int B, int T, int C, int context_len, int P, int rank, int window, int s2_attn) {
    Rows r = {B, T, T, C, (T + C - 1) / C, P, rank, window, s2_attn, 0};
    if (P > 1) {
        context_layout(P, context_len, T, &r.T, &r.len);
        r.n = r.T / r.len / P;
    }
    return r;
}

// The capacity's rows, for training and evaluation alike: the longest row (context parallel:
// padded) in chunks of C (C <= 0 or > T: T; context parallel: this rank's pieces, of C with
// C < T, which *context_len keeps, else 2P pieces a row: *context_len 0)
static inline Rows rows_capacity(int B, int T, int C, int P, int *context_len) {
    if (C <= 0 || C > T) C = T;
    *context_len = P > 1 && C < T ? C : 0;
    return rows_layout(B, T, C, *context_len, P, 0, 0, 0);
}

// the rows' tokens and targets (B, T_real) padded to theirs (B, T): pads are token 0 (any id:
// nothing real attends to them) with no label, after every real position
static inline void rows_pad(const Rows *r, int *tokens_out, int *targets_out, const int *tokens, const int *targets) {
    for (int b = 0; b < r->B; b++)
        for (int t = 0; t < r->T; t++) {
            tokens_out[(size_t)b * r->T + t] = t < r->T_real ? tokens[(size_t)b * r->T_real + t] : 0;
            targets_out[(size_t)b * r->T + t] = t < r->T_real ? targets[(size_t)b * r->T_real + t] : -100;
        }
}

// Preference tuning's per-target numbers while the rows run padded (context parallel,
// docs/preference.md): the caller's loss weights and target losses, (B, T_real), stand aside
// (rows_scores_pad) and padded ones (B, T) take their place: the weights padded as rows_pad pads
// the targets (pads weigh 0), the losses zeros that each rank fills at its own targets. After the
// group's sum (each target's loss is one rank's, the others' zeros: exact), rows_scores_unpad
// puts each target's (targets: the padded rows') back into the caller's and restores its pointers.
typedef struct { const float *weights; double *losses; } RowsScores;
static inline void rows_scores_pad(const Rows *r, const float **weights, double **losses, RowsScores *caller) {
    caller->weights = *weights, caller->losses = *losses;
    if (*weights) {
        float *w = (float *)mallocCheck((size_t)r->B * r->T * sizeof(float));
        for (int b = 0; b < r->B; b++)
            for (int t = 0; t < r->T; t++) w[(size_t)b * r->T + t] = t < r->T_real ? caller->weights[(size_t)b * r->T_real + t] : 0.0f;
        *weights = w;
    }
    if (*losses) *losses = (double *)callocCheck((size_t)r->B * r->T, sizeof(double));
}
static inline void rows_scores_unpad(const Rows *r, const float **weights, double **losses, RowsScores *caller, const int *targets) {
    if (caller->weights) free((float *)*weights);
    if (caller->losses) {
        for (int b = 0; b < r->B; b++)
            for (int t = 0; t < r->T_real; t++)
                if (targets[(size_t)b * r->T + t] >= 0) caller->losses[(size_t)b * r->T_real + t] = (*losses)[(size_t)b * r->T + t];
        free(*losses);
    }
    *weights = caller->weights, *losses = caller->losses;
}

// A shared prompt (preference tuning's pairs, docs/preference.md): rows b and B/2 + b hold the
// same tokens at positions 0 .. S - 1, where neither has a label but row b's own (ORPO's nll).
// Their keys and values there are the same, so those positions run once, for rows 0 .. B/2 - 1
// alone, in chunks of their own; then every row runs from S on, rows B/2 .. B - 1 seeing row b's
// keys and values through the carry (carry_share), and in the backward their dK, dV at those
// positions are added into row b's before its chunks' backward. S = 0: none.
// the chunks of a shared prompt's positions (0: none)
static inline int rows_shared_chunks(const Rows *r) { return (r->share + r->len - 1) / r->len; }
static inline void rows_share(Rows *r, int S) {
    if (S <= 0) return;
    if (r->P > 1 || r->B % 2 || S >= r->T) die("internal: a shared prompt of %d positions in rows (%d, %d), context %d", S, r->B, r->T, r->P);
    r->share = S;
    r->n = rows_shared_chunks(r) + (r->T - S + r->len - 1) / r->len;
}

// chunk j of the rows in the order of their positions: j len .. (j + 1) len - 1, the last
// chunk maybe shorter (attending to every earlier position); with a shared prompt of S
// positions, its chunks of B/2 rows first (the last ending at S), then chunks from S on
static inline Chunk chunk_at(const Rows *r, int j) {
    int shared = rows_shared_chunks(r), end = j < shared ? r->share : r->T;
    Chunk ch = {j < shared ? r->B / 2 : r->B, r->T, j < shared ? j * r->len : r->share + (j - shared) * r->len, r->len, r->window, 0};
    if (ch.t0 + ch.len > end) ch.len = end - ch.t0; // the last chunk may be shorter
    return ch;
}
// the chunk after which the shared prompt's keys and values are complete (-1: no shared prompt)
static inline int rows_shared_last(const Rows *r) { return rows_shared_chunks(r) - 1; }
// Chunk j of what the model runs: chunk_at's, or context parallel this rank's piece of group j.
// train: model_forward_backward's, whose attention takes --s2_attn's groups (evaluation and
// sampling attend to every earlier position), the groups of the rows before their padding, whose
// pads come after every real position, so they move nothing that a real position sees
static inline Chunk rows_chunk(const Rows *r, int j, int train) {
    Chunk ch = r->P > 1 ? context_piece(r->P, r->B, r->T, r->len, j, r->rank, r->window) : chunk_at(r, j);
    ch.s2_group = train && r->s2_attn ? s2_group_size(r->T_real) : 0;
    return ch;
}

// the group of piece ch (this rank's: context_piece's)
static inline int context_group(const Rows *r, const Chunk *ch) { return ch->t0 / ch->len / r->P; }

// Where chunk ch's keys and values sit in the KV and dKV carries: at its positions after a
// prefix's P virtual ones (carry_chunk), or context parallel at this rank's compact rows, which
// hold its own positions alone: its piece of group j is rows [j len, (j + 1) len) of T / P there
// (no prefix with context parallelism)
static inline Chunk carry_rows(const Rows *r, const Chunk *ch, int prefix) {
    if (r->P <= 1) return carry_chunk(ch, prefix);
    Chunk c = *ch;
    c.T = ch->T / r->P, c.t0 = context_group(r, ch) * ch->len;
    return c;
}

// The positions of a layer's KV carry, whose rows are the micro-batch's (its chunks' rows but a
// shared prompt's, which are half of them) or, where no rows run (sampling), the chunk's; cr:
// carry_rows'
static inline size_t carry_positions(const Rows *r, const Chunk *cr) { return (size_t)(r->B ? r->B : cr->B) * cr->T; }

// a layer's slice of a per-layer buffer of `size` elements a layer (the carries, the activations)
#define LAYER(buf, l, size) ((buf) + (size_t)(l) * (size))

// ----------------------------------------------------------------------------
// A chunk's activations, kept from its forward for its backward (docs/chunked.md): the members
// of both trainers' ChunkActs, the CPU's in float, the GPU's in its compute type floatX (the
// statistics in float). With activation checkpointing all but resid hold Lk = 1 layer, which
// every layer overwrites in turn and its backward refills (else Lk = L).
#define CHUNK_ACTS(floatX) \
    floatX *resid;      /* (L+1, B, C, D) input of each layer, and the final residual */ \
    floatX *ln1;        /* (Lk, B, C, D) */ \
    float *rstd1;       /* (Lk, B, C) */ \
    floatX *q;          /* (Lk, B, C, NH*hd) after RoPE */ \
    float *lse;         /* (Lk, B, NH, C) log-sum-exp of each query's attention scores */ \
    floatX *atty;       /* (Lk, B, C, NH*hd) attention output */ \
    floatX *resid_mid;  /* (Lk, B, C, D) after the attention block */ \
    floatX *ln2;        /* (Lk, B, C, D) */ \
    float *rstd2;       /* (Lk, B, C) */ \
    floatX *gate;       /* (Lk, B, C, H) pre-activation */ \
    floatX *up;         /* (Lk, B, C, H) */ \
    floatX *hmlp;       /* (Lk, B, C, H) silu(gate) * up */ \
    floatX *lora_h;     /* (Lk, 7, B, C, r) LoRA A-projections */

// Layer l's activations within a chunk's (layer_acts): its input and output residuals, and the
// rest at layer l, or with activation checkpointing in the one layer's worth that every layer
// shares; packed for the chunk's length len (the last chunk may be shorter than C). The members
// of both trainers' LayerActs, as CHUNK_ACTS'.
#define LAYER_ACTS(floatX) \
    floatX *x, *out;         /* (B, len, D) the layer's input resid[l] and output resid[l + 1] */ \
    floatX *ln1, *mid, *ln2; /* (B, len, D) mid: the residual after the attention block */ \
    float *rstd1, *rstd2;    /* (B, len) */ \
    floatX *q, *atty;        /* (B, len, NH*hd) the queries after RoPE, the attention output */ \
    float *lse;              /* (B, NH, len) */ \
    floatX *gate, *up, *hm;  /* (B, len, H) hm = silu(gate) * up */ \
    floatX *lora_h;          /* (7, B, len, r) LoRA A-projections */
#endif
