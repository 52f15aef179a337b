// support/act_offload.cuh: --activation_offloading's host side of the CUDA trainer (docs/long_context.md
// "Activation offloading: the layer-major schedule"): every layer's input over the whole
// sequence in pinned host memory (ckpt), each chunk's block copied up into the chunk's input slot
// a chunk ahead of its use, and each layer's output down, on a stream of their own (act_stream),
// ordered with the compute by one event a slot. The schedule is train_llama2.cu's
// (layer_major_forward_backward); the plan's lines for it are activation_offload_plan's.
//
// Not a header on its own: train_llama2.cu includes it after its Model and the Model's layout,
// whose names it uses (layer_in, resid_slot, stream_after, PLAN_PCIE_GBS), as offload.cuh does.
#pragma once

// the bytes of a whole sequence's residual (B, T, D) in the compute type: one layer's in ckpt
static size_t resid_bytes(const Model *m) {
    return (size_t)m->B * m->T * m->host.config.dim * (m->fp32 ? sizeof(float) : sizeof(bf16));
}
// chunk ch's block (B, len, D) of ckpt[l], in host memory
static void *ckpt_block(const Model *m, const Chunk *ch, int l) {
    size_t es = m->fp32 ? sizeof(float) : sizeof(bf16);
    return (char *)m->ckpt + (size_t)l * resid_bytes(m) + (size_t)ch->B * ch->t0 * m->host.config.dim * es;
}

// ckpt (pinned, so that its copies run in stream order beside the compute), the stream and the
// slots' events (each recorded once: a slot's first wait waits for nothing). Pinning can fail
// where host memory is short or locked memory is limited: said, with how much.
static void act_offload_alloc(Model *m) {
    size_t bytes = (size_t)(m->host.config.n_layers + 1) * resid_bytes(m);
    cudaError_t err = cudaMallocHost(&m->ckpt, bytes);
    if (err != cudaSuccess)
        die("--activation_offloading: cannot pin %.2f GiB of host memory for the %d layers' inputs (%s): the host memory "
            "plan says what the run needs beside it; free memory, or raise the locked-memory limit (ulimit -l)",
            bytes / 1073741824.0, m->host.config.n_layers, cudaGetErrorString(err));
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

// Chunk j's block of ckpt[l] up into its input slot, once the compute enqueued so far (which
// holds the slot's last reads, two chunks back) is done; act_wait has the compute wait for it.
template <typename floatX> void act_up(Model *m, ChunkActs<floatX> *s, int j, int l) {
    Chunk ch = rows_chunk(&m->rows, j, 1);
    int e = j % 2;
    stream_after(m->act_stream, m->stream, m->computed);
    PROF_BEGIN(m->act_stream, "activations up", l, j, -1);
    cudaCheck(cudaMemcpyAsync(resid_slot(m, s, &ch, 0), ckpt_block(m, &ch, l), (size_t)ch.B * ch.len * m->host.config.dim * sizeof(floatX),
                              cudaMemcpyHostToDevice, m->act_stream));
    PROF_END(m->act_stream);
    cudaCheck(cudaEventRecord(m->act_moved[e], m->act_stream));
}
// The chunk's resid slot i + its parity (0: an input, 2: an output) down to its block of ckpt[l],
// once computed; the slot's next writer waits for it (act_wait).
template <typename floatX> void act_down(Model *m, ChunkActs<floatX> *s, const Chunk *ch, int i, int l) {
    int e = i + ch->t0 / m->rows.len % 2;
    stream_after(m->act_stream, m->stream, m->computed);
    PROF_BEGIN(m->act_stream, "activations down", l, ch->t0 / m->rows.len, -1);
    cudaCheck(cudaMemcpyAsync(ckpt_block(m, ch, l), resid_slot(m, s, ch, i), (size_t)ch->B * ch->len * m->host.config.dim * sizeof(floatX),
                              cudaMemcpyDeviceToHost, m->act_stream));
    PROF_END(m->act_stream);
    cudaCheck(cudaEventRecord(m->act_moved[e], m->act_stream));
}
// chunk j's compute waits for its slots' last copies: its input's up, its output's last down
static void act_wait(Model *m, int j) {
    cudaCheck(cudaStreamWaitEvent(m->stream, m->act_moved[j % 2], 0));
    cudaCheck(cudaStreamWaitEvent(m->stream, m->act_moved[2 + j % 2], 0));
}

// The memory plan's lines for it (memory_plan): a micro-batch's copies each way and their time
// over PCIe at PLAN_PCIE_GBS against its compute at --peak_tflops. Up: layers 1 .. L - 1's inputs
// in the forward, the head's, and each layer's that trains twice in the backward (the keys and
// values refilled, the chunk's backward); down: L + 1 (the embedding's and each layer's output).
// The compute is flops_per_sequence's and the recompute counted as a third of it (the forward's
// share of full fine-tuning, and of attention; less than an adapter's), so the warning errs toward warning.
static void activation_offload_plan(const Model *m) {
    const HostModel *h = &m->host;
    const double MiB = 1048576.0;
    int L = h->config.n_layers, trained = L - (h->frozen_units ? h->frozen_units - 1 : 0);
    double up = (double)(L - 1 + 1 + 2 * trained) * resid_bytes(m), down = (double)(L + 1) * resid_bytes(m);
    double tflops = m->peak_tflops > 0 ? m->peak_tflops : PLAN_PEAK_TFLOPS;
    double pcie_ms = (up + down) / (PLAN_PCIE_GBS * 1e9) * 1e3;
    double compute_ms = m->B * flops_per_sequence(h, m->T, m->s2_attn) * 4 / 3 / (tflops * 1e12) * 1e3;
    printf("  %-34s %10.1f MiB   (up %.1f MiB, down %.1f MiB: %.1f ms at %.0f GB/s, against %.1f ms of compute at %.0f TFLOP/s)\n",
           "layer inputs moved a micro-batch", (up + down) / MiB, up / MiB, down / MiB, pcie_ms, PLAN_PCIE_GBS, compute_ms, tflops);
    if (pcie_ms > compute_ms) {
        fflush(stdout);
        fprintf(stderr, "warning: --activation_offloading: the layers' inputs take %.1f ms a micro-batch over PCIe (%.0f GB/s), more "
                "than its %.1f ms of compute at %.0f TFLOP/s: the GPU waits for them (longer sequences or more rows a micro-batch "
                "hide more of it)\n", pcie_ms, PLAN_PCIE_GBS, compute_ms, tflops);
    }
}
