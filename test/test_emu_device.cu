// The device side of the execution layer (dev/emu/) against CUDA's definitions:
// barriers, every shuffle variant and width, votes, support/cuda_common.cuh's
// block_sum, WMMA (bf16 and fp16) against a triple loop, bf16 and fp16 rounding
// against bit patterns worked out by hand (fp16 also against the CPU's F16C
// conversion where it has one), every launch check with its message, shuffled and threaded
// block orders, attention's tensor-core kernels against its SIMT ones (bf16, fp16), and
// layers.cuh's two-kernel global_sum.
// Built by rewrite.pl like any CUDA source; its kernels read host memory, and
// each launch runs at once (EMU_STREAMS=eager). The checkers
// that stop a program (divergent barriers, races, overflows) are shown by
// test/test_emu_checkers.sh on the programs in test/emu_planted/.
#include <chrono>
#include <string>
#include <vector>
#include <unistd.h>
#include "../attention.cuh"
#include "../layers.cuh"
#include "test_common.h"
#include "stderr_of.h"

typedef __nv_bfloat16 bf16;
#ifdef __F16C__
#include <immintrin.h>
#endif

// ----------------------------------------------------------------------------
// barriers

// every thread writes its slot, then reads its mirror's: without a real barrier
// thread 0 would read slot n - 1 before thread n - 1 wrote it (NaN)
__global__ void mirror_kernel(float *out, int rounds) {
    extern __shared__ __align__(16) float slots[];
    int t = threadIdx.x, n = blockDim.x;
    float v = (float)t;
    for (int r = 0; r < rounds; r++) {
        slots[t] = v;
        __syncthreads();
        v = slots[n - 1 - t] + 1.0f;
        __syncthreads(); // everyone has read before the next round writes
    }
    out[blockIdx.x * n + t] = v;
}

void test_barriers() {
    for (int n : {1, 32, 96, 1024}) {
        int rounds = 3, blocks = 2;
        std::vector<float> out(blocks * n, -1.0f);
        mirror_kernel<<<blocks, n, n * sizeof(float)>>>(out.data(), rounds);
        // after 3 rounds thread t holds (n - 1 - t) + 3
        bool ok = true;
        for (int b = 0; b < blocks; b++)
            for (int t = 0; t < n; t++) ok &= out[b * n + t] == (float)(n - 1 - t) + rounds;
        char what[64];
        snprintf(what, sizeof what, "__syncthreads orders shared memory (%d threads)", n);
        CHECK(ok && cudaGetLastError() == cudaSuccess, what, "thread 0 got %g, want %d", out[0], n - 1 + rounds);
    }
}

// ----------------------------------------------------------------------------
// shuffles and votes, against CUDA's definitions (programming guide, warp
// shuffle functions): lanes form segments of `width`; __shfl_sync reads lane
// srcLane % width of the caller's segment; up/down read lane +- delta when it is
// in the segment, else the caller's own value; xor reads lane ^ laneMask unless
// that is in a later segment (then its own value)

enum { IDX, UP, DOWN, XOR };

template <typename T> __global__ void shfl_kernel(T *out, int kind, int arg, int width) {
    int lane = threadIdx.x;
    T v = (T)(100 * lane + 7);
    T r = kind == IDX ? __shfl_sync(0xffffffff, v, arg, width)
        : kind == UP  ? __shfl_up_sync(0xffffffff, v, arg, width)
        : kind == DOWN ? __shfl_down_sync(0xffffffff, v, arg, width)
                       : __shfl_xor_sync(0xffffffff, v, arg, width);
    out[lane] = r;
}

int expected_source(int kind, int lane, int arg, int width) {
    int seg = lane / width, pos = lane % width;
    switch (kind) {
    case IDX: return seg * width + arg % width;
    case UP: return pos >= arg ? lane - arg : lane;
    case DOWN: return pos + arg < width ? lane + arg : lane;
    default: return (lane ^ arg) / width > seg ? lane : (lane ^ arg);
    }
}

