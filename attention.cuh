// Attention of a chunk of queries against the KV carry, forward and backward, on
// the GPU: the twin of attention_forward / attention_backward in attention.h, with
// the same arguments (plus the stream), the same mask (chunk.h: bottom-right
// causal, Mistral's sliding window, or shifted sparse attention's groups), GQA and
// shapes; attention.h's opening comment explains them. What differs: lse is fp32
// whatever the storage type, and the backward's dk, dv are ADDED into as on the CPU
// but by other kernels than dq's (below).
//
// As on the CPU, the forward walks key tiles with an online softmax and saves each
// row's log-sum-exp, and the backward recomputes P = exp(S - lse) tile by tile. The
// backward is two kernels, so that nothing needs atomics:
//   dq:     a block owns a tile of queries and walks the key tiles it sees;
//   dk, dv: a block owns a tile of keys of one KV head and walks every query
//           tile of every query head of its group that sees them, summing in
//           registers, then adds once into dk, dv.
// Each output element is thus summed by one thread in a fixed order: results
// repeat bit for bit, and GQA needs no reduction across blocks. The price is
// computing S and dP twice (7 tile products instead of the 5 of a fused
// backward with atomic dq). With a window or groups, every loop skips the tiles
// wholly outside the mask: key tiles before a query tile's first query's first key,
// query tiles after a key tile's last key's last query (per query head), and key
// tiles that no query of the chunk sees get no block.
//
// Two implementations of the same tiling:
//   SIMT (fp32 FMA, float, bf16 or fp16 storage, any even hd up to 256): 32 x 32 tiles,
//     8 warps, each owning 4 rows; the fp32 path that is compared tightly with the CPU.
//   tensor cores (bf16 or fp16, hd 64 or 128): 64 x 64 tiles, 4 warps, each
//     owning 16 rows; the products go through WMMA (mma.sync, fp32 accumulation),
//     the softmax stays fp32 and P, dS are rounded to the storage type for their
//     products (fp16 on Volta and Turing, which have no bf16 tensor cores).
// attention_forward / attention_backward pick tensor cores where they apply.
#pragma once
#include <type_traits>
#include <mma.h>
#include "support/cuda_common.cuh"
#include "chunk.h" // Chunk and the attention mask

// set to run the SIMT kernels also where the tensor-core ones would (checks, debugging)
inline bool attention_force_simt = false;

// whether the query at position p, whose first key is lo (<= p), sees key s: lo <= s <= p,
// as one unsigned comparison (s < lo wraps above p - lo). The query-major kernels work out
// each row's lo once; the key-major dk, dv kernels test a query against
// s - t0 <= i < attention_query_end(s) - t0 instead.
__device__ inline bool attention_sees(int lo, int p, int s) { return (unsigned)(s - lo) <= (unsigned)(p - lo); }
// the first key that query i of the chunk sees, in the query-major kernels' head (blockIdx.y)
__device__ inline int attention_row_first_key(const Chunk &ch, int i, int NH) {
    return attention_first_key(&ch, ch.t0 + i, blockIdx.y, NH);
}

// where the rows of batch row b, query head h (KV head kh) live: row i of q, out,
// dq, dout at q(i); key s of k, v, dk, dv at kv(s); the lse of query i at lse(i)
struct AttentionIndex {
    size_t q_stride, kv_stride, q_head, kv_head, lse_head;
    __device__ AttentionIndex(const Chunk &ch, int NH, int NKV, int hd, int b, int h, int kh)
        : q_stride((size_t)NH * hd), kv_stride((size_t)NKV * hd), q_head((size_t)b * ch.len * NH * hd + (size_t)h * hd),
          kv_head((size_t)b * ch.T * NKV * hd + (size_t)kh * hd), lse_head(((size_t)b * NH + h) * ch.len) {}
    __device__ size_t q(int i) const { return q_head + i * q_stride; }
    __device__ size_t kv(int s) const { return kv_head + s * kv_stride; }
    __device__ size_t lse(int i) const { return lse_head + i; }
};

// The query tile of a block of the forward and dq kernels: blockIdx = (tile,
// head, batch row), tiles in reverse order, as the last see the most keys and
// should start first. Rows i0 .. i0 + rows - 1 (those >= len are padding); keys
// kv_begin .. kv_end - 1 hold the ones its rows see: kv_end - 1 is its last valid
// row's last key, kv_begin the start of the key tile (rows wide, from 0) holding
// its first row's first key.
struct QueryTile : AttentionIndex {
    int i0, kv_begin, kv_end;
    __device__ QueryTile(const Chunk &ch, int NH, int NKV, int hd, int rows)
        : AttentionIndex(ch, NH, NKV, hd, blockIdx.z, blockIdx.y, blockIdx.y / (NH / NKV)),
          i0((gridDim.x - 1 - blockIdx.x) * rows), kv_begin(attention_row_first_key(ch, i0, NH) / rows * rows),
          kv_end(ch.t0 + min(i0 + rows, ch.len)) {}
};

// The key tile of a block of the dk, dv kernels: blockIdx.x counts the tiles (rows
// wide, from 0) from the first that a query of the chunk sees (its first query's
// first key's, in either half of the heads); the ones before get no block.
__host__ __device__ inline int attention_first_key_tile(const Chunk &ch, int rows, int NH) {
    return attention_chunk_first_key(&ch, NH) / rows;
}

// ----------------------------------------------------------------------------
// SIMT kernels

constexpr int ATT_TILE = 32;                     // query rows and keys per tile
constexpr int ATT_WARPS = 8;
constexpr int ATT_ROWS = ATT_TILE / ATT_WARPS;   // rows per warp

