// 4-bit quantization of frozen base weights (QLoRA), exactly as bitsandbytes
// quantizes a Linear4bit weight: bnb.functional.quantize_4bit(w, blocksize=64,
// quant_type="nf4" or "fp4", compress_statistics=0 or 1) on the CPU, and its
// dequantize_4bit (dev/reference/make_quant_fixtures.py checks every byte
// against bitsandbytes 0.50.2; test/test_quant.c reads what it wrote).
//
//   the weight (O, I), row-major, is cut into blocks of 64 consecutive elements
//   (the last one may be shorter); each block keeps its absmax (fp32) and each
//   element the index of the code nearest to w / absmax in a 16-entry table
//   (NF4, or FP4), two indices a byte, the first element in the high nibble.
//   Double quantization stores the absmax values themselves in 8 bits: their
//   mean (the offset, fp32) is subtracted, and they are quantized blockwise in
//   blocks of 256 with bitsandbytes' signed 8-bit dynamic code and an fp32
//   absmax per block of 256.
//
// Rounding, as bitsandbytes' CPU code does it (the CUDA kernels are written
// differently, and their ties may fall the other way):
//   4 bits  w * (1 / max(absmax, 1e-38)) (w / max(absmax, 1e-38) in a last,
//           shorter block), clamped to [-1, 1], goes to the code whose interval
//           holds it, the intervals split at the midpoints of neighbouring codes
//           (fp32), a value on a midpoint taking the lower code (torch.bucketize).
//           An odd count pads the last byte's low nibble with the code of 0.
//   8 bits  v * (1 / absmax) -> a 65536-entry table: the value becomes the index
//           (v + 1) / 2 * 65535 + 0.5, truncated, and the table holds for each
//           index the code nearest to -1 + 2 i / 65535 (a value on a midpoint
//           taking the lower). A block of zeros keeps absmax 0 and codes 0.
//   offset  the mean of the absmax values, which bitsandbytes takes with
//           torch.mean in fp32: its rounding depends on torch's summation order
//           (vector width, threads), so no other program reproduces it bit for bit.
//           Here: the sum in double, rounded to fp32, divided by n in fp32 (what
//           torch gets when its sum is correctly rounded; within an ulp or two otherwise).
//   dequantize  absmax = code8[q] * absmax2 + offset, each operation rounded to
//           fp32 (no fused multiply-add), then w = code4[q] * absmax.
//
// Memory: a tensor's packed codes and statistics sit in one byte buffer
// (quant_layout), so a unit of tensors is one contiguous run of bytes, which a
// GPU kernel can dequantize (a thread per byte, its block's absmax at hand) and
// FSDP can shard and gather like any other flat buffer.
#ifndef QUANT_H
#define QUANT_H
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

enum { QUANT_NONE, QUANT_NF4, QUANT_FP4 };
static const char *const quant_type_names[] = {"none", "nf4", "fp4"};
#define QUANT_BLOCK 64   // weights per absmax (bitsandbytes' blocksize for Linear4bit)
#define QUANT_BLOCK2 256 // absmax values per second-level scale (double quantization)

// bitsandbytes' code tables (bnb.functional.get_4bit_type, create_dynamic_map), as
// fp32 values; test/test_quant.c checks them against the fixtures
static const float quant_nf4[16] = {
    -1.0f, -0.696192801f, -0.525073051f, -0.394917488f, -0.284441382f, -0.18477343f, -0.0910500363f, 0.0f,
    0.0795802996f, 0.160930201f, 0.246112302f, 0.337915242f, 0.440709829f, 0.562617004f, 0.722956836f, 1.0f};