template <typename T> void test_shuffles(const char *type) {
    const char *names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
    for (int kind = IDX; kind <= XOR; kind++) {
        int bad = 0, cases = 0;
        char detail[160] = "";
        for (int width = 1; width <= 32; width *= 2)
            for (int arg : {0, 1, 2, 3, 5, 8, 16, 31, 33}) {
                std::vector<T> out(32);
                shfl_kernel<<<1, 32>>>(out.data(), kind, arg, width); // T deduced, as CUDA does
                for (int lane = 0; lane < 32; lane++, cases++) {
                    float want = (float)(100 * expected_source(kind, lane, arg, width) + 7);
                    if ((float)out[lane] != want && !bad++)
                        snprintf(detail, sizeof detail, "width %d arg %d lane %d: got %g, want %g", width, arg, lane,
                                 (float)out[lane], want);
                }
            }
        char what[96];
        snprintf(what, sizeof what, "%s (%s) for every width and argument", names[kind], type);
        CHECK(bad == 0, what, "%d of %d lanes wrong, first %s", bad, cases, detail);
    }
}

// lanes 0-15 shuffle among themselves while 16-31 vote: two collectives of one warp
__global__ void partial_mask_kernel(int *out) {
    int lane = threadIdx.x;
    if (lane < 16) out[lane] = __shfl_xor_sync(0x0000ffff, lane, 1);
    else out[lane] = (int)__ballot_sync(0xffff0000, lane % 3 == 0);
    out[32 + lane] = __any_sync(0xffffffff, lane == 7) + 2 * __all_sync(0xffffffff, lane < 32) +
                     4 * __all_sync(0xffffffff, lane < 31);
}

void test_votes_and_masks() {
    std::vector<int> out(64);
    partial_mask_kernel<<<1, 32>>>(out.data());
    unsigned ballot = 0;
    for (int l = 16; l < 32; l++)
        if (l % 3 == 0) ballot |= 1u << l;
    bool ok = true;
    for (int l = 0; l < 32; l++) ok &= out[l] == (l < 16 ? l ^ 1 : (int)ballot) && out[32 + l] == 3;
    CHECK(ok, "partial masks: two collectives at once in one warp; __ballot_sync, __any_sync, __all_sync",
          "lane 0 %d, lane 16 %d (want %d), vote %d (want 3)", out[0], out[16], (int)ballot, out[32]);
}

// ----------------------------------------------------------------------------
// support/cuda_common.cuh's block_sum: every thread gets the block's sum

template <typename T> __global__ void block_sum_kernel(T *out, const T *x) {
    T s = block_sum(x[blockIdx.x * blockDim.x + threadIdx.x]);
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <typename T> void test_block_sum(const char *type) {
    for (int n : {32, 64, 480, 1024}) {
        int blocks = 3;
        std::vector<T> x(blocks * n), out(blocks * n);
        for (int i = 0; i < blocks * n; i++) x[i] = (T)(i % 7 - 3); // small integers: every sum exact
        block_sum_kernel<T><<<blocks, n>>>(out.data(), x.data());
        bool ok = true;
        for (int b = 0; b < blocks; b++) {
            double want = 0;
            for (int t = 0; t < n; t++) want += (double)x[b * n + t];
            for (int t = 0; t < n; t++) ok &= (double)out[b * n + t] == want;
        }
        char what[80];
        snprintf(what, sizeof what, "block_sum<%s> over %d threads, every thread", type, n);
        CHECK(ok, what, "block 0 thread 0 got %g", (double)out[0]);
    }
}

// __shared__ in a __device__ template function, two declarators in one statement,
// a 2-D launch whose configuration and arguments span lines
template <typename T, int N> __device__ T tile_sum(T v) {
    __shared__ T part[N], spare[2];
    part[threadIdx.y * blockDim.x + threadIdx.x] = v;
    if (threadIdx.x == 0 && threadIdx.y == 0) spare[0] = spare[1] = (T)0;
    __syncthreads();
    T s = spare[0] + spare[1];
    for (int i = 0; i < N; i++) s += part[i];
    return s;
}
template <typename T, int N> __global__ void tile_sum_kernel(T *out) {
    out[threadIdx.y * blockDim.x + threadIdx.x] = tile_sum<T, N>((T)(threadIdx.x + 10 * threadIdx.y));
}

void test_shared_declarations() {
    std::vector<int> out(8 * 4);
    tile_sum_kernel<int, 32><<<dim3(1, 1),
                               dim3(8, 4)>>>(
        out.data());
    int want = 0;
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 8; x++) want += x + 10 * y;
    bool ok = true;
    for (int v : out) ok &= v == want;
    CHECK(ok, "__shared__ in a __device__ template, several declarators, a 2-D block", "got %d, want %d", out[0], want);
}