// tile (ATT_TILE, ld) in fp32 <- rows r0 .. r0 + ATT_TILE of a tensor (row i at
// src[i * stride]); rows at or past n_valid are zero and never read
template <typename T>
__device__ void load_rows_f32(float *tile, int ld, const T *src, size_t stride, int r0, int n_valid, int hd) {
    for (int idx = threadIdx.x; idx < ATT_TILE * hd; idx += blockDim.x) {
        int r = idx / hd, d = idx % hd;
        tile[r * ld + d] = r0 + r < n_valid ? to_float(src[(size_t)(r0 + r) * stride + d]) : 0.0f;
    }
}

// a . b over hd for two rows of shared tiles
__device__ inline float row_dot(const float *a, const float *b, int hd) {
    float dot = 0.0f;
    for (int d = 0; d < hd; d++) dot += a[d] * b[d];
    return dot;
}

// acc[r][j] += sum_c w[row r of this warp][c] * m[c][lane + 32 j]: the warp's rows
// of a (ATT_TILE, ATT_TILE) tile w times an (ATT_TILE, ld) tile m (O += P V, dq += dS K, ...)
template <int DPL>
__device__ void warp_rows_matmul(float (&acc)[ATT_ROWS][DPL], const float *w, const float *m, int ld, int hd) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int c = 0; c < ATT_TILE; c++) {
        float mc[DPL];
        for (int j = 0; j < DPL; j++) mc[j] = lane + 32 * j < hd ? m[c * ld + lane + 32 * j] : 0.0f;
        for (int r = 0; r < ATT_ROWS; r++) {
            float wc = w[(warp * ATT_ROWS + r) * ATT_TILE + c];
            for (int j = 0; j < DPL; j++) acc[r][j] += wc * mc[j];
        }
    }
}

// query rows i0 + this warp's rows of dst (row i at dst[at(i)]) <- acc; padding rows (i >= len) are skipped
template <typename T, int DPL, typename At>
__device__ void store_warp_rows(T *dst, At at, const float (&acc)[ATT_ROWS][DPL], int i0, int len, int hd) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = 0; r < ATT_ROWS; r++) {
        int i = i0 + warp * ATT_ROWS + r;
        for (int j = 0; i < len && j < DPL; j++)
            if (lane + 32 * j < hd) dst[at(i) + lane + 32 * j] = from_float<T>(acc[r][j]);
    }
}

// Forward: a block per (query tile, head, batch row). Lane c of a warp scores key
// c of the tile for the warp's 4 rows; the row statistics are warp reductions;
// lane j accumulates output dims j, j + 32, ... (DPL = ceil(hd / 32) of them).
// Tiles are padded to hd + 1 floats a row, so 32 lanes reading 32 different rows
// hit 32 different banks.
template <typename T, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_forward_simt_kernel(T *out, float *lse, const T *q, const T *k, const T *v, Chunk ch, int NH, int NKV,
                              int hd, float scale) {
    extern __shared__ float smem[];
    int ld = hd + 1;
    float *qs = smem, *ks = qs + ATT_TILE * ld, *vs = ks + ATT_TILE * ld; // (ATT_TILE, ld) each
    float *ps = vs + ATT_TILE * ld;                                     // (ATT_TILE, ATT_TILE) probabilities
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    QueryTile ix(ch, NH, NKV, hd, ATT_TILE);
    load_rows_f32(qs, ld, q + ix.q_head, ix.q_stride, ix.i0, ch.len, hd);
    float m[ATT_ROWS], l[ATT_ROWS], o[ATT_ROWS][DPL];
    int lo[ATT_ROWS]; // the first key each row sees
    for (int r = 0; r < ATT_ROWS; r++) {
        lo[r] = attention_row_first_key(ch, ix.i0 + warp * ATT_ROWS + r, NH);
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int j = 0; j < DPL; j++) o[r][j] = 0.0f;
    }
    for (int s0 = ix.kv_begin; s0 < ix.kv_end; s0 += ATT_TILE) {
        __syncthreads(); // qs is in; every warp is done with the last tile's ks, vs, ps
        load_rows_f32(ks, ld, k + ix.kv_head, ix.kv_stride, s0, ix.kv_end, hd);
        load_rows_f32(vs, ld, v + ix.kv_head, ix.kv_stride, s0, ix.kv_end, hd);
        __syncthreads();
        for (int r = 0; r < ATT_ROWS; r++) {
            int row = warp * ATT_ROWS + r, i = ix.i0 + row, s = s0 + lane;
            float x = attention_sees(lo[r], ch.t0 + i, s) ? row_dot(qs + row * ld, ks + lane * ld, hd) * scale : -INFINITY;
            // m_new is -inf only while a row has seen no key (its window or group starts later):
            // subtract 0 then, so p and corr are e^-inf = 0, not e^NaN
            float m_new = fmaxf(m[r], warp_max(x)), m_sub = m_new == -INFINITY ? 0.0f : m_new;
            float p = expf(x - m_sub), corr = expf(m[r] - m_sub);
            l[r] = l[r] * corr + warp_sum(p);
            m[r] = m_new;
            ps[row * ATT_TILE + lane] = p;
            for (int j = 0; j < DPL; j++) o[r][j] *= corr;
        }
        __syncwarp();
        warp_rows_matmul(o, ps, vs, ld, hd);
    }
    for (int r = 0; r < ATT_ROWS; r++) {
        int i = ix.i0 + warp * ATT_ROWS + r;
        for (int j = 0; j < DPL; j++) o[r][j] /= l[r];
        if (lane == 0 && i < ch.len) lse[ix.lse(i)] = m[r] + logf(l[r]);
    }
    store_warp_rows(out, [&](int i) { return ix.q(i); }, o, ix.i0, ch.len, hd);
}