// FP4 (1 sign, 2 exponent, 1 mantissa bit), scaled to [-1, 1]. Code 8 is a zero:
// +0 as get_4bit_type lists it (bitsandbytes' CPU dequantize gives -0 in its scalar
// loop, +0 in its AVX-512 one; no product or sum can tell them apart)
static const float quant_fp4[16] = {
    0.0f, 0.00520833349f, 0.666666687f, 1.0f, 0.333333343f, 0.5f, 0.166666672f, 0.25f,
    0.0f, -0.00520833349f, -0.666666687f, -1.0f, -0.333333343f, -0.5f, -0.166666672f, -0.25f};
// FP4's codes from the smallest value to the largest, as bitsandbytes orders them
// (torch.argsort; the two zeros as it leaves them: 0 below 8)
static const uint8_t quant_fp4_order[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};
// the signed 8-bit dynamic code (sorted)
static const float quant_dynamic[256] = {
    -0.992968738f, -0.978906274f, -0.96484375f, -0.950781226f, -0.936718762f, -0.922656238f, -0.908593774f, -0.89453125f,
    -0.880468726f, -0.866406262f, -0.852343738f, -0.838281274f, -0.82421875f, -0.810156226f, -0.796093762f, -0.782031238f,
    -0.767968774f, -0.75390625f, -0.739843726f, -0.725781262f, -0.711718798f, -0.697656274f, -0.68359375f, -0.669531226f,
    -0.655468762f, -0.641406298f, -0.627343774f, -0.61328125f, -0.599218726f, -0.585156262f, -0.571093798f, -0.557031274f,
    -0.54296875f, -0.528906226f, -0.514843702f, -0.500781238f, -0.486718714f, -0.47265625f, -0.458593726f, -0.444531262f,
    -0.430468738f, -0.416406244f, -0.40234375f, -0.388281226f, -0.374218762f, -0.360156238f, -0.346093744f, -0.33203125f,
    -0.317968726f, -0.303906262f, -0.289843738f, -0.275781274f, -0.26171875f, -0.247656241f, -0.233593747f, -0.219531253f,
    -0.205468744f, -0.19140625f, -0.177343756f, -0.163281247f, -0.149218753f, -0.135156244f, -0.12109375f, -0.107031256f,
    -0.0985937491f, -0.0957812592f, -0.0929687545f, -0.0901562497f, -0.0873437524f, -0.0845312476f, -0.0817187577f, -0.078906253f,
    -0.0760937482f, -0.0732812509f, -0.0704687461f, -0.0676562563f, -0.0648437515f, -0.0620312504f, -0.0592187531f, -0.0564062484f,
    -0.053593751f, -0.05078125f, -0.047968749f, -0.0451562516f, -0.0423437469f, -0.0395312496f, -0.0367187522f, -0.0339062512f,
    -0.0310937501f, -0.028281251f, -0.0254687499f, -0.0226562507f, -0.0198437516f, -0.0170312505f, -0.0142187504f, -0.0114062503f,
    -0.00971874967f, -0.00915624946f, -0.00859375019f, -0.00803124998f, -0.00746874977f, -0.00690625003f, -0.00634374982f, -0.00578125007f,
    -0.00521875033f, -0.00465624966f, -0.00409374991f, -0.00353124971f, -0.00296874996f, -0.00240624999f, -0.00184375001f, -0.00128124992f,
    -0.000943750085f, -0.000831249985f, -0.00071875006f, -0.000606250076f, -0.000493750034f, -0.000381250022f, -0.000268750038f, -0.000156250011f,
    -8.87499991e-05f, -6.62500024e-05f, -4.37499984e-05f, -2.12499981e-05f, -7.7499999e-06f, -3.25000019e-06f, -5.50000038e-07f, 0.0f,
    5.50000038e-07f, 3.25000019e-06f, 7.7499999e-06f, 2.12499981e-05f, 4.37499984e-05f, 6.62500024e-05f, 8.87499991e-05f, 0.000156250011f,
    0.000268750038f, 0.000381250022f, 0.000493750034f, 0.000606250076f, 0.00071875006f, 0.000831249985f, 0.000943750085f, 0.00128124992f,
    0.00184375001f, 0.00240624999f, 0.00296874996f, 0.00353124971f, 0.00409374991f, 0.00465624966f, 0.00521875033f, 0.00578125007f,
    0.00634374982f, 0.00690625003f, 0.00746874977f, 0.00803124998f, 0.00859375019f, 0.00915624946f, 0.00971874967f, 0.0114062503f,
    0.0142187504f, 0.0170312505f, 0.0198437516f, 0.0226562507f, 0.0254687499f, 0.028281251f, 0.0310937501f, 0.0339062512f,
    0.0367187522f, 0.0395312496f, 0.0423437469f, 0.0451562516f, 0.047968749f, 0.05078125f, 0.053593751f, 0.0564062484f,
    0.0592187531f, 0.0620312504f, 0.0648437515f, 0.0676562563f, 0.0704687461f, 0.0732812509f, 0.0760937482f, 0.078906253f,
    0.0817187577f, 0.0845312476f, 0.0873437524f, 0.0901562497f, 0.0929687545f, 0.0957812592f, 0.0985937491f, 0.107031256f,
    0.12109375f, 0.135156244f, 0.149218753f, 0.163281247f, 0.177343756f, 0.19140625f, 0.205468744f, 0.219531253f,
    0.233593747f, 0.247656241f, 0.26171875f, 0.275781274f, 0.289843738f, 0.303906262f, 0.317968726f, 0.33203125f,
    0.346093744f, 0.360156238f, 0.374218762f, 0.388281226f, 0.40234375f, 0.416406244f, 0.430468738f, 0.444531262f,
    0.458593726f, 0.47265625f, 0.486718714f, 0.500781238f, 0.514843702f, 0.528906226f, 0.54296875f, 0.557031274f,
    0.571093798f, 0.585156262f, 0.599218726f, 0.61328125f, 0.627343774f, 0.641406298f, 0.655468762f, 0.669531226f,
    0.68359375f, 0.697656274f, 0.711718798f, 0.725781262f, 0.739843726f, 0.75390625f, 0.767968774f, 0.782031238f,
    0.796093762f, 0.810156226f, 0.82421875f, 0.838281274f, 0.852343738f, 0.866406262f, 0.880468726f, 0.89453125f,
    0.908593774f, 0.922656238f, 0.936718762f, 0.950781226f, 0.96484375f, 0.978906274f, 0.992968738f, 1.0f,
};