// ----------------------------------------------------------------------------
// wmma against a triple loop

namespace wmma = nvcuda::wmma;

// D = A B + C, A (16, 16) at a with leading dim lda, B at b (col_major: B^T is
// stored), C loaded and D stored with the given layouts and leading dimension
template <typename E, typename LayoutB>
__global__ void wmma_kernel(float *d, const E *a, int lda, const E *b, int ldb, const float *c, int ldc,
                            int c_col_major, int d_col_major) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, E, LayoutB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a, lda);
    wmma::load_matrix_sync(fb, b, ldb);
    wmma::load_matrix_sync(fc, c, ldc, c_col_major ? wmma::mem_col_major : wmma::mem_row_major);
    for (int i = 0; i < fc.num_elements; i++) fc.x[i] *= 2.0f; // uniform over the elements: portable
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, ldc, d_col_major ? wmma::mem_col_major : wmma::mem_row_major);
}

template <typename E, typename LayoutB> void test_wmma_case(bool b_col, bool c_col, bool d_col, bool exact) {
    int lda = 24, ldb = 20, ldc = 18; // padded rows
    std::vector<E> a(16 * lda), b(16 * ldb);
    std::vector<float> c(16 * ldc), d(16 * ldc, NAN);
    std::vector<double> A(256), B(256), C(256);
    uint64_t rng = 12345;
    auto value = [&](int range) { // small integers (exact sums) or values of magnitude < 2 (rounded to E)
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int r = (int)(rng >> 40);
        return exact ? (float)(r % (2 * range + 1) - range) : (float)(r % 2000 - 1000) / 500.0f;
    };
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            E av = from_float<E>(value(4)), bv = from_float<E>(value(4));
            a[i * lda + j] = av;
            A[i * 16 + j] = (float)av;
            (b_col ? b[j * ldb + i] : b[i * ldb + j]) = bv; // B (k = i, n = j)
            B[i * 16 + j] = (float)bv;
            float cv = value(8);
            (c_col ? c[j * ldc + i] : c[i * ldc + j]) = cv;
            C[i * 16 + j] = cv;
        }
    wmma_kernel<E, LayoutB><<<1, 32>>>(d.data(), a.data(), lda, b.data(), ldb, c.data(), ldc, c_col, d_col);
    double max_err = 0, scale = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double want = 2 * C[i * 16 + j], mag = fabs(want);
            for (int k = 0; k < 16; k++) {
                want += A[i * 16 + k] * B[k * 16 + j];
                mag += fabs(A[i * 16 + k] * B[k * 16 + j]);
            }
            double got = d_col ? d[j * ldc + i] : d[i * ldc + j];
            max_err = std::max(max_err, fabs(got - want) / std::max(mag, 1e-30));
            scale = std::max(scale, mag);
        }
    // exact: integers below 2^24, so any order of fp32 sums is exact; random: 17
    // terms summed in fp32 (a product of two bf16 or two fp16 values is exact in
    // fp32: 8 + 8 or 11 + 11 significant bits), each add rounding by at most 2^-24
    // of the running magnitude
    double tol = exact ? 0 : 17 * 0x1p-24;
    char what[128];
    snprintf(what, sizeof what, "wmma::mma_sync = triple loop (%s, B %s, C %s, D %s, %s values)",
             std::is_same<E, bf16>::value ? "bf16" : "fp16", b_col ? "col" : "row", c_col ? "col" : "row",
             d_col ? "col" : "row", exact ? "integer" : "random");
    CHECK(max_err <= tol, what, "max error %.3g of the sum of |terms| (tol %.3g)", max_err, tol);
}

template <typename E> void test_wmma() {
    test_wmma_case<E, wmma::row_major>(false, false, false, true);
    test_wmma_case<E, wmma::col_major>(true, false, true, true);
    test_wmma_case<E, wmma::row_major>(false, true, false, true);
    test_wmma_case<E, wmma::col_major>(true, true, true, false);
}