// dq: a block per (query tile, head, batch row); lane c handles key c of a tile
// for the warp's 4 rows, then lane j accumulates dq dims j, j + 32, ...
template <typename T, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_backward_dq_simt_kernel(T *dq, const T *dout, const T *out, const float *lse, const T *q, const T *k,
                                  const T *v, Chunk ch, int NH, int NKV, int hd, float scale) {
    extern __shared__ float smem[];
    int ld = hd + 1;
    float *qs = smem, *dos = qs + ATT_TILE * ld, *ks = dos + ATT_TILE * ld, *vs = ks + ATT_TILE * ld;
    float *dss = vs + ATT_TILE * ld; // (ATT_TILE, ATT_TILE) dS
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    QueryTile ix(ch, NH, NKV, hd, ATT_TILE);
    load_rows_f32(qs, ld, q + ix.q_head, ix.q_stride, ix.i0, ch.len, hd);
    load_rows_f32(dos, ld, dout + ix.q_head, ix.q_stride, ix.i0, ch.len, hd);
    float row_lse[ATT_ROWS], row_D[ATT_ROWS], acc[ATT_ROWS][DPL];
    int lo[ATT_ROWS]; // the first key each row sees
    for (int r = 0; r < ATT_ROWS; r++) {
        int i = ix.i0 + warp * ATT_ROWS + r;
        lo[r] = attention_row_first_key(ch, i, NH);
        float part = 0.0f;
        for (int d = lane; i < ch.len && d < hd; d += 32) part += to_float(dout[ix.q(i) + d]) * to_float(out[ix.q(i) + d]);
        row_D[r] = warp_sum(part);
        row_lse[r] = i < ch.len ? lse[ix.lse(i)] : 0.0f;
        for (int j = 0; j < DPL; j++) acc[r][j] = 0.0f;
    }
    for (int s0 = ix.kv_begin; s0 < ix.kv_end; s0 += ATT_TILE) {
        __syncthreads();
        load_rows_f32(ks, ld, k + ix.kv_head, ix.kv_stride, s0, ix.kv_end, hd);
        load_rows_f32(vs, ld, v + ix.kv_head, ix.kv_stride, s0, ix.kv_end, hd);
        __syncthreads();
        for (int r = 0; r < ATT_ROWS; r++) {
            int row = warp * ATT_ROWS + r, i = ix.i0 + row, s = s0 + lane;
            float ds = 0.0f;
            if (i < ch.len && attention_sees(lo[r], ch.t0 + i, s)) {
                float p = expf(row_dot(qs + row * ld, ks + lane * ld, hd) * scale - row_lse[r]);
                ds = p * (row_dot(dos + row * ld, vs + lane * ld, hd) - row_D[r]) * scale;
            }
            dss[row * ATT_TILE + lane] = ds;
        }
        __syncwarp();
        warp_rows_matmul(acc, dss, ks, ld, hd);
    }
    store_warp_rows(dq, [&](int i) { return ix.q(i); }, acc, ix.i0, ch.len, hd);
}

// dk, dv: a block per (key tile, KV head, batch row); the warp's 4 keys against
// the 32 queries of a tile (lane = query), then lane j accumulates dims j, j + 32, ...
template <typename T, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_backward_dkv_simt_kernel(T *dk, T *dv, const T *dout, const T *out, const float *lse, const T *q,
                                   const T *k, const T *v, Chunk ch, int NH, int NKV, int hd, float scale) {
    extern __shared__ float smem[];
    int ld = hd + 1;
    float *ks = smem, *vs = ks + ATT_TILE * ld, *qs = vs + ATT_TILE * ld, *dos = qs + ATT_TILE * ld;
    float *pts = dos + ATT_TILE * ld, *dsts = pts + ATT_TILE * ATT_TILE; // (keys, queries) P^T and dS^T
    float *tile_lse = dsts + ATT_TILE * ATT_TILE, *tile_D = tile_lse + ATT_TILE;
    int kh = blockIdx.y, b = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = NH / NKV;
    int s0 = (blockIdx.x + attention_first_key_tile(ch, ATT_TILE, NH)) * ATT_TILE, kv_valid = ch.t0 + ch.len;
    AttentionIndex kix(ch, NH, NKV, hd, b, kh * group, kh);
    load_rows_f32(ks, ld, k + kix.kv_head, kix.kv_stride, s0, kv_valid, hd);
    load_rows_f32(vs, ld, v + kix.kv_head, kix.kv_stride, s0, kv_valid, hd);
    float dk_acc[ATT_ROWS][DPL], dv_acc[ATT_ROWS][DPL];
    for (int r = 0; r < ATT_ROWS; r++)
        for (int j = 0; j < DPL; j++) dk_acc[r][j] = dv_acc[r][j] = 0.0f;
    int first_i = max(0, s0 - ch.t0); // queries before it see none of these keys
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        AttentionIndex ix(ch, NH, NKV, hd, b, h, kh);
        int end_i = attention_query_end(&ch, s0 + ATT_TILE - 1, h, NH) - ch.t0; // nor those from end_i on (this head's mask)
        for (int i0 = first_i / ATT_TILE * ATT_TILE; i0 < end_i; i0 += ATT_TILE) {
            __syncthreads(); // ks, vs are in; every warp is done with the last query tile
            load_rows_f32(qs, ld, q + ix.q_head, ix.q_stride, i0, ch.len, hd);
            load_rows_f32(dos, ld, dout + ix.q_head, ix.q_stride, i0, ch.len, hd);
            __syncthreads();
            for (int r = 0; r < ATT_ROWS; r++) { // lse and D of the tile's queries, a warp per row
                int row = warp * ATT_ROWS + r, i = i0 + row;
                float part = 0.0f;
                for (int d = lane; i < ch.len && d < hd; d += 32) part += dos[row * ld + d] * to_float(out[ix.q(i) + d]);
                part = warp_sum(part);
                if (lane == 0) {
                    tile_D[row] = part;
                    tile_lse[row] = i < ch.len ? lse[ix.lse(i)] : 0.0f;
                }
            }
            __syncthreads();
            int i = i0 + lane, lo = attention_first_key(&ch, ch.t0 + i, h, NH); // this lane's query, its first key
            for (int r = 0; r < ATT_ROWS; r++) {
                int c = warp * ATT_ROWS + r, s = s0 + c;
                float p = 0.0f, ds = 0.0f;
                if (i < ch.len && attention_sees(lo, ch.t0 + i, s)) {
                    p = expf(row_dot(qs + lane * ld, ks + c * ld, hd) * scale - tile_lse[lane]);
                    ds = p * (row_dot(dos + lane * ld, vs + c * ld, hd) - tile_D[lane]) * scale;
                }
                pts[c * ATT_TILE + lane] = p;
                dsts[c * ATT_TILE + lane] = ds;
            }
            __syncwarp();
            warp_rows_matmul(dv_acc, pts, dos, ld, hd); // dV += P^T dO
            warp_rows_matmul(dk_acc, dsts, qs, ld, hd); // dK += dS^T Q
        }
    }
    // this block alone owns these keys of this KV head: plain read-add-write
    for (int r = 0; r < ATT_ROWS; r++) {
        int s = s0 + warp * ATT_ROWS + r;
        if (s >= kv_valid) continue;
        for (int j = 0; j < DPL; j++) {
            if (lane + 32 * j >= hd) continue;
            size_t at = kix.kv(s) + lane + 32 * j;
            dk[at] = from_float<T>(to_float(dk[at]) + dk_acc[r][j]);
            dv[at] = from_float<T>(to_float(dv[at]) + dv_acc[r][j]);
        }
    }
}