static inline const float *quant_table(int type) { return type == QUANT_FP4 ? quant_fp4 : quant_nf4; }

// one fp32 rounding, never fused with the next operation into a multiply-add
static inline float quant_f32(float x) { volatile float v = x; return v; }

// ----------------------------------------------------------------------------
// layout: one tensor's packed codes and statistics in a byte buffer

typedef struct {
    int type;           // QUANT_NF4 or QUANT_FP4
    int double_quant;   // 1: the absmax values are stored in 8 bits
    size_t numel;       // weights
    size_t n_blocks;    // ceil(numel / 64)
    size_t n_blocks2;   // ceil(n_blocks / 256) (double_quant)
    float *absmax;      // (n_blocks) double_quant 0
    float *offset;      // (1) the mean of the absmax values    } double_quant 1
    float *absmax2;     // (n_blocks2) the scale of each block   }
    uint8_t *qabsmax;   // (n_blocks) absmax - offset in 8 bits  }
    uint8_t *codes;     // (ceil(numel / 2)) two 4-bit codes a byte, the first in the high nibble
} QuantTensor;

// lays out a tensor of numel weights from base (or only counts when base is NULL):
// the floats first, then the bytes; returns the bytes taken, a multiple of 16 so
// that tensors laid out one after another stay aligned for vector loads
static inline size_t quant_layout(QuantTensor *q, int type, int double_quant, size_t numel, uint8_t *base) {
    size_t nb = (numel + QUANT_BLOCK - 1) / QUANT_BLOCK, nb2 = (nb + QUANT_BLOCK2 - 1) / QUANT_BLOCK2;
    size_t floats = double_quant ? 1 + nb2 : nb, bytes = floats * sizeof(float) + (double_quant ? nb : 0) + (numel + 1) / 2;
    memset(q, 0, sizeof *q);
    q->type = type; q->double_quant = double_quant; q->numel = numel; q->n_blocks = nb; q->n_blocks2 = double_quant ? nb2 : 0;
    if (base) {
        float *f = (float *)base;
        if (double_quant) q->offset = f, q->absmax2 = f + 1;
        else q->absmax = f;
        uint8_t *b = base + floats * sizeof(float);
        if (double_quant) q->qabsmax = b, b += nb;
        q->codes = b;
    }
    return (bytes + 15) / 16 * 16;
}