// ----------------------------------------------------------------------------
// bf16 conversions, against bit patterns worked out by hand

// a float's bits, the 16-bit type's bits it must round to, and why
struct RoundCase { uint32_t f; uint16_t h; const char *why; };

// each case through both of a 16-bit type's conversions (name: the first's)
template <typename H, size_t N>
void check_rounding(const RoundCase (&cases)[N], H (*convert)(float), H (*convert_rn)(float), const char *name) {
    for (const RoundCase &c : cases) {
        float f;
        memcpy(&f, &c.f, 4);
        H h = convert(f), h_rn = convert_rn(f);
        char what[160];
        snprintf(what, sizeof what, "%s(0x%08X) = 0x%04X: %s", name, c.f, c.h, c.why);
        CHECK(h.__x == c.h && h_rn.__x == c.h, what, "got 0x%04X (_rn 0x%04X)", h.__x, h_rn.__x);
    }
}

void test_bf16() {
    const RoundCase cases[] = {
        {0x3F800000, 0x3F80, "1.0"},
        {0x3F808000, 0x3F80, "1 + 2^-8: a tie, to the even 0x3F80"},
        {0x3F818000, 0x3F82, "a tie above an odd value goes up to the even 0x3F82"},
        {0x3F808001, 0x3F81, "just above halfway rounds up"},
        {0x3F807FFF, 0x3F80, "just below halfway rounds down"},
        {0xBF818000, 0xBF82, "negative ties to even too"},
        {0x80000000, 0x8000, "-0 stays -0"},
        {0x00000001, 0x0000, "the smallest subnormal rounds to 0"},
        {0x00008000, 0x0000, "a subnormal tie, to the even 0"},
        {0x00018000, 0x0002, "a subnormal tie above an odd value, up"},
        {0x00010000, 0x0001, "a subnormal bf16 holds exactly (no flush to zero)"},
        {0x807FFFFF, 0x8080, "the largest negative subnormal rounds to -FLT_MIN"},
        {0x7F7F7FFF, 0x7F7F, "below halfway under the largest bf16 stays finite"},
        {0x7F7F8000, 0x7F80, "the largest float's tie rounds to even: infinity"},
        {0x7F7FFFFF, 0x7F80, "FLT_MAX overflows to infinity"},
        {0xFF7FFFFF, 0xFF80, "-FLT_MAX overflows to -infinity"},
        {0x7F800000, 0x7F80, "infinity"},
        {0xFF800000, 0xFF80, "-infinity"},
        {0x7FC00000, 0x7FFF, "a quiet NaN: the canonical NaN"},
        {0x7F800001, 0x7FFF, "a NaN whose payload is in the low bits: still a NaN, not infinity"},
        {0xFFC00001, 0x7FFF, "a negative NaN: the canonical NaN"},
    };
    check_rounding(cases, __float2bfloat16, __float2bfloat16_rn, "__float2bfloat16");
    bf16 h;
    h.__x = 0xC0A1;
    float back = __bfloat162float(h);
    uint32_t bits;
    memcpy(&bits, &back, 4);
    CHECK(bits == 0xC0A10000, "__bfloat162float(0xC0A1) = 0xC0A10000", "got 0x%08X", bits);
    static_assert(std::is_trivially_default_constructible<bf16>::value && sizeof(bf16) == 2, "bf16 as CUDA's");
}

// ----------------------------------------------------------------------------
// fp16 conversions (cuda_fp16.h), against bit patterns worked out by hand: 1
// sign, 5 exponent bits (bias 15), 10 fraction bits; the largest finite 65504
// (0x7BFF), the smallest normal 2^-14 (0x0400), the smallest subnormal 2^-24 (0x0001)