// ----------------------------------------------------------------------------
// tensor-core kernels (E: bf16 or fp16, hd 64 or 128)

namespace wmma = nvcuda::wmma;
typedef __nv_bfloat16 bf16;
template <typename E> using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major>;
template <typename E> using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major>;  // B as stored (k, n)
template <typename E> using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major>; // B^T as stored: rows of keys
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

constexpr int TC_TILE = 64, TC_WARPS = 4; // each warp owns 16 rows of a tile

// whether E's tensor-core kernels exist in this compilation: bf16 WMMA needs sm_80
// (Ampere); Volta (sm_70) and Turing (sm_75) have fp16 tensor cores only, and their
// build compiles the bf16 kernels empty (the trainer refuses bf16 there at startup)
template <typename E> __host__ __device__ constexpr bool tc_compiled() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    return !std::is_same<E, bf16>::value;
#else
    return true;
#endif
}

// Shared-memory tiles of TC_TILE rows. Each row is padded by 16 bytes (8 bf16 or fp16,
// 4 floats) so the rows of a 16 x 16 fragment start in different banks; every
// size is a multiple of 128 bytes, so consecutive tiles keep the 32-byte
// alignment WMMA loads need.
template <int HD> struct TcTiles {
    static constexpr int LDH = HD + 8;        // E (TC_TILE, HD): q, k, v, dout
    static constexpr int LDS = TC_TILE + 4;   // fp32 (TC_TILE, TC_TILE): scores
    static constexpr int LDP = TC_TILE + 8;   // E (TC_TILE, TC_TILE): P, dS
    static constexpr int LDO = HD + 4;        // fp32 (TC_TILE, HD): output, dq, dk, dv
    static constexpr size_t H = TC_TILE * LDH * 2, S = TC_TILE * LDS * 4, P = TC_TILE * LDP * 2, O = TC_TILE * LDO * 4;
    static constexpr size_t STATS = TC_TILE * 4; // a float per row
    static_assert(H % 128 == 0 && S % 128 == 0 && P % 128 == 0 && O % 128 == 0, "tiles must keep 128-byte alignment");
    static_assert(2 * H >= O, "two 16-bit tiles must hold an fp32 output tile (the staging area)");
};

// hands out consecutive pieces of dynamic shared memory
struct SmemArena {
    unsigned char *next;
    template <typename U> __device__ U *take(size_t bytes) {
        U *p = (U *)next;
        next += bytes;
        return p;
    }
};

// tile (TC_TILE, HD + 8) of E <- rows r0 .. r0 + TC_TILE of src (row i at
// src[i * stride], 16-byte aligned); rows at or past n_valid are zero and never read
template <int HD, typename E>
__device__ void load_rows(E *tile, const E *src, size_t stride, int r0, int n_valid) {
    constexpr int VECS = HD / 8; // 16-byte vectors per row
    for (int idx = threadIdx.x; idx < TC_TILE * VECS; idx += blockDim.x) {
        int r = idx / VECS, c = idx % VECS;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r0 + r < n_valid) val = *(const uint4 *)(src + (size_t)(r0 + r) * stride + c * 8);
        *(uint4 *)(tile + r * TcTiles<HD>::LDH + c * 8) = val;
    }
}

// C (16, 16 * NB) = A (16, 16 * KB) @ B, A from a row-major tile with leading dim lda,
// fragment n of C stored row-major at c + 16 n. BT: B's columns are rows of b (keys).
template <int KB, int NB, bool BT, typename E>
__device__ void warp_matmul_store(float *c, int ldc, const E *a, int lda, const E *b, int ldb) {
    FragA<E> fa[KB];
    for (int kk = 0; kk < KB; kk++) wmma::load_matrix_sync(fa[kk], a + kk * 16, lda);
    for (int n = 0; n < NB; n++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < KB; kk++) {
            if constexpr (BT) {
                FragBT<E> fb;
                wmma::load_matrix_sync(fb, b + n * 16 * ldb + kk * 16, ldb);
                wmma::mma_sync(acc, fa[kk], fb, acc);
            } else {
                FragB<E> fb;
                wmma::load_matrix_sync(fb, b + kk * 16 * ldb + n * 16, ldb);
                wmma::mma_sync(acc, fa[kk], fb, acc);
            }
        }
        wmma::store_matrix_sync(c + n * 16, acc, ldc, wmma::mem_row_major);
    }
}

