// dev/emu/mma.h: nvcuda::wmma, the warp-wide matrix products of attention.cuh's
// tensor-core kernels.
//
// On the GPU the elements of a fragment are spread over the warp's 32 lanes in an
// unspecified way. Here every lane holds the whole tile (row-major in x[]), so
// code that treats the elements of a fragment uniformly (the only portable use)
// behaves the same. load_matrix_sync, store_matrix_sync and mma_sync are warp
// collectives (device.h): every lane of the warp must call the same one, at the
// same line, with the same pointer, leading dimension and layout; the last lane
// to arrive does the work once. A store and a product also check that the lanes
// hold the same fragments, which fails for code that writes only some lanes'
// elements (it would depend on the unspecified mapping).
//
// mma_sync: D = A B + C with fp32 accumulation, summed over k in order; a product
// of two bf16 (or two fp16) values is exact in fp32, so each element rounds once per term. The
// hardware's order and rounding inside a tensor core step differ slightly: close,
// not bit-exact (docs/cuda.md: what only a GPU can show).
#pragma once
#include "device.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// the tile a fragment holds: A is M x K, B is K x N, C and D are M x N
template <typename Use, int M, int N, int K> struct tile_shape;
template <int M, int N, int K> struct tile_shape<matrix_a, M, N, K> { static constexpr int rows = M, cols = K; };
template <int M, int N, int K> struct tile_shape<matrix_b, M, N, K> { static constexpr int rows = K, cols = N; };
template <int M, int N, int K> struct tile_shape<accumulator, M, N, K> { static constexpr int rows = M, cols = N; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static constexpr int rows = tile_shape<Use, M, N, K>::rows, cols = tile_shape<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols;
    typedef T element_type;
    T x[num_elements]; // element (r, c) at x[r * cols + c]
};

template <typename Use, int M, int N, int K, typename T, typename Layout, typename V>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, const V &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = (T)v;
}

// ----------------------------------------------------------------------------
// what the last lane to arrive does, once for the warp

// element (r, c) of a matrix at p with leading dimension ldm
template <typename T> inline T &element(T *p, unsigned ldm, bool col_major, int r, int c) {
    return col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
}

template <typename Frag> void copy_to_lanes(emu::Lane *w, unsigned mask, const Frag &f) {
    for (unsigned j = 0; j < emu::WARP_SIZE; j++)
        if (mask >> j & 1) *(Frag *)w[j].op.out = f;
}

template <typename Frag> void load_complete(emu::Lane *w, unsigned mask) {
    EMU_CHECKED; // the kernel's own access
    const emu::Collective &op = w[__builtin_ctz(mask)].op;
    typedef typename Frag::element_type T;
    Frag f;
    for (int r = 0; r < Frag::rows; r++)
        for (int c = 0; c < Frag::cols; c++)
            f.x[r * Frag::cols + c] = element((const T *)op.ptr, op.ldm, op.layout == mem_col_major, r, c);
    copy_to_lanes(w, mask, f);
}

// the fragment every lane of the mask passed as operand i, after checking they agree
template <typename Frag> const Frag &agreed_fragment(emu::Lane *w, unsigned mask, int i, const char *what) {
    unsigned first = __builtin_ctz(mask);
    const Frag &f = *(const Frag *)w[first].op.in[i];
    for (unsigned j = first + 1; j < emu::WARP_SIZE; j++) {
        if (!(mask >> j & 1)) continue;
        const Frag &g = *(const Frag *)w[j].op.in[i];
        if (memcmp(f.x, g.x, sizeof f.x) == 0) continue; // (the whole tile at once: element by element took a fifth of the emulated fp16 cases' time)
        for (int e = 0; e < Frag::num_elements; e++)
            if (memcmp(&f.x[e], &g.x[e], sizeof f.x[e]) != 0)
                emu::fail("%s: %s at %s:%d: lanes %u and %u of warp %u hold different %s (element (%d, %d): %g and %g); "
                          "here every lane holds the whole tile, so code that writes only some lanes' elements "
                          "depends on the GPU's unspecified mapping",
                          emu::cur_block->where().c_str(), w[j].op.name, w[j].op.file, w[j].op.line, first, j,
                          w[j].id / emu::WARP_SIZE, what, e / Frag::cols, e % Frag::cols, (double)(float)f.x[e],
                          (double)(float)g.x[e]);
    }
    return f;
}