void test_fp16() {
    const RoundCase cases[] = {
        {0x3F800000, 0x3C00, "1.0"},
        {0x3F801000, 0x3C00, "1 + 2^-11: a tie, to the even 0x3C00"},
        {0x3F803000, 0x3C02, "1 + 3 * 2^-11: a tie above an odd value goes up to the even 0x3C02"},
        {0x3F801001, 0x3C01, "just above halfway rounds up"},
        {0x3F800FFF, 0x3C00, "just below halfway rounds down"},
        {0xBF803000, 0xBC02, "negative ties to even too"},
        {0x3FFFF000, 0x4000, "a carry out of the fraction moves up a binade (1.99951171875 -> 2)"},
        {0x80000000, 0x8000, "-0 stays -0"},
        {0x477FE000, 0x7BFF, "65504, the largest fp16"},
        {0x477FEFFF, 0x7BFF, "just below 65520 (halfway to 2^16) stays 65504"},
        {0x477FF000, 0x7C00, "65520, the tie past the largest, to even: infinity"},
        {0x7F7FFFFF, 0x7C00, "FLT_MAX overflows to infinity"},
        {0xC7800000, 0xFC00, "-65536 overflows to -infinity"},
        {0x38800000, 0x0400, "2^-14, the smallest normal"},
        {0x387FC000, 0x03FF, "2^-14 - 2^-24, the largest subnormal"},
        {0x387FE000, 0x0400, "halfway between the largest subnormal and 2^-14: to the even 0x0400"},
        {0x33800000, 0x0001, "2^-24, the smallest subnormal"},
        {0x33C00000, 0x0002, "1.5 * 2^-24: a tie, to the even 0x0002"},
        {0x34200000, 0x0002, "2.5 * 2^-24: a tie, to the even 0x0002"},
        {0x33000000, 0x0000, "2^-25: a tie between 0 and 2^-24, to the even 0"},
        {0x33000001, 0x0001, "just above 2^-25 rounds up to 2^-24"},
        {0xB3000001, 0x8001, "negative: just below -2^-25 rounds to -2^-24"},
        {0x32FFFFFF, 0x0000, "just below 2^-25: 0"},
        {0x00000001, 0x0000, "an fp32 subnormal: 0"},
        {0x7F800000, 0x7C00, "infinity"},
        {0xFF800000, 0xFC00, "-infinity"},
        {0x7FC00000, 0x7FFF, "a quiet NaN: the canonical NaN"},
        {0x7F800001, 0x7FFF, "a NaN whose payload is in the low bits: still a NaN, not infinity"},
        {0xFFC00001, 0x7FFF, "a negative NaN: the canonical NaN"},
    };
    check_rounding(cases, __float2half, __float2half_rn, "__float2half");
    // every fp16 back to fp32 exactly: (-1)^s 2^(e - 15) (1 + m / 1024), subnormals m 2^-24
    int wrong = 0;
    for (uint32_t x = 0; x < 0x10000; x++) {
        __half h;
        h.__x = (uint16_t)x;
        uint32_t e = (x >> 10) & 31, m = x & 1023;
        double want = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1.0 + m / 1024.0, (int)e - 15) : ldexp((double)m, -24);
        want = (x & 0x8000) ? -want : want;
        float got = __half2float(h);
        wrong += !(got == want || (std::isnan(got) && std::isnan(want)));
    }
    CHECK(wrong == 0, "__half2float: all 65536 fp16 values exactly", "%d wrong", wrong);
    static_assert(std::is_trivially_default_constructible<__half>::value && sizeof(__half) == 2, "fp16 as CUDA's");
#ifdef __F16C__
    // The CPU's own conversion (F16C's vcvtps2ph, round to nearest even) on every sign, exponent
    // and top 10 fraction bits, each with the low 13 bits (those rounded away for a normal
    // result) at 0, 1, just below, at and just above halfway, and all ones, plus random ones
    long n = 0, differ = 0;
    uint32_t first = 0, rng = 2463534242u;
    const uint32_t lows[] = {0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF};
    for (uint32_t hi = 0; hi < (1u << 19); hi++)
        for (int k = 0; k < 8; k++) {
            rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
            uint32_t u = hi << 13 | (k < 6 ? lows[k] : rng & 0x1FFF);
            float f;
            memcpy(&f, &u, 4);
            if (std::isnan(f)) continue; // F16C keeps a NaN's payload; CUDA gives 0x7FFF (above)
            uint16_t want = (uint16_t)_cvtss_sh(f, 0);
            n++;
            if (__float2half_rn(f).__x != want && !differ++) first = u;
        }
    CHECK(differ == 0, "__float2half_rn = the CPU's F16C conversion", "%ld of %ld differ, the first 0x%08X", differ, n, first);
