// peft/prefix.h: prefix tuning's place in the KV carry (peft's PrefixTuningConfig without
// prefix_projection; docs/lora.md), the CPU's. The prefix is one more chunk ahead of the
// first (docs/chunked.md): its P virtual positions' keys and values (never rotated) fill
// rows 0 .. P - 1 of every layer's carry, and the attention's backward adds their
// gradients into the dKV carry's rows 0 .. P - 1 like any earlier position's.
//   prompt (P, L * 2 * KV): peft's prompt_embeddings, row j = layer 0's key, layer 0's
//   value, layer 1's key, ... of position j (lora.h keeps it); KV = NKV * hd
//   k, v, dk, dv (L, B, P + T, KV): the carries of B rows of T real positions
// peft/prefix.cuh has the GPU's twins, with the same names and arguments (and a stream).
#ifndef PREFIX_H
#define PREFIX_H
#include <string.h>

// the prefix's keys and values into rows 0 .. P - 1 of every row's carry, every layer
static void prefix_to_carry(float *k, float *v, const float *prompt, int L, int B, int P, int T, size_t KV) {
    size_t row = (size_t)L * 2 * KV, layer = (size_t)B * (P + T) * KV;
    for (int l = 0; l < L; l++)
        for (int b = 0; b < B; b++)
            for (int j = 0; j < P; j++) {
                const float *kv = prompt + (size_t)j * row + (size_t)l * 2 * KV; // its key, then its value
                size_t at = l * layer + ((size_t)b * (P + T) + j) * KV;
                memcpy(k + at, kv, KV * sizeof(float));
                memcpy(v + at, kv + KV, KV * sizeof(float));
            }
}

// dprompt (P, L * 2 * KV) += the dKV carry's rows 0 .. P - 1, each element's B rows added in
// row order
static void prefix_backward(float *dprompt, const float *dk, const float *dv, int L, int B, int P, int T, size_t KV) {
    size_t row = (size_t)L * 2 * KV, layer = (size_t)B * (P + T) * KV;
    for (int l = 0; l < L; l++)
        for (int b = 0; b < B; b++)
            for (int j = 0; j < P; j++) {
                float *g = dprompt + (size_t)j * row + (size_t)l * 2 * KV;
                size_t at = l * layer + ((size_t)b * (P + T) + j) * KV;
                for (size_t i = 0; i < KV; i++) g[i] += dk[at + i], g[KV + i] += dv[at + i];
            }
}
#endif
