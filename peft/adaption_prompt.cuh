// peft/adaption_prompt.cuh: llama_adapter's attention branch on the GPU, the twins of
// adaption_prompt_forward and adaption_prompt_backward in peft/adaption_prompt.h (which says
// the maths), with the same names and arguments (dev/cuda/adaption_prompt.cu checks
// them against it). Kp and Vp come from cuBLASLt in fp32; each query head is one
// warp, its A probabilities in shared memory, softmax in fp32 as peft's; the prompt
// is read in the compute type T (the bf16 copy of the masters, or the masters), the
// gate from the fp32 masters, and the prompt's and gate's gradients go to fp32.
#pragma once
#include "../support/cuda_common.cuh"
#include "../support/matmul.cuh"

constexpr int ADAPTION_WARPS = 4; // query heads per block, one warp each

// kpvp (2, A, KV) = Kp, Vp in fp32: the prompt (A, D) through the layer's k_proj and v_proj (KV, D)
template <typename T>
void adaption_kv(float *kpvp, const T *prompt, const T *wk, const T *wv, int A, int D, int KV, cudaStream_t stream) {
    matmul_forward(kpvp, prompt, wk, A, D, KV, 1.0f, 0, stream);
    matmul_forward(kpvp + (size_t)A * KV, prompt, wv, A, D, KV, 1.0f, 0, stream);
}

// p (A, shared) = softmax(q Kp_kv^T / sqrt(hd)) of one query head, by its warp: q (hd) its row,
// kp (A, KV) with the head's KV head at column kv0
template <typename T>
__device__ void adaption_probs(float *p, const T *q, const float *kp, int A, int KV, int kv0, int hd) {
    int lane = threadIdx.x % 32;
    float scale = 1.0f / sqrtf((float)hd), max = -INFINITY, sum = 0.0f;
    for (int j = 0; j < A; j++) {
        float s = 0.0f;
        for (int d = lane; d < hd; d += 32) s += to_float(q[d]) * kp[(size_t)j * KV + kv0 + d];
        s = warp_sum(s) * scale;
        if (lane == 0) p[j] = s;
        max = fmaxf(max, s);
    }
    __syncwarp();
    for (int j = 0; j < A; j++) sum += expf(p[j] - max);
    __syncwarp(); // every lane has read p before it is overwritten
    for (int j = lane; j < A; j += 32) p[j] = expf(p[j] - max) / sum;
    __syncwarp();
}

// one warp per query head (n, h): out = inp + g softmax(..) Vp
template <typename T>
__global__ void adaption_forward_kernel(T *out, const T *inp, const T *q, const float *gate, const float *kp,
                                        const float *vp, int N, int NH, int NKV, int hd, int A) {
    extern __shared__ float smem[]; // (ADAPTION_WARPS, A)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    size_t nh = (size_t)blockIdx.x * ADAPTION_WARPS + warp;
    if (nh >= (size_t)N * NH) return;
    int h = (int)(nh % NH), KV = NKV * hd, kv0 = h / (NH / NKV) * hd;
    size_t at = nh * hd; // row n's head h in (N, NH*hd)
    float *p = smem + (size_t)warp * A;
    adaption_probs(p, q + at, kp, A, KV, kv0, hd);
    for (int d = lane; d < hd; d += 32) {
        float z = 0.0f;
        for (int j = 0; j < A; j++) z += p[j] * vp[(size_t)j * KV + kv0 + d];
        out[at + d] = from_float<T>(to_float(inp[at + d]) + *gate * z);
    }
}

// out (N, NH*hd) = inp + g * softmax(q Kp^T / sqrt(hd)) Vp per head, q (N, NH*hd) after RoPE;
// prompt (A, D), wk, wv (NKV*hd, D); kpvp (2, A, NKV*hd) scratch
template <typename T>
void adaption_prompt_forward(T *out, const T *inp, const T *q, const T *prompt, const float *g, const T *wk, const T *wv,
                             float *kpvp, int N, int D, int NH, int NKV, int hd, int A, cudaStream_t stream) {
    int KV = NKV * hd;
    float *kp = kpvp, *vp = kpvp + (size_t)A * KV;
    adaption_kv(kpvp, prompt, wk, wv, A, D, KV, stream);
    adaption_forward_kernel<<<ceil_div((size_t)N * NH, ADAPTION_WARPS), ADAPTION_WARPS * 32,
                              ADAPTION_WARPS * A * sizeof(float), stream>>>(out, inp, q, g, kp, vp, N, NH, NKV, hd, A);
    cudaLaunchCheck();
}