#else
    test_skip("__float2half_rn = the CPU's F16C conversion", "this CPU (or build) has no F16C");
#endif
}

// ----------------------------------------------------------------------------
// launch checks: each fails with cudaErrorInvalidConfiguration, does not run, and
// says which kernel and which limit

__global__ void count_kernel(int *count) { // counts launches that ran
    if (threadIdx.x + threadIdx.y + threadIdx.z + blockIdx.x + blockIdx.y + blockIdx.z == 0) (*count)++;
}
__global__ void smem_kernel(int *count, size_t bytes) {
    extern __shared__ unsigned char smem_bytes[];
    if (threadIdx.x == 0) {
        smem_bytes[0] = smem_bytes[bytes - 1] = 1; // the first and last byte exist
        (*count)++;
    }
}

void expect_refused(const char *what, const char *message_part, void (*launch)(int *)) {
    int count = 0;
    std::string err = stderr_of([&] { launch(&count); });
    cudaError_t e = cudaGetLastError();
    bool named = err.find("count_kernel") != std::string::npos || err.find("smem_kernel") != std::string::npos;
    CHECK(e == cudaErrorInvalidConfiguration && count == 0 && named && err.find(message_part) != std::string::npos,
          what, "error %d, ran %d times, message: %s", (int)e, count, err.c_str());
}

void test_launch_checks() {
    expect_refused("an empty grid is refused", "gridDim (0, 1, 1) is empty", [](int *c) { count_kernel<<<0, 32>>>(c); });
    expect_refused("an empty block is refused", "blockDim (32, 0, 1) is empty",
                   [](int *c) { count_kernel<<<1, dim3(32, 0)>>>(c); });
    expect_refused("blockDim.x 1025 is refused", "exceeds the limits (1024, 1024, 64)",
                   [](int *c) { count_kernel<<<1, 1025>>>(c); });
    expect_refused("blockDim.z 65 is refused", "exceeds the limits (1024, 1024, 64)",
                   [](int *c) { count_kernel<<<1, dim3(1, 1, 65)>>>(c); });
    expect_refused("32 x 33 threads are refused", "1056 threads, more than 1024",
                   [](int *c) { count_kernel<<<1, dim3(32, 33)>>>(c); });
    expect_refused("gridDim.y 65536 is refused", "exceeds the limits (2147483647, 65535, 65535)",
                   [](int *c) { count_kernel<<<dim3(1, 65536), 32>>>(c); });
    expect_refused("gridDim.z 65536 is refused", "exceeds the limits (2147483647, 65535, 65535)",
                   [](int *c) { count_kernel<<<dim3(1, 1, 65536), 32>>>(c); });
    expect_refused("gridDim.x 2^31 is refused", "exceeds the limits (2147483647, 65535, 65535)",
                   [](int *c) { count_kernel<<<dim3(2147483648u), 32>>>(c); });
    expect_refused("48 KiB + 1 of dynamic shared memory without cudaFuncSetAttribute is refused",
                   "49153 bytes of dynamic shared memory, more than its limit of 49152",
                   [](int *c) { smem_kernel<<<1, 32, 48 * 1024 + 1>>>(c, 48 * 1024 + 1); });

    // what is allowed runs: the largest block shapes, exactly 48 KiB, and 227 KiB after raising the limit
    int count = 0;
    count_kernel<<<2, 1024>>>(&count);
    count_kernel<<<1, dim3(1, 1024)>>>(&count);
    count_kernel<<<1, dim3(1, 1, 64)>>>(&count);
    smem_kernel<<<1, 32, 48 * 1024>>>(&count, 48 * 1024);
    cudaError_t set_ok = cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
    smem_kernel<<<1, 32, 227 * 1024>>>(&count, 227 * 1024);
    CHECK(count == 5 && set_ok == cudaSuccess && cudaGetLastError() == cudaSuccess,
          "launches at the limits run (1024 threads, blockDim.z 64, 48 KiB, 227 KiB after cudaFuncSetAttribute)",
          "ran %d of 5", count);

    cudaError_t too_much = cudaSuccess;
    std::string err = stderr_of([&] {
        too_much = cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 + 1);
    });
    CHECK(too_much == cudaErrorInvalidValue && cudaGetLastError() == cudaErrorInvalidValue &&
              err.find("smem_kernel") != std::string::npos && err.find("232448") != std::string::npos,
          "cudaFuncSetAttribute above sm_90's 227 KiB is refused, naming the kernel", "error %d: %s", (int)too_much,
          err.c_str());
    expect_refused("227 KiB + 1 of dynamic shared memory is refused after raising the limit to 227 KiB",
                   "232449 bytes of dynamic shared memory, more than its limit of 232448",
                   [](int *c) { smem_kernel<<<1, 32, 227 * 1024 + 1>>>(c, 227 * 1024 + 1); });
}

