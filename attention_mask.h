// attention_mask.h: which keys a query sees, one definition for both attentions
// (attention.h on the CPU, attention.cuh on the GPU). The mask is causal, aligned
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
#ifndef ATTENTION_MASK_H
#define ATTENTION_MASK_H
#include "support/utils.h" // HOST_DEVICE

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
#endif