// ----------------------------------------------------------------------------
// 4 bits: codes (ceil(n / 2)) and absmax (ceil(n / 64)) of w (n)

// the index into the table of type of a value x in [-1, 1]: the number of midpoints
// below x (torch.bucketize over the sorted codes), mapped back to the table's order
static inline uint8_t quant_code4(float x, int type, const float mid[15]) {
    int k = 0;
    while (k < 15 && mid[k] < x) k++;
    return type == QUANT_FP4 ? quant_fp4_order[k] : (uint8_t)k;
}

// the largest magnitude of len values (0 for none)
static inline float quant_absmax(const float *x, size_t len) {
    float amax = 0.0f;
    for (size_t i = 0; i < len; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    return amax;
}

static inline void quant_blocks4(const float *w, size_t n, int type, uint8_t *codes, float *absmax) {
    const float *t = quant_table(type);
    float mid[15];
    for (int k = 0; k < 15; k++) {
        float lo = type == QUANT_FP4 ? t[quant_fp4_order[k]] : t[k], hi = type == QUANT_FP4 ? t[quant_fp4_order[k + 1]] : t[k + 1];
        mid[k] = (lo + hi) / 2.0f;
    }
    size_t nb = (n + QUANT_BLOCK - 1) / QUANT_BLOCK;
    #pragma omp parallel for
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * QUANT_BLOCK, len = n - i0 < QUANT_BLOCK ? n - i0 : QUANT_BLOCK;
        float amax = quant_absmax(w + i0, len);
        // bitsandbytes scales whole blocks by the reciprocal and keeps their absmax, and a
        // last, shorter one by division, keeping its absmax clamped
        float den = amax > 1e-38f ? amax : 1e-38f, inv = 1.0f / den;
        int whole = len == QUANT_BLOCK;
        absmax[b] = whole ? amax : den;
        for (size_t i = 0; i < len; i += 2) { // a block starts on a byte: 64 is even
            float x0 = whole ? w[i0 + i] * inv : w[i0 + i] / den;
            float x1 = i + 1 < len ? (whole ? w[i0 + i + 1] * inv : w[i0 + i + 1] / den) : 0.0f; // the pad: a 0
            x0 = x0 < -1.0f ? -1.0f : x0 > 1.0f ? 1.0f : x0;
            x1 = x1 < -1.0f ? -1.0f : x1 > 1.0f ? 1.0f : x1;
            codes[(i0 + i) / 2] = (uint8_t)(quant_code4(x0, type, mid) << 4 | quant_code4(x1, type, mid));
        }
    }
}

// out (n) = table[code] * absmax of the code's block
static inline void dequant_blocks4(const uint8_t *codes, const float *absmax, size_t n, int type, float *out) {
    const float *t = quant_table(type);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        uint8_t byte = codes[i / 2];
        out[i] = t[i % 2 ? byte & 15 : byte >> 4] * absmax[i / QUANT_BLOCK];
    }
}

// ----------------------------------------------------------------------------
// 8 bits (double quantization): q (n) and absmax2 (ceil(n / 256)) of x (n)