// ----------------------------------------------------------------------------
// block order: shuffled and on several OS threads, a correct kernel gives the same result

__global__ void order_kernel(float *out, int *order, std::atomic<int> *next) {
    // each block records when it ran (a host atomic: the emulator's order, which no real kernel may observe)
    if (threadIdx.x == 0) order[blockIdx.y * gridDim.x + blockIdx.x] = next->fetch_add(1);
    float v = block_sum((float)(threadIdx.x + blockIdx.x * 3 + blockIdx.y));
    if (threadIdx.x == 0) out[blockIdx.y * gridDim.x + blockIdx.x] = v;
}

void test_block_order() {
    dim3 grid(16, 4);
    int n = 64;
    auto run = [&](bool shuffle, unsigned threads, std::vector<int> *order) {
        emu::Settings saved = emu::settings;
        emu::settings.shuffle = shuffle;
        emu::settings.seed = 17;
        emu::settings.threads = threads;
        std::vector<float> out(grid.x * grid.y);
        std::vector<int> ord(grid.x * grid.y);
        std::atomic<int> next{0};
        order_kernel<<<grid, n>>>(out.data(), ord.data(), &next);
        emu::settings = saved;
        if (order) *order = ord;
        return out;
    };
    std::vector<int> in_order, shuffled;
    std::vector<float> a = run(false, 1, &in_order), b = run(true, 1, &shuffled), c = run(true, 2, nullptr);
    bool identity = true, permuted = false;
    for (size_t i = 0; i < in_order.size(); i++) {
        identity &= in_order[i] == (int)i;
        permuted |= shuffled[i] != (int)i;
    }
    CHECK(identity && permuted, "EMU_SHUFFLE runs the blocks in another order", "in order %d, shuffled %d",
          (int)identity, (int)permuted);
    CHECK(a == b && a == c, "a correct kernel gives the same result in grid order, shuffled, and on 2 OS threads",
          "block 5: %g %g %g", a[5], b[5], c[5]);
}

// ----------------------------------------------------------------------------
// attention.cuh: the tensor-core kernels against the SIMT ones (bf16, hd 64)

template <typename E> void test_attention_tc(double tol) {
    int B = 1, T = 80, NH = 2, NKV = 1, hd = 64;
    for (int t0 : {0, 13}) {
        int len = T - t0;
        Chunk ch = {B, T, t0, len, 0, 0};
        size_t nq = (size_t)B * len * NH * hd, nkv = (size_t)B * T * NKV * hd;
        uint64_t rng = 99 + t0;
        auto fill = [&](std::vector<E> &x, float scale) {
            for (E &v : x) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                v = from_float<E>(scale * ((float)(rng >> 40) / 16777216.0f * 2 - 1));
            }
        };
        std::vector<E> q(nq), k(nkv), v(nkv), dout(nq);
        fill(q, 2), fill(k, 2), fill(v, 1), fill(dout, 1);
        std::vector<float> out_f[2], dq_f[2], dk_f[2], dv_f[2];
        for (int tc = 0; tc < 2; tc++) {
            attention_force_simt = !tc;
            std::vector<E> out(nq), dq(nq), dk(nkv, from_float<E>(0)), dv(nkv, from_float<E>(0));
            std::vector<float> lse((size_t)B * NH * len);
            attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), &ch, NH, NKV, hd, 0);
            attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                               v.data(), &ch, NH, NKV, hd, 0);
            auto f = [](const std::vector<E> &x) { return std::vector<float>(x.begin(), x.end()); };
            out_f[tc] = f(out), dq_f[tc] = f(dq), dk_f[tc] = f(dk), dv_f[tc] = f(dv);
        }
        attention_force_simt = false;
        // P and dS are rounded to E for the tensor-core products (and every output to E at
        // the end): dev/cuda/attention.cu's tolerance against the CPU (bf16 2e-2, fp16 3e-3)
        auto rel = [](const std::vector<float> &a, const std::vector<float> &b) -> double {
            double err = 0, scale = 0;
            for (size_t i = 0; i < a.size(); i++) {
                if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
                err = std::max(err, (double)fabsf(a[i] - b[i]));
                scale = std::max(scale, (double)fabsf(b[i]));
            }
            return err / scale;
        };
        double e[4] = {rel(out_f[1], out_f[0]), rel(dq_f[1], dq_f[0]), rel(dk_f[1], dk_f[0]), rel(dv_f[1], dv_f[0])};
        char what[120];
        snprintf(what, sizeof what, "attention tensor-core kernels = SIMT kernels (%s, T=%d t0=%d NH=%d NKV=%d hd=%d)",
                 std::is_same<E, bf16>::value ? "bf16" : "fp16", T, t0, NH, NKV, hd);
        CHECK(e[0] <= tol && e[1] <= tol && e[2] <= tol && e[3] <= tol, what,
              "relative error out %.2e dq %.2e dk %.2e dv %.2e (tol %.0e)", e[0], e[1], e[2], e[3], tol);
    }
}