// acc[n] += A (16, 64) @ B (64, 16 NB) with B as stored (row-major (64, 16 NB) at b)
template <int NB, typename E>
__device__ void warp_matmul_acc(FragC (&acc)[NB], const E *a, int lda, const E *b, int ldb) {
    FragA<E> fa[TC_TILE / 16];
    for (int kk = 0; kk < TC_TILE / 16; kk++) wmma::load_matrix_sync(fa[kk], a + kk * 16, lda);
    for (int n = 0; n < NB; n++)
        for (int kk = 0; kk < TC_TILE / 16; kk++) {
            FragB<E> fb;
            wmma::load_matrix_sync(fb, b + kk * 16 * ldb + n * 16, ldb);
            wmma::mma_sync(acc[n], fa[kk], fb, acc[n]);
        }
}

// Forward: a block per (query tile, head, batch row); warp w owns query rows
// 16w .. 16w + 15. S = Q K^T goes through shared memory (fp32), where lane pair
// (2r, 2r + 1) runs the online softmax of row r over 32 columns each; the output
// (fp32) stays in shared memory so each row can be rescaled, and O += P V.
template <int HD, typename E>
__device__ void attention_forward_tc(E *out, float *lse, const E *q, const E *k, const E *v, Chunk ch, int NH,
                            int NKV, float scale) {
    using L = TcTiles<HD>;
    extern __shared__ __align__(128) unsigned char smem_tc[];
    SmemArena arena{smem_tc};
    E *qs = arena.take<E>(L::H), *ks = arena.take<E>(L::H), *vs = arena.take<E>(L::H);
    float *ss = arena.take<float>(L::S), *os = arena.take<float>(L::O);
    E *ps = arena.take<E>(L::P);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    QueryTile ix(ch, NH, NKV, HD, TC_TILE);
    int r0 = warp * 16, row = r0 + lane / 2, half = lane % 2, i = ix.i0 + row; // this lane's softmax row and half
    int lo = attention_row_first_key(ch, i, NH), pos = ch.t0 + i; // the keys row i sees
    load_rows<HD>(qs, q + ix.q_head, ix.q_stride, ix.i0, ch.len);
    for (int d = half * HD / 2; d < (half + 1) * HD / 2; d++) os[row * L::LDO + d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int s0 = ix.kv_begin; s0 < ix.kv_end; s0 += TC_TILE) {
        __syncthreads(); // qs is in; every warp is done with the last tile's ks, vs
        load_rows<HD>(ks, k + ix.kv_head, ix.kv_stride, s0, ix.kv_end);
        load_rows<HD>(vs, v + ix.kv_head, ix.kv_stride, s0, ix.kv_end);
        __syncthreads();
        warp_matmul_store<HD / 16, TC_TILE / 16, true>(ss + r0 * L::LDS, L::LDS, qs + r0 * L::LDH, L::LDH, ks, L::LDH);
        __syncwarp();
        float x[32], mx = -INFINITY;
        #pragma unroll
        for (int c = 0; c < 32; c++) {
            int col = half * 32 + c;
            x[c] = attention_sees(lo, pos, s0 + col) ? ss[row * L::LDS + col] * scale : -INFINITY;
            mx = fmaxf(mx, x[c]);
        }
        // -inf while the row has seen no key (its window or group starts later): then subtract 0, as the SIMT kernel
        float m_new = fmaxf(m, fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1))), m_sub = m_new == -INFINITY ? 0.0f : m_new;
        float corr = expf(m - m_sub), sum = 0.0f;
        #pragma unroll
        for (int c = 0; c < 32; c++) {
            float p = expf(x[c] - m_sub);
            sum += p;
            ps[row * L::LDP + half * 32 + c] = from_float<E>(p);
        }
        l = l * corr + sum + __shfl_xor_sync(0xffffffff, sum, 1);
        m = m_new;
        for (int d = half * HD / 2; d < (half + 1) * HD / 2; d++) os[row * L::LDO + d] *= corr;
        __syncwarp();
        FragC o[HD / 16];
        for (int n = 0; n < HD / 16; n++) wmma::load_matrix_sync(o[n], os + r0 * L::LDO + n * 16, L::LDO, wmma::mem_row_major);
        warp_matmul_acc<HD / 16>(o, ps + r0 * L::LDP, L::LDP, vs, L::LDH);
        for (int n = 0; n < HD / 16; n++) wmma::store_matrix_sync(os + r0 * L::LDO + n * 16, o[n], L::LDO, wmma::mem_row_major);
        __syncwarp();
    }
    if (i >= ch.len) return; // padding rows of the last tile
    for (int d = half * HD / 2; d < (half + 1) * HD / 2; d++) out[ix.q(i) + d] = from_float<E>(os[row * L::LDO + d] / l);
    if (half == 0) lse[ix.lse(i)] = m + logf(l);
}
// the kernel: bf16's only where it compiles (tc_compiled)
template <int HD, typename E>
__global__ void __launch_bounds__(TC_WARPS * 32)
attention_forward_tc_kernel(E *out, float *lse, const E *q, const E *k, const E *v, Chunk ch, int NH, int NKV,
                            float scale) {
    if constexpr (tc_compiled<E>()) attention_forward_tc<HD>(out, lse, q, k, v, ch, NH, NKV, scale);
}

// D = dout . out of this lane's row, over its half of the dims (dout from the tile), summed across the lane pair
template <int HD, typename E>
__device__ float row_pair_D(const E *dout_row_tile, const E *out_row, int half, bool valid) {
    float part = 0.0f;
    for (int d = half * HD / 2; valid && d < (half + 1) * HD / 2; d++)
        part += to_float(dout_row_tile[d]) * to_float(out_row[d]);
    return part + __shfl_xor_sync(0xffffffff, part, 1);
}