// one warp per query head (n, h): gz (its share of the gate's gradient), dq += ds Kp, and the
// coefficients gp = g p and ds of dVp and dKp
template <typename T>
__global__ void adaption_backward_kernel(T *dq, float *gp, float *ds, float *gz, const T *dout, const T *q,
                                         const float *gate, const float *kp, const float *vp, int N, int NH, int NKV,
                                         int hd, int A) {
    extern __shared__ float smem[]; // (ADAPTION_WARPS, 2, A)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    size_t nh = (size_t)blockIdx.x * ADAPTION_WARPS + warp;
    if (nh >= (size_t)N * NH) return;
    int h = (int)(nh % NH), KV = NKV * hd, kv0 = h / (NH / NKV) * hd;
    size_t at = nh * hd, row = nh * A;
    float *p = smem + (size_t)warp * 2 * A, *dp = p + A, g = *gate, scale = 1.0f / sqrtf((float)hd);
    adaption_probs(p, q + at, kp, A, KV, kv0, hd);
    float share = 0.0f, pdp = 0.0f; // dout . sum_j p_j Vp_j, and sum_j p_j dp_j
    for (int j = 0; j < A; j++) {
        float dv = 0.0f;
        for (int d = lane; d < hd; d += 32) dv += to_float(dout[at + d]) * vp[(size_t)j * KV + kv0 + d];
        dv = warp_sum(dv);
        share += p[j] * dv;
        pdp += p[j] * g * dv;
        if (lane == 0) dp[j] = g * dv;
    }
    __syncwarp();
    for (int j = lane; j < A; j += 32) {
        ds[row + j] = p[j] * (dp[j] - pdp) * scale;
        gp[row + j] = g * p[j];
    }
    if (lane == 0) gz[nh] = share;
    __syncwarp();
    for (int d = lane; d < hd; d += 32) {
        float sum = 0.0f;
        for (int j = 0; j < A; j++) sum += ds[row + j] * kp[(size_t)j * KV + kv0 + d];
        dq[at + d] = from_float<T>(to_float(dq[at + d]) + sum);
    }
}

// one thread per (column c of NKV*hd, prompt row j): dKp^T[c, j] = sum over the queries of c's KV
// head's heads of ds_j q[c], dVp^T[c, j] of g p_j dout[c], in query order
template <typename T>
__global__ void adaption_dkv_kernel(T *dkt, T *dvt, const float *ds, const float *gp, const T *q, const T *dout, int N,
                                    int NH, int NKV, int hd, int A) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)NKV * hd * A) return;
    int c = (int)(i / A), j = (int)(i % A), kv = c / hd, d = c % hd, group = NH / NKV;
    float sk = 0.0f, sv = 0.0f;
    for (int n = 0; n < N; n++)
        for (int h = kv * group; h < (kv + 1) * group; h++) {
            size_t at = ((size_t)n * NH + h) * hd + d, row = ((size_t)n * NH + h) * A + j;
            sk += ds[row] * to_float(q[at]);
            sv += gp[row] * to_float(dout[at]);
        }
    dkt[i] = from_float<T>(sk);
    dvt[i] = from_float<T>(sv);
}

// *dgate += the sum of gz (n), by one block in a fixed order
__global__ void adaption_gate_kernel(float *dgate, const float *gz, size_t n) {
    float sum = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) sum += gz[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) *dgate += sum;
}

// Given dout (N, NH*hd), the gradient of the forward's out: dq (N, NH*hd) += the queries'
// (before RoPE's backward), dprompt (A, D) += the prompt's through k_proj and v_proj, and
// *dgate += the gate's. Scratch: kpvp (2, A, NKV*hd) Kp, Vp; dkv (2, NKV*hd, A) their
// gradients, transposed; coef (2, N, NH, A); gz (N, NH).
template <typename T>
void adaption_prompt_backward(T *dq, float *dprompt, float *dgate, const T *dout, const T *q, const T *prompt,
                              const float *g, const T *wk, const T *wv, float *kpvp, T *dkv, float *coef, float *gz,
                              int N, int D, int NH, int NKV, int hd, int A, cudaStream_t stream) {
    int KV = NKV * hd;
    size_t NA = (size_t)N * NH * A;
    float *kp = kpvp, *vp = kpvp + (size_t)A * KV, *gp = coef, *ds = coef + NA;
    T *dkt = dkv, *dvt = dkv + (size_t)A * KV;
    adaption_kv(kpvp, prompt, wk, wv, A, D, KV, stream);
    adaption_backward_kernel<<<ceil_div((size_t)N * NH, ADAPTION_WARPS), ADAPTION_WARPS * 32,
                               ADAPTION_WARPS * 2 * A * sizeof(float), stream>>>(dq, gp, ds, gz, dout, q, g, kp, vp, N,
                                                                                  NH, NKV, hd, A);
    cudaLaunchCheck();
    adaption_dkv_kernel<<<ceil_div((size_t)KV * A, 256), 256, 0, stream>>>(dkt, dvt, ds, gp, q, dout, N, NH, NKV, hd, A);
    cudaLaunchCheck();
    adaption_gate_kernel<<<1, 1024, 0, stream>>>(dgate, gz, (size_t)N * NH);
    cudaLaunchCheck();
    // dprompt (A, D) += dKp (A, KV) Wk + dVp Wv, as a weight gradient: dKp^T's columns are the prompt's rows
    matmul_backward((T *)NULL, dprompt, dkt, wk, (const T *)NULL, KV, D, A, 1.0f, stream);
    matmul_backward((T *)NULL, dprompt, dvt, wv, (const T *)NULL, KV, D, A, 1.0f, stream);
}