// the 65536-entry table from a normalized value's index to its code (built once)
static inline const uint8_t *quant_dynamic_lut(void) {
    static uint8_t lut[65536];
    static int built = 0;
    if (built) return lut;
    float mid[255];
    for (int k = 0; k < 255; k++) mid[k] = 0.5f * (quant_dynamic[k] + quant_dynamic[k + 1]);
    int k = 0;
    for (int i = 0; i < 65536; i++) {
        float v = -1.0f + (2.0f * (float)i) / 65535.0f;
        while (k < 255 && mid[k] < v) k++;
        lut[i] = (uint8_t)k;
    }
    built = 1;
    return lut;
}

static inline void quant_blocks8(const float *x, size_t n, uint8_t *q, float *absmax2) {
    const uint8_t *lut = quant_dynamic_lut(); // (before the threads)
    size_t nb = (n + QUANT_BLOCK2 - 1) / QUANT_BLOCK2;
    #pragma omp parallel for
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * QUANT_BLOCK2, len = n - i0 < QUANT_BLOCK2 ? n - i0 : QUANT_BLOCK2;
        float amax = absmax2[b] = quant_absmax(x + i0, len);
        if (amax == 0.0f) { memset(q + i0, 0, len); continue; } // a block of zeros: codes 0
        float inv = 1.0f / amax;
        for (size_t i = 0; i < len; i++) {
            float v = x[i0 + i] * inv;
            v = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
            q[i0 + i] = lut[(uint16_t)(quant_f32((v + 1.0f) * 0.5f * 65535.0f) + 0.5f)];
        }
    }
}

// the mean of x (n >= 1) in fp32 (the offset; see the top of the file)
static inline float quant_mean(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    return (float)s / (float)n;
}

// absmax (n) = dynamic[q] * absmax2 of q's block + offset
static inline void dequant_blocks8(const uint8_t *q, const float *absmax2, float offset, size_t n, float *absmax) {
    for (size_t i = 0; i < n; i++) absmax[i] = quant_f32(quant_dynamic[q[i]] * absmax2[i / QUANT_BLOCK2]) + offset;
}

// ----------------------------------------------------------------------------
// a whole tensor

// w (numel) into q (laid out by quant_layout); absmax: scratch of q->n_blocks floats
// (double_quant; else unused). name: the tensor's, for the message. 0 ok, -1 when
// w is empty or holds a NaN or an infinity (bitsandbytes would store garbage for its block).
static inline int quant_tensor(QuantTensor *q, const float *w, float *absmax, const char *name) {
    if (q->numel == 0) { fprintf(stderr, "error: tensor '%s' has no elements to quantize\n", name); return -1; }
    for (size_t i = 0; i < q->numel; i++)
        if (!isfinite(w[i])) {
            fprintf(stderr, "error: tensor '%s' has a non-finite value (%g at element %zu): it cannot be quantized\n",
                    name, w[i], i);
            return -1;
        }
    if (!q->double_quant) { quant_blocks4(w, q->numel, q->type, q->codes, q->absmax); return 0; }
    quant_blocks4(w, q->numel, q->type, q->codes, absmax);
    *q->offset = quant_mean(absmax, q->n_blocks);
    for (size_t b = 0; b < q->n_blocks; b++) absmax[b] -= *q->offset;
    quant_blocks8(absmax, q->n_blocks, q->qabsmax, q->absmax2);
    return 0;
}

// q's weights (numel) into out, as bitsandbytes' dequantize_4bit gives them in fp32;
// absmax: scratch of q->n_blocks floats (double_quant; else unused)
static inline void dequant_tensor(const QuantTensor *q, float *out, float *absmax) {
    if (q->double_quant) dequant_blocks8(q->qabsmax, q->absmax2, *q->offset, q->n_blocks, absmax);
    dequant_blocks4(q->codes, q->double_quant ? absmax : q->absmax, q->numel, q->type, out);
}

#endif // QUANT_H