// dq: a block per (query tile, head, batch row), warp w owning rows 16w ..;
// S = Q K^T and dP = dO V^T through shared memory, dS = P (dP - D) scale in E,
// and dq += dS K accumulates in registers across the key tiles.
template <int HD, typename E>
__device__ void attention_backward_dq_tc(E *dq, const E *dout, const E *out, const float *lse, const E *q,
                                const E *k, const E *v, Chunk ch, int NH, int NKV, float scale) {
    using L = TcTiles<HD>;
    extern __shared__ __align__(128) unsigned char smem_tc[];
    SmemArena arena{smem_tc};
    E *qs = arena.take<E>(L::H), *dos = arena.take<E>(L::H);
    E *ks = arena.take<E>(L::H), *vs = arena.take<E>(L::H); // then the fp32 staging of dq
    float *ss = arena.take<float>(L::S), *dps = arena.take<float>(L::S);
    E *dss = arena.take<E>(L::P);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    QueryTile ix(ch, NH, NKV, HD, TC_TILE);
    int r0 = warp * 16, row = r0 + lane / 2, half = lane % 2, i = ix.i0 + row;
    int lo = attention_row_first_key(ch, i, NH), pos = ch.t0 + i; // the keys row i sees
    load_rows<HD>(qs, q + ix.q_head, ix.q_stride, ix.i0, ch.len);
    load_rows<HD>(dos, dout + ix.q_head, ix.q_stride, ix.i0, ch.len);
    __syncthreads();
    float D = row_pair_D<HD>(dos + row * L::LDH, out + ix.q(i), half, i < ch.len);
    float row_lse = i < ch.len ? lse[ix.lse(i)] : 0.0f;
    FragC acc[HD / 16];
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
    for (int s0 = ix.kv_begin; s0 < ix.kv_end; s0 += TC_TILE) {
        __syncthreads();
        load_rows<HD>(ks, k + ix.kv_head, ix.kv_stride, s0, ix.kv_end);
        load_rows<HD>(vs, v + ix.kv_head, ix.kv_stride, s0, ix.kv_end);
        __syncthreads();
        warp_matmul_store<HD / 16, TC_TILE / 16, true>(ss + r0 * L::LDS, L::LDS, qs + r0 * L::LDH, L::LDH, ks, L::LDH);
        warp_matmul_store<HD / 16, TC_TILE / 16, true>(dps + r0 * L::LDS, L::LDS, dos + r0 * L::LDH, L::LDH, vs, L::LDH);
        __syncwarp();
        for (int c = 0; c < 32; c++) {
            int col = half * 32 + c;
            float ds = 0.0f;
            if (i < ch.len && attention_sees(lo, pos, s0 + col)) {
                float p = expf(ss[row * L::LDS + col] * scale - row_lse);
                ds = p * (dps[row * L::LDS + col] - D) * scale;
            }
            dss[row * L::LDP + col] = from_float<E>(ds);
        }
        __syncwarp();
        warp_matmul_acc<HD / 16>(acc, dss + r0 * L::LDP, L::LDP, ks, L::LDH);
    }
    __syncthreads(); // every warp is done with ks, vs: they become the staging area
    float *stage = (float *)ks;
    for (int n = 0; n < HD / 16; n++) wmma::store_matrix_sync(stage + r0 * L::LDO + n * 16, acc[n], L::LDO, wmma::mem_row_major);
    __syncwarp();
    if (i >= ch.len) return;
    for (int d = half * HD / 2; d < (half + 1) * HD / 2; d++) dq[ix.q(i) + d] = from_float<E>(stage[row * L::LDO + d]);
}
// the kernel: bf16's only where it compiles (tc_compiled)
template <int HD, typename E>
__global__ void __launch_bounds__(TC_WARPS * 32)
attention_backward_dq_tc_kernel(E *dq, const E *dout, const E *out, const float *lse, const E *q, const E *k,
                                const E *v, Chunk ch, int NH, int NKV, float scale) {
    if constexpr (tc_compiled<E>()) attention_backward_dq_tc<HD>(dq, dout, out, lse, q, k, v, ch, NH, NKV, scale);
}

// fragments (16 rows from r0, HD) staged through shared memory, added into dst rows s0 + r0 + ..
template <int HD, typename E>
__device__ void add_rows_from_frags(E *dst, const AttentionIndex &ix, float *stage, FragC (&acc)[HD / 16], int r0,
                                    int s0, int n_valid) {
    using L = TcTiles<HD>;
    int lane = threadIdx.x % 32, row = r0 + lane / 2, half = lane % 2, s = s0 + row;
    for (int n = 0; n < HD / 16; n++) wmma::store_matrix_sync(stage + r0 * L::LDO + n * 16, acc[n], L::LDO, wmma::mem_row_major);
    __syncwarp();
    for (int d = half * HD / 2; s < n_valid && d < (half + 1) * HD / 2; d++) {
        size_t at = ix.kv(s) + d;
        dst[at] = from_float<E>(to_float(dst[at]) + stage[row * L::LDO + d]);
    }
    __syncwarp(); // the stage is reused next
}