// layers.cuh's global_sum: 512 blocks' partial sums in a __device__ array, then one
// block adds them (block_sum in fp64), against the same sum in fp64 here
void test_global_sum() {
    size_t n = 100003;
    std::vector<float> x(n);
    double want = 0;
    for (size_t i = 0; i < n; i++) want += x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.25f;
    double got = 0;
    global_sum(&got, x.data(), n, 0);
    // both sum fp64 values of fp32 inputs, in different orders: ~n * 2^-53 relative
    CHECK(fabs(got - want) <= 1e-9 * fabs(want), "layers.cuh global_sum = an fp64 sum (two launches, a __device__ array)",
          "got %.17g, want %.17g", got, want);
    // a launch whose template arguments are deduced (accumulate_kernel<bf16>): 1 + 2^-8 rounds to even
    std::vector<bf16> a(1000, __float2bfloat16(1.0f)), b(1000, __float2bfloat16(0x1p-8f));
    accumulate(a.data(), b.data(), a.size(), 0);
    bool ok = true;
    for (bf16 v : a) ok &= v.__x == 0x3F80;
    CHECK(ok, "layers.cuh accumulate<bf16> (a launch that deduces its template arguments)", "a[0] = 0x%04X", a[0].__x);
}

// ----------------------------------------------------------------------------
// costs (printed, not checked): a fiber switch and an empty block

__global__ void empty_kernel() {}
__global__ void barriers_kernel(int n) {
    for (int i = 0; i < n; i++) __syncthreads();
}

void report_costs() {
    auto seconds = [](auto f) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    double empty = seconds([] { empty_kernel<<<200, 256>>>(); }) / 200;
    // 2 threads, 20000 barriers: each thread switches out and in once a barrier
    double sw = seconds([] { barriers_kernel<<<1, 2>>>(20000); }) / (20000 * 2);
    printf("# emu costs: an empty 256-thread block %.1f us, a barrier wait (one switch out, one in) %.0f ns\n",
           empty * 1e6, sw * 1e9);
}

int main() {
    setenv("EMU_STREAMS", "eager", 1); // kernels here read host memory, right after their launch
    auto t0 = std::chrono::steady_clock::now();
    test_barriers();
    test_shuffles<int>("int");
    test_shuffles<float>("float");
    test_shuffles<double>("double");
    test_votes_and_masks();
    test_block_sum<float>("float");
    test_block_sum<double>("double");
    test_shared_declarations();
    test_wmma<bf16>();
    test_wmma<__half>();
    test_bf16();
    test_fp16();
    test_launch_checks();
    test_block_order();
    test_attention_tc<bf16>(2e-2);
    test_attention_tc<__half>(3e-3);
    test_global_sum();
    report_costs();
    printf("# test_emu_device: %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return test_summary();
}
