// support/act_offload.cuh: --activation_offloading's host side of the CUDA trainer (docs/long_context.md
// "Activation offloading: the layer-major schedule"): the layers' inputs over the whole sequence,
// every K-th one's (--offload_every K) in pinned host memory (ckpt) and the K - 1 inside its group
// on the GPU (group_in), each chunk's block copied up into the chunk's input slot a chunk ahead of
// its use, and each layer's output down, on a stream of their own (act_stream), ordered with the
// compute by one event a slot. The schedule is train_llama2.cu's
// (layer_major_forward_backward); the plan's lines for it are activation_offload_plan's.
//
// Not a header on its own: train_llama2.cu includes it after its Model and the Model's layout,
// whose names it uses (layer_in, resid_slot, stream_after, PLAN_PCIE_GBS), as offload.cuh does.
#pragma once

// the bytes of a whole sequence's residual (B, T, D) in the compute type: one layer's input
static size_t resid_bytes(const Model *m) {
    return (size_t)m->B * m->T * m->host.config.dim * (m->fp32 ? sizeof(float) : sizeof(bf16));
}
// whether layer l's input (l = L: the head's) is kept in host memory: layers 0, K, 2K, ... and the head's
static bool input_kept(const Model *m, int l) { return l % m->offload_every == 0 || l == m->host.config.n_layers; }
// the inputs kept in host memory, ceil(L / K) + 1: ckpt's (layer l's at ceil(l / K))
static int inputs_kept(const Model *m) { return (m->host.config.n_layers + m->offload_every - 1) / m->offload_every + 1; }
// whether the backward re-runs the forward of layer l's group before layer l's: l the top of a
// group of K > 1 below the last group (whose inner inputs are still in group_in from the forward)
static bool group_rerun(const Model *m, int l) {
    return m->offload_every > 1 && (l + 1) % m->offload_every == 0 && l + 1 < m->host.config.n_layers;
}
// chunk ch's block (B, len, D) of layer l's input where it is kept: its place in ckpt (host
// memory), or inside a group group_in[l % K - 1] (the GPU), which the group's forward fills
template <typename floatX> floatX *input_block(Model *m, const Chunk *ch, int l) {
    int K = m->offload_every;
    size_t seq = (size_t)m->B * m->T * m->host.config.dim;
    floatX *x = input_kept(m, l) ? (floatX *)m->ckpt + (size_t)((l + K - 1) / K) * seq : buffers<floatX>(m).group_in + (size_t)(l % K - 1) * seq;
    return x + (size_t)ch->B * ch->t0 * m->host.config.dim;
}

// ckpt (pinned, so that its copies run in stream order beside the compute), the stream and the
// slots' events (each recorded once: a slot's first wait waits for nothing). Pinning can fail
// where host memory is short or locked memory is limited: said, with how much.
static void act_offload_alloc(Model *m) {
    size_t bytes = (size_t)inputs_kept(m) * resid_bytes(m);
    cudaError_t err = cudaMallocHost(&m->ckpt, bytes);
    if (err != cudaSuccess)
        die("--activation_offloading: cannot pin %.2f GiB of host memory for %d layers' inputs (%s): the host memory plan "
            "says what the run needs beside it; free memory, raise the locked-memory limit (ulimit -l), or keep fewer "
            "(--offload_every)", bytes / 1073741824.0, inputs_kept(m), cudaGetErrorString(err));
    cudaCheck(cudaStreamCreateWithFlags(&m->act_stream, cudaStreamNonBlocking));
    profile_track(m->act_stream, "activations stream");
    for (cudaEvent_t &e : m->act_moved) {
        cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(e, m->act_stream));
    }
    if (getenv("LLAMA2TUNE_OFFLOAD_LOG")) fprintf(stderr, "activation offload: %zu bytes pinned\n", bytes);
}
static void act_offload_free(Model *m) {
    if (!m->ckpt) return;
    cudaCheck(cudaFreeHost(m->ckpt));
    cudaCheck(cudaStreamDestroy(m->act_stream));
    for (cudaEvent_t e : m->act_moved) cudaCheck(cudaEventDestroy(e));
}