// dk, dv: a block per (key tile, KV head, batch row), warp w owning keys 16w ..;
// for every query tile of every head of the group that sees the keys:
// S^T = K Q^T and dP^T = V dO^T through shared memory, then in registers
// dV += P^T dO and dK += dS^T Q; at the end each is added once into dk, dv.
template <int HD, typename E>
__device__ void attention_backward_dkv_tc(E *dk, E *dv, const E *dout, const E *out, const float *lse,
                                 const E *q, const E *k, const E *v, Chunk ch, int NH, int NKV, float scale) {
    using L = TcTiles<HD>;
    extern __shared__ __align__(128) unsigned char smem_tc[];
    SmemArena arena{smem_tc};
    E *ks = arena.take<E>(L::H), *vs = arena.take<E>(L::H);
    E *qs = arena.take<E>(L::H), *dos = arena.take<E>(L::H); // then the fp32 staging of dk, dv
    float *sts = arena.take<float>(L::S), *dpts = arena.take<float>(L::S);
    E *pts = arena.take<E>(L::P), *dsts = arena.take<E>(L::P);
    float *tile_lse = arena.take<float>(L::STATS), *tile_D = arena.take<float>(L::STATS);
    int kh = blockIdx.y, b = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = NH / NKV;
    int s0 = (blockIdx.x + attention_first_key_tile(ch, TC_TILE, NH)) * TC_TILE, kv_valid = ch.t0 + ch.len;
    int r0 = warp * 16, row = r0 + lane / 2, half = lane % 2, s = s0 + row; // this lane's key row and half
    int i_first = s - ch.t0;                                              // the first query that sees key s
    AttentionIndex kix(ch, NH, NKV, HD, b, kh * group, kh);
    load_rows<HD>(ks, k + kix.kv_head, kix.kv_stride, s0, kv_valid);
    load_rows<HD>(vs, v + kix.kv_head, kix.kv_stride, s0, kv_valid);
    FragC dk_acc[HD / 16], dv_acc[HD / 16];
    for (int n = 0; n < HD / 16; n++) {
        wmma::fill_fragment(dk_acc[n], 0.0f);
        wmma::fill_fragment(dv_acc[n], 0.0f);
    }
    int first_i = max(0, s0 - ch.t0);
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        AttentionIndex ix(ch, NH, NKV, HD, b, h, kh);
        // one past the last query of head h that sees key s, and one of the tile's keys
        int i_end = attention_query_end(&ch, s, h, NH) - ch.t0;
        int end_i = attention_query_end(&ch, s0 + TC_TILE - 1, h, NH) - ch.t0;
        for (int i0 = first_i / TC_TILE * TC_TILE; i0 < end_i; i0 += TC_TILE) {
            __syncthreads();
            load_rows<HD>(qs, q + ix.q_head, ix.q_stride, i0, ch.len);
            load_rows<HD>(dos, dout + ix.q_head, ix.q_stride, i0, ch.len);
            __syncthreads();
            { // lse and D of query row `row` of the tile (the lane pairs of all warps cover the 64 rows)
                int i = i0 + row;
                float D = row_pair_D<HD>(dos + row * L::LDH, out + ix.q(i), half, i < ch.len);
                if (half == 0) {
                    tile_D[row] = D;
                    tile_lse[row] = i < ch.len ? lse[ix.lse(i)] : 0.0f;
                }
            }
            warp_matmul_store<HD / 16, TC_TILE / 16, true>(sts + r0 * L::LDS, L::LDS, ks + r0 * L::LDH, L::LDH, qs, L::LDH);
            warp_matmul_store<HD / 16, TC_TILE / 16, true>(dpts + r0 * L::LDS, L::LDS, vs + r0 * L::LDH, L::LDH, dos, L::LDH);
            __syncthreads(); // tile_lse, tile_D from every warp
            for (int c = 0; c < 32; c++) {
                int col = half * 32 + c, i = i0 + col;
                float p = 0.0f, ds = 0.0f;
                if (i >= i_first && i < i_end) {
                    p = expf(sts[row * L::LDS + col] * scale - tile_lse[col]);
                    ds = p * (dpts[row * L::LDS + col] - tile_D[col]) * scale;
                }
                pts[row * L::LDP + col] = from_float<E>(p);
                dsts[row * L::LDP + col] = from_float<E>(ds);
            }
            __syncwarp();
            warp_matmul_acc<HD / 16>(dv_acc, pts + r0 * L::LDP, L::LDP, dos, L::LDH);
            warp_matmul_acc<HD / 16>(dk_acc, dsts + r0 * L::LDP, L::LDP, qs, L::LDH);
        }
    }
    __syncthreads(); // every warp is done with qs, dos: they become the staging area
    // this block alone owns these keys of this KV head: plain read-add-write
    float *stage = (float *)qs;
    add_rows_from_frags<HD>(dk, kix, stage, dk_acc, r0, s0, kv_valid);
    add_rows_from_frags<HD>(dv, kix, stage, dv_acc, r0, s0, kv_valid);
}
// the kernel: bf16's only where it compiles (tc_compiled)
template <int HD, typename E>
__global__ void __launch_bounds__(TC_WARPS * 32)
attention_backward_dkv_tc_kernel(E *dk, E *dv, const E *dout, const E *out, const float *lse, const E *q,
                                 const E *k, const E *v, Chunk ch, int NH, int NKV, float scale) {
    if constexpr (tc_compiled<E>()) attention_backward_dkv_tc<HD>(dk, dv, dout, out, lse, q, k, v, ch, NH, NKV, scale);
}

// ----------------------------------------------------------------------------
// launchers

inline void attention_check_args(const Chunk *ch, int NH, int NKV, int hd, const char *who) {
    if (NKV < 1 || NH % NKV != 0 || hd < 2 || hd % 2 != 0 || hd > 256 || ch->B < 0 || ch->len < 0 || ch->t0 < 0 ||
        ch->t0 + ch->len > ch->T || ch->window < 0 || ch->s2_group < 0 || (ch->window && ch->s2_group)) {
        fprintf(stderr, "error: %s: unsupported shape B=%d T=%d t0=%d len=%d window=%d s2_group=%d NH=%d NKV=%d hd=%d "
                "(needs NH a multiple of NKV, an even hd <= 256, t0 + len <= T, a window >= 0, s2_group >= 0, not both)\n",
                who, ch->B, ch->T, ch->t0, ch->len, ch->window, ch->s2_group, NH, NKV, hd);
        exit(EXIT_FAILURE);
    }
}

// key tiles of rows keys from the first that a query of the chunk sees to the last: the dk, dv grid
inline int attention_key_tiles(const Chunk *ch, int rows, int NH) {
    return ceil_div(ch->t0 + ch->len, rows) - attention_first_key_tile(*ch, rows, NH);
}

// calls f(std::integral_constant<int, DPL>) with DPL = ceil(hd / 32) rounded up to 1, 2, 4 or 8
template <typename F> void with_dims_per_lane(int hd, F f) {
    int need = (hd + 31) / 32;
    if (need <= 1) f(std::integral_constant<int, 1>());
    else if (need <= 2) f(std::integral_constant<int, 2>());
    else if (need <= 4) f(std::integral_constant<int, 4>());
    else f(std::integral_constant<int, 8>());
}