template <typename Frag> void store_complete(emu::Lane *w, unsigned mask) {
    EMU_CHECKED; // the kernel's own access
    const emu::Collective &op = w[__builtin_ctz(mask)].op;
    const Frag &f = agreed_fragment<Frag>(w, mask, 0, "accumulators");
    for (int r = 0; r < Frag::rows; r++)
        for (int c = 0; c < Frag::cols; c++)
            element((typename Frag::element_type *)op.ptr, op.ldm, op.layout == mem_col_major, r, c) =
                f.x[r * Frag::cols + c];
}

template <typename FragD, typename FragA, typename FragB, typename FragC> void mma_complete(emu::Lane *w, unsigned mask) {
    EMU_CHECKED; // the fragments on the lanes' stacks
    const FragA &a = agreed_fragment<FragA>(w, mask, 0, "A fragments");
    const FragB &b = agreed_fragment<FragB>(w, mask, 1, "B fragments");
    const FragC &c = agreed_fragment<FragC>(w, mask, 2, "C fragments");
    // A and B widened to fp32 once (exactly), then a row of D at a time: each element still
    // sums its products over k in order, the row's elements side by side
    float af[FragA::num_elements], bf[FragB::num_elements], acc[FragD::cols];
    for (int e = 0; e < FragA::num_elements; e++) af[e] = (float)a.x[e];
    for (int e = 0; e < FragB::num_elements; e++) bf[e] = (float)b.x[e];
    FragD d;
    for (int i = 0; i < FragD::rows; i++) {
        for (int j = 0; j < FragD::cols; j++) acc[j] = (float)c.x[i * FragC::cols + j];
        for (int k = 0; k < FragA::cols; k++)
            for (int j = 0; j < FragD::cols; j++) acc[j] += af[i * FragA::cols + k] * bf[k * FragB::cols + j];
        for (int j = 0; j < FragD::cols; j++) d.x[i * FragD::cols + j] = acc[j];
    }
    copy_to_lanes(w, mask, d);
}

// ----------------------------------------------------------------------------
// the collectives

// waits at a wmma collective (the lane's record is bookkeeping, fiber.h)
inline void wmma_wait(const char *name, const char *file, int line, void (*complete)(emu::Lane *, unsigned),
                                  const void *ptr, unsigned ldm, int layout, const void *a, const void *b,
                                  const void *c, void *out) {
    EMU_BOOKKEEPING;
    emu::Collective &op = emu::collective(name, 0xffffffffu, file, line, complete);
    op.ptr = ptr;
    op.ldm = ldm;
    op.layout = layout;
    op.in[0] = a;
    op.in[1] = b;
    op.in[2] = c;
    op.out = out;
    emu::warp_collective();
}

// A or B, whose memory layout is part of its type
template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const T *p, unsigned ldm,
                      const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value,
                  "a matrix_a or matrix_b fragment names its layout");
    int layout = std::is_same<Layout, col_major>::value ? mem_col_major : mem_row_major;
    wmma_wait("wmma::load_matrix_sync", file, line, load_complete<fragment<Use, M, N, K, T, Layout>>, p, ldm, layout,
              nullptr, nullptr, nullptr, &f);
}
// the accumulator, whose memory layout is an argument
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const T *p, unsigned ldm, layout_t layout,
                      const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    wmma_wait("wmma::load_matrix_sync", file, line, load_complete<fragment<accumulator, M, N, K, T>>, p, ldm, layout,
              nullptr, nullptr, nullptr, &f);
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t layout,
                       const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    wmma_wait("wmma::store_matrix_sync", file, line, store_complete<fragment<accumulator, M, N, K, T>>, p, ldm, layout,
              &f, nullptr, nullptr, nullptr);
}

template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC, typename TD>
void mma_sync(fragment<accumulator, M, N, K, TD> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
              const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, TC> &c,
              const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    typedef fragment<accumulator, M, N, K, TD> FragD;
    typedef fragment<matrix_a, M, N, K, TA, LA> FragA;
    typedef fragment<matrix_b, M, N, K, TB, LB> FragB;
    typedef fragment<accumulator, M, N, K, TC> FragC;
    wmma_wait("wmma::mma_sync", file, line, mma_complete<FragD, FragA, FragB, FragC>, nullptr, 0, 0, &a, &b, &c, &d);
}

} // namespace wmma
} // namespace nvcuda