// Chunk j's block of layer l's input up into its input slot (from the host, or within the GPU),
// once the compute enqueued so far (which holds the slot's last reads, two chunks back) is done;
// act_wait has the compute wait for it.
template <typename floatX> void act_up(Model *m, ChunkActs<floatX> *s, int j, int l) {
    Chunk ch = rows_chunk(&m->rows, j, 1);
    int e = j % 2;
    stream_after(m->act_stream, m->stream, m->computed);
    PROF_BEGIN(m->act_stream, "activations up", l, j, -1);
    cudaCheck(cudaMemcpyAsync(resid_slot(m, s, &ch, 0), input_block<floatX>(m, &ch, l), (size_t)ch.B * ch.len * m->host.config.dim * sizeof(floatX),
                              input_kept(m, l) ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice, m->act_stream));
    PROF_END(m->act_stream);
    cudaCheck(cudaEventRecord(m->act_moved[e], m->act_stream));
}
// The chunk's resid slot i + its parity (0: an input, 2: an output) down to its block of layer
// l's input (input_block), once computed; the slot's next writer waits for it (act_wait).
template <typename floatX> void act_down(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int i, int l) {
    int e = i + ch->t0 / m->rows.len % 2;
    stream_after(m->act_stream, m->stream, m->computed);
    PROF_BEGIN(m->act_stream, "activations down", l, ch->t0 / m->rows.len, -1);
    cudaCheck(cudaMemcpyAsync(input_block<floatX>(m, ch, l), resid_slot(m, s, ch, i), (size_t)ch->B * ch->len * m->host.config.dim * sizeof(floatX),
                              input_kept(m, l) ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice, m->act_stream));
    PROF_END(m->act_stream);
    cudaCheck(cudaEventRecord(m->act_moved[e], m->act_stream));
}
// chunk j's compute waits for its slots' last copies: its input's up, its output's last down
static void act_wait(Model *m, int j) {
    cudaCheck(cudaStreamWaitEvent(m->stream, m->act_moved[j % 2], 0));
    cudaCheck(cudaStreamWaitEvent(m->stream, m->act_moved[2 + j % 2], 0));
}

// one decoder layer's forward of a sequence of T tokens (its base's products and attention; the
// adapters' few left out): what flops_per_sequence leaves out of a recomputed forward
static double layer_forward_flops(const Config *c, int T, int s2) {
    return 2 * layer_matmul_params(c) * T + attention_flops(c, T, s2) / c->n_layers;
}
// The memory plan's lines for it (memory_plan): with K > 1, the GPU's inputs inside a group (in
// the activations); and a micro-batch's copies to and from the host and their time over PCIe at
// PLAN_PCIE_GBS against its compute at --peak_tflops. Up: the kept inputs of layers 1 .. L - 1
// and the head's in the forward, each kept one of a layer that trains twice in the backward (the
// keys and values refilled, the chunk's backward), and each group's but the top one's once more
// (its forward re-run); down: the kept ones (a group's inner ones stay on the GPU). The compute is
// flops_per_sequence's and the forwards it leaves out: each training layer's recomputed (activation
// checkpointing) and the groups' re-run, as layer_major_forward_backward runs them.
static void activation_offload_plan(const Model *m) {
    const HostModel *h = &m->host;
    const double MiB = 1048576.0;
    int L = h->config.n_layers, K = m->offload_every, lowest = h->frozen_units ? h->frozen_units - 1 : 0, kept = inputs_kept(m);
    int kept_trained = 0, reruns = 0;
    for (int l = lowest; l < L; l++) {
        kept_trained += input_kept(m, l);
        reruns += group_rerun(m, l);
    }
    double up = (double)(kept - 1 + 2 * kept_trained + reruns) * resid_bytes(m), down = (double)kept * resid_bytes(m);
    double tflops = m->peak_tflops > 0 ? m->peak_tflops : PLAN_PEAK_TFLOPS, layer = m->B * layer_forward_flops(&h->config, m->T, m->s2_attn);
    double rerun = (double)reruns * (K - 1) * layer, compute = m->B * flops_per_sequence(h, m->T, m->s2_attn) + (L - lowest) * layer + rerun;
    double pcie_ms = (up + down) / (PLAN_PCIE_GBS * 1e9) * 1e3, compute_ms = compute / (tflops * 1e12) * 1e3;
    if (K > 1)
        printf("  %-34s %10.1f MiB   (of the activations: the %d inside a group of --offload_every %d over the whole sequence; "
               "%d groups' forward re-run, %.1f%% of the compute)\n", "layer inputs on the GPU", (K - 1) * resid_bytes(m) / MiB, K - 1, K,
               reruns, 100 * rerun / compute);
    printf("  %-34s %10.1f MiB   (up %.1f MiB, down %.1f MiB: %.1f ms at %.0f GB/s, against %.1f ms of compute at %.0f TFLOP/s)\n",
           "layer inputs moved a micro-batch", (up + down) / MiB, up / MiB, down / MiB, pcie_ms, PLAN_PCIE_GBS, compute_ms, tflops);
    if (pcie_ms > compute_ms) {
        fflush(stdout);
        fprintf(stderr, "warning: --activation_offloading: the layers' inputs take %.1f ms a micro-batch over PCIe (%.0f GB/s), more "
                "than its %.1f ms of compute at %.0f TFLOP/s: the GPU waits for them (longer sequences or more rows a micro-batch "
                "hide more of it)\n", pcie_ms, PLAN_PCIE_GBS, compute_ms, tflops);
    }
}