// the tensor-core kernels take bf16 or fp16 with hd 64 or 128 and 16-byte aligned rows
template <typename T> bool attention_tensor_cores(int hd, const void *a, const void *b, const void *c, const void *d) {
    bool aligned = ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) % 16 == 0;
    return !std::is_same<T, float>::value && (hd == 64 || hd == 128) && aligned && !attention_force_simt;
}
template <typename F> void with_head_dim(int hd, F f) {
    if (hd == 64) f(std::integral_constant<int, 64>());
    else f(std::integral_constant<int, 128>());
}

// raises a kernel's dynamic shared memory limit (above 48 KiB needs it), then it may launch
template <typename K> void set_smem(K kernel, size_t bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <typename T>
void attention_forward(T *out, float *lse, const T *q, const T *k, const T *v, const Chunk *ch, int NH, int NKV,
                       int hd, cudaStream_t stream) {
    attention_check_args(ch, NH, NKV, hd, "attention_forward");
    if (ch->B == 0 || ch->len == 0) return;
    float scale = 1.0f / sqrtf((float)hd);
    if constexpr (!std::is_same<T, float>::value) { // bf16 or fp16
        if (attention_tensor_cores<T>(hd, out, q, k, v)) {
            with_head_dim(hd, [&](auto head_dim) {
                constexpr int HD = decltype(head_dim)::value;
                using L = TcTiles<HD>;
                size_t smem = 3 * L::H + L::S + L::O + L::P;
                auto kernel = attention_forward_tc_kernel<HD, T>;
                set_smem(kernel, smem);
                kernel<<<dim3(ceil_div(ch->len, TC_TILE), NH, ch->B), TC_WARPS * 32, smem, stream>>>(
                    out, lse, q, k, v, *ch, NH, NKV, scale);
                cudaLaunchCheck();
            });
            return;
        }
    }
    with_dims_per_lane(hd, [&](auto dims_per_lane) {
        size_t smem = (3 * ATT_TILE * (hd + 1) + ATT_TILE * ATT_TILE) * sizeof(float);
        auto kernel = attention_forward_simt_kernel<T, decltype(dims_per_lane)::value>;
        set_smem(kernel, smem);
        kernel<<<dim3(ceil_div(ch->len, ATT_TILE), NH, ch->B), ATT_WARPS * 32, smem, stream>>>(
            out, lse, q, k, v, *ch, NH, NKV, hd, scale);
        cudaLaunchCheck();
    });
}

template <typename T>
void attention_backward(T *dq, T *dk, T *dv, const T *dout, const T *out, const float *lse, const T *q, const T *k,
                        const T *v, const Chunk *ch, int NH, int NKV, int hd, cudaStream_t stream) {
    attention_check_args(ch, NH, NKV, hd, "attention_backward");
    if (ch->B == 0 || ch->len == 0) return;
    float scale = 1.0f / sqrtf((float)hd);
    dim3 q_grid_simt(ceil_div(ch->len, ATT_TILE), NH, ch->B), kv_grid_simt(attention_key_tiles(ch, ATT_TILE, NH), NKV, ch->B);
    if constexpr (!std::is_same<T, float>::value) { // bf16 or fp16
        if (attention_tensor_cores<T>(hd, dq, dout, q, k) && attention_tensor_cores<T>(hd, dk, dv, out, v)) {
            with_head_dim(hd, [&](auto head_dim) {
                constexpr int HD = decltype(head_dim)::value;
                using L = TcTiles<HD>;
                dim3 q_grid(ceil_div(ch->len, TC_TILE), NH, ch->B), kv_grid(attention_key_tiles(ch, TC_TILE, NH), NKV, ch->B);
                size_t smem_dq = 4 * L::H + 2 * L::S + L::P, smem_dkv = 4 * L::H + 2 * L::S + 2 * L::P + 2 * L::STATS;
                auto dq_kernel = attention_backward_dq_tc_kernel<HD, T>;
                auto dkv_kernel = attention_backward_dkv_tc_kernel<HD, T>;
                set_smem(dq_kernel, smem_dq);
                set_smem(dkv_kernel, smem_dkv);
                dq_kernel<<<q_grid, TC_WARPS * 32, smem_dq, stream>>>(dq, dout, out, lse, q, k, v, *ch, NH, NKV, scale);
                cudaLaunchCheck();
                dkv_kernel<<<kv_grid, TC_WARPS * 32, smem_dkv, stream>>>(dk, dv, dout, out, lse, q, k, v, *ch, NH, NKV,
                                                                          scale);
                cudaLaunchCheck();
            });
            return;
        }
    }
    with_dims_per_lane(hd, [&](auto dims_per_lane) {
        constexpr int DPL = decltype(dims_per_lane)::value;
        size_t ld = hd + 1, tile = ATT_TILE * ATT_TILE;
        size_t smem_dq = (4 * ATT_TILE * ld + tile) * sizeof(float);
        size_t smem_dkv = (4 * ATT_TILE * ld + 2 * tile + 2 * ATT_TILE) * sizeof(float);
        auto dq_kernel = attention_backward_dq_simt_kernel<T, DPL>;
        auto dkv_kernel = attention_backward_dkv_simt_kernel<T, DPL>;
        set_smem(dq_kernel, smem_dq);
        set_smem(dkv_kernel, smem_dkv);
        dq_kernel<<<q_grid_simt, ATT_WARPS * 32, smem_dq, stream>>>(dq, dout, out, lse, q, k, v, *ch, NH, NKV, hd, scale);
        cudaLaunchCheck();
        dkv_kernel<<<kv_grid_simt, ATT_WARPS * 32, smem_dkv, stream>>>(dk, dv, dout, out, lse, q, k, v, *ch, NH, NKV, hd,
                                                                       scale);
        cudaLaunchCheck();
    });
}
