// offload.cuh: --cpu_offload's host side of the CUDA trainer, the GPU's second tier
// (docs/memory.md "Optimizer offload"): what full fine-tuning keeps in host memory (the
// masters, the gradients and the optimizer state: offload_alloc), how the gradients go down
// there and up again (grads_to_host, grads_add_staged, unit_grad_copy), and how the step on
// the host overlaps the backward, unit by unit (OffloadStep). The step itself is the
// optimizer's (train_llama2.cu's optimizer_step_host). With an adapter --cpu_offload keeps the
// frozen base's decoder layers in host memory instead (sharded, the rank's shards of them), each
// copied up a layer ahead of its use into a ring of two (base_offload_alloc, layer_up; docs/memory.md
// "The frozen base streamed").
//
// Not a header on its own: train_llama2.cu includes it after its Model and the Model's
// layout, whose names it uses (with_precision, buffers, upload, weight_offset,
// trainable_shard_at, widest_trainable_shard), as lora.cuh uses lora.h's.
#pragma once
#include <pthread.h> // the step overlapped with the backward (OffloadStep)

// ----------------------------------------------------------------------------
// host memory: what --cpu_offload keeps there (model_alloc and model_free call these)

// --cpu_offload's stages, in floats each, for gradients on their way to the host (grads_to_host):
// sharded, a reduced shard; whole with --pure_bf16 not in chunks, a unit's micro-batch gradient,
// which the host rounds into grad_acc; else none (the running totals go straight down: grads_done)
static size_t offload_stage_numel(const Model *m) {
    const HostModel *h = &m->host;
    if (m->sharded) return widest_trainable_shard(h);
    size_t widest = 0;
    for (int i = h->frozen_units; i < h->units.n_units && m->pure_bf16 && !pure_bf16_chunked(m); i++)
        widest = std::max(widest, h->units.units[i].numel);
    return widest;
}
// --cpu_offload's host memory (pinned, so its copies run in stream order): the masters (the
// host model's trainable weights themselves when they are one run, else a copy; --pure_bf16:
// the bf16 parameters, which model_alloc fetches from the GPU), the gradients (--pure_bf16: the
// step's bf16 ones, and in chunks a micro-batch's fp32 sum) and the optimizer state at zero;
// two stages (offload_stage_numel)
static void offload_alloc(Model *m) {
    HostModel *h = &m->host;
    m->masters_aliased = m->n_runs == 1 && !m->pure_bf16;
    if (m->pure_bf16) cudaCheck(cudaMallocHost(&m->params_bf16, m->n_train * sizeof(bf16) + 1));
    else if (m->masters_aliased) m->params = (m->sharded ? h->shards : h->params) + m->run_first[0];
    else cudaCheck(cudaMallocHost(&m->params, m->n_train * sizeof(float) + 1));
    if (m->pure_bf16) {
        cudaCheck(cudaMallocHost(&m->grad_acc, m->n_train * sizeof(bf16) + 1));
        memset(m->grad_acc, 0, m->n_train * sizeof(bf16));
        m->step_pieces = (float *)mallocCheck(2 * std::min(UPLOAD_PIECE, m->n_train) * sizeof(float) + 1);
    }
    if (!m->pure_bf16 || pure_bf16_chunked(m)) {
        cudaCheck(cudaMallocHost(&m->grads, m->n_train * sizeof(float) + 1));
        memset(m->grads, 0, m->n_train * sizeof(float));
    }
    for (int i = 0; i < optimizer_n_states(&m->optimizer); i++) {
        size_t count, es = optimizer_state_elem(&m->optimizer, &m->opt_tensors, m->n_train, i, &count);
        cudaCheck(cudaMallocHost(&m->opt_state[i], count * es + 1));
        memset(m->opt_state[i], 0, count * es);
    }
    m->grad_held = (uint8_t *)callocCheck(h->units.n_units, 1);
    for (int b = 0; b < 2 && offload_stage_numel(m); b++) {
        cudaCheck(cudaMallocHost(&m->grad_stage[b], offload_stage_numel(m) * sizeof(float)));
        cudaCheck(cudaEventCreateWithFlags(&m->staged[b], cudaEventDisableTiming));
    }
    m->stage_pending = -1;
}
static void offload_free(Model *m) {
    if (!m->grad_held) return; // (never allocated)
    if (m->pure_bf16) {
        cudaCheck(cudaFreeHost(m->params_bf16));
        cudaCheck(cudaFreeHost(m->grad_acc));
        free(m->step_pieces);
    } else if (!m->masters_aliased) cudaCheck(cudaFreeHost(m->params));
    if (m->grads) cudaCheck(cudaFreeHost(m->grads));
    for (int i = 0; i < optimizer_n_states(&m->optimizer); i++) cudaCheck(cudaFreeHost(m->opt_state[i]));
    for (int b = 0; b < 2 && offload_stage_numel(m); b++) {
        cudaCheck(cudaFreeHost(m->grad_stage[b]));
        cudaCheck(cudaEventDestroy(m->staged[b]));
    }
    free(m->grad_held);
}

// ----------------------------------------------------------------------------
// --cpu_offload's step overlapped with the backward (docs/memory.md "Optimizer offload").
// Where nothing can veto a step once its backward has begun (no clipping, no loss scale, no
// sum over replicas: offload_step_start, optimizer_begin_step), each unit that trains steps
// on the host as soon as its gradient there is final (the step's last micro-batch, its first
// chunk's backward over the unit), on a worker thread, while the GPU runs the rest of the
// backward. The worker touches the unit's masters, gradients and state (--pure_bf16: its bf16
// parameters, gradient and state; whole sequences only: offload_step_start) on the host alone;
// this thread makes every CUDA call: it waits for each unit's last gradient copy in the order
// the backward made them (offload_step_dispatch; sharded, grads_add_staged hands each shard
// over once it has added it), and uploads each stepped unit's new weights on a stream of
// their own (offload_step_upload). The rest of the backward reads no weight of a unit done
// (a layer's backward reads its own; the tied embedding's other reader, the head, runs
// before the embedding's backward; a sharded unit is gathered before its backward), and
// the step ends with every upload done, before the next forward.
typedef struct OffloadStep {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;     // a unit handed over, a unit stepped, or stop
    int *queue;              // (n_units) the step's units in the order their gradients became final
    int queued, taken, stepped, uploaded, stop; // (queue's counts: the worker takes, steps; this thread uploads)
    int on, step, t;         // this step overlaps; the trainer's step (1-based), the optimizer's
    float lr;
    int passes_left;         // the step's micro-batches yet to start
    int last_pass;           // the backward's last pass over the units runs (the last micro-batch's first chunk)
    int *copying, n_copying; // (n_units) whole: the units whose last gradient copy ready[] marks, in order
    cudaEvent_t *ready;      // (n_units) whole: each one's
    cudaStream_t upload;     // the new weights' way up
    int n_units;             // the units that train
    int stepped_early;       // of them, those stepped when the last was handed over
    int log;                 // LLAMA2TUNE_OFFLOAD_LOG set: a line a step (test_offload.sh checks the overlap ran)
} OffloadStep;

static void optimizer_update_host(Model *m, size_t first, size_t n, int t, float lr); // (train_llama2.cu's optimizer section)
static void anyprecision_step_host(Model *m, size_t first, size_t n, int t, float lr, double norm, float inv_scale);
// the overlapped step's update of elements [first, first + n): --pure_bf16's unclipped and
// unscaled (clip_grads then changes nothing: the norm is not needed)
static void offload_step_update(Model *m, size_t first, size_t n, int t, float lr) {
    if (m->pure_bf16) anyprecision_step_host(m, first, n, t, lr, 0.0, 1.0f);
    else optimizer_update_host(m, first, n, t, lr);
}

// whether a unit's gradient is final when its backward ends now (the step's last pass over it)
static bool offload_step_final(const Model *m) { return m->offload_step && m->offload_step->last_pass; }
// model_forward_backward, as a micro-batch's backward begins: whether the step's units step in it
// (the overlapped step is on, and this is the step's last micro-batch)
static bool offload_step_backward(Model *m) {
    OffloadStep *w = m->offload_step && m->offload_step->on ? m->offload_step : NULL;
    return w && --w->passes_left == 0;
}
// ... and as each chunk's backward begins: whether it is the step's last pass over the units (the
// backward's of its last micro-batch, and that one's first chunk); false once the backward ends
static void offload_step_set_last_pass(Model *m, bool last) {
    if (m->offload_step && m->offload_step->on) m->offload_step->last_pass = last;
}

// the worker: unit after unit as handed over, its ranges of the flat masters, gradients and
// state stepped (each tensor's, whole; sharded, the unit's shard)
static void *offload_step_worker(void *arg) {
    Model *m = (Model *)arg;
    OffloadStep *w = m->offload_step;
    const HostModel *h = &m->host;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->stop && w->taken == w->queued) pthread_cond_wait(&w->cond, &w->lock);
        if (w->stop) break;
        int u = w->queue[w->taken++];
        const FsdpUnit *un = &h->units.units[u];
        pthread_mutex_unlock(&w->lock);
        if (m->sharded) offload_step_update(m, trainable_shard_at(h, u), un->shard, w->t, w->lr);
        else for (int j = 0; j < un->n_tensors; j++)
            offload_step_update(m, model_tensor_offset_from(&h->config, h->frozen_units, u, j), un->tensors[j].numel, w->t, w->lr);
        pthread_mutex_lock(&w->lock);
        w->stepped++;
        pthread_cond_broadcast(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}
// unit u's gradient on the host is final: to the worker
static void offload_step_hand(OffloadStep *w, int u) {
    pthread_mutex_lock(&w->lock);
    if (w->queued == w->n_units) die("internal: the overlapped offload step got unit %d after its %d units", u, w->n_units);
    w->queue[w->queued++] = u;
    if (w->queued == w->n_units) w->stepped_early = w->stepped;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}
// whole: unit u's last gradient copy is queued on the collectives' stream (grads_done)
static void offload_step_copied(Model *m, int u) {
    OffloadStep *w = m->offload_step;
    cudaCheck(cudaEventRecord(w->ready[u], m->comm_stream));
    w->copying[w->n_copying++] = u;
}
// n new weights from element src of the host's (masters, or --pure_bf16's bf16 parameters) up to
// element dst of those the matmuls read, on the upload stream: --pure_bf16's as they are (as
// params_bf16_copy); the masters' converted, bf16's through the upload stage, which nothing else
// uses before the step ends (so queued without waiting: offload_step_join synchronizes the stream)
static void offload_step_put(Model *m, size_t dst, size_t src, size_t n) {
    cudaStream_t st = m->offload_step->upload;
    if (m->pure_bf16) {
        cudaCheck(cudaMemcpyAsync(m->b16.weights + dst, m->params_bf16 + src, n * sizeof(bf16), cudaMemcpyHostToDevice, st));
        return;
    }
    with_precision(m, [&](auto tag) {
        using floatX = typename decltype(tag)::type;
        upload(buffers<floatX>(m).weights + dst, m->params + src, n, st, m->upload_stage, false);
    });
}
// the new weights of the units stepped so far (wait: of all, once stepped) up into those the
// matmuls read (the bf16/fp16 copy, or with --freeze_layers the weights), in the order stepped
static void offload_step_upload(Model *m, bool wait) {
    OffloadStep *w = m->offload_step;
    const HostModel *h = &m->host;
    for (;;) {
        pthread_mutex_lock(&w->lock);
        while (wait && w->stepped == w->uploaded && w->uploaded < w->queued) pthread_cond_wait(&w->cond, &w->lock);
        int stepped = w->stepped;
        pthread_mutex_unlock(&w->lock);
        if (stepped == w->uploaded) return;
        for (; w->uploaded < stepped; w->uploaded++) {
            int u = w->queue[w->uploaded];
            const FsdpUnit *un = &h->units.units[u];
            if (m->sharded) offload_step_put(m, un->shard_offset, trainable_shard_at(h, u), un->shard);
            else for (int j = 0; j < un->n_tensors; j++)
                offload_step_put(m, weight_offset(m, u, j), model_tensor_offset_from(&h->config, h->frozen_units, u, j), un->tensors[j].numel);
        }
    }
}
// whole: each unit handed over once its last gradient copy is in, in the order the backward
// queued them (the GPU runs the rest of the backward meanwhile), and the stepped ones uploaded
// (sharded, grads_add_staged does both as the backward runs)
static void offload_step_dispatch(Model *m) {
    OffloadStep *w = m->offload_step;
    for (int i = 0; i < w->n_copying; i++) {
        cudaCheck(cudaEventSynchronize(w->ready[w->copying[i]]));
        offload_step_hand(w, w->copying[i]);
        offload_step_upload(m, false);
    }
}
// the step's end: every unit that trains stepped, its weights up (before the next forward)
static void offload_step_join(Model *m) {
    OffloadStep *w = m->offload_step;
    if (w->queued != w->n_units) die("internal: the overlapped offload step got %d of %d units", w->queued, w->n_units);
    offload_step_upload(m, true);
    cudaCheck(cudaStreamSynchronize(w->upload));
    if (w->log)
        fprintf(stderr, "offload step %d: %d units stepped as their gradients became final, %d of them before the last was\n",
                w->step, w->queued, w->stepped_early);
    w->on = 0;
}

// optimizer_init: the worker, where no step can be vetoed once its backward has begun: no
// clipping (whose factor needs every gradient), no sum over replicas (summed; after the
// backward), not --pure_bf16 in chunks (its micro-batch's fp32 sum is rounded into the step's
// bf16 gradient at the micro-batch's end, grads_bf16_end, not unit by unit); a loss scale is
// checked each step
static void offload_step_start(Model *m, bool summed) {
    const HostModel *h = &m->host;
    if (!m->cpu_offload || m->dry_run || pure_bf16_chunked(m) || m->optimizer.grad_clip > 0 || summed) return;
    OffloadStep *w = (OffloadStep *)callocCheck(1, sizeof *w);
    int n = h->units.n_units;
    w->queue = (int *)mallocCheck(n * sizeof(int));
    w->copying = (int *)mallocCheck(n * sizeof(int));
    w->ready = (cudaEvent_t *)callocCheck(n, sizeof(cudaEvent_t));
    w->n_units = n - h->frozen_units;
    for (int u = 0; u < n && !m->sharded; u++) cudaCheck(cudaEventCreateWithFlags(&w->ready[u], cudaEventDisableTiming));
    cudaCheck(cudaStreamCreateWithFlags(&w->upload, cudaStreamNonBlocking));
    w->log = getenv("LLAMA2TUNE_OFFLOAD_LOG") != NULL;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    m->offload_step = w; // (before the worker reads it)
    if (pthread_create(&w->thread, NULL, offload_step_worker, m) != 0) die("cannot start --cpu_offload's step thread");
}
static void offload_step_stop(Model *m) {
    OffloadStep *w = m->offload_step;
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    for (int u = 0; u < m->host.units.n_units && !m->sharded; u++) cudaCheck(cudaEventDestroy(w->ready[u]));
    cudaCheck(cudaStreamDestroy(w->upload));
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w->queue), free(w->copying), free(w->ready), free(w);
    m->offload_step = NULL;
}

// ----------------------------------------------------------------------------
// the gradients' way to the host and back (grad_at, grads_done)

// offloaded, whole: unit u's gradient between its buffer b and the host's flat gradients
// (model_tensor_offset_from's layout), tensor by tensor, on stream
static void unit_grad_copy(Model *m, int u, int b, cudaMemcpyKind kind, cudaStream_t stream) {
    const HostModel *h = &m->host;
    const FsdpUnit *un = &h->units.units[u];
    for (int k = 0; k < un->n_tensors; k++) {
        float *dev = m->unit_grad[b] + un->tensors[k].offset, *host = m->grads + model_tensor_offset_from(&h->config, h->frozen_units, u, k);
        bool up = kind == cudaMemcpyHostToDevice;
        cudaCheck(cudaMemcpyAsync(up ? dev : host, up ? host : dev, un->tensors[k].numel * sizeof(float), kind, stream));
    }
}
// offloaded: n gradients x that came down added to the host's at element at: into the fp32
// running total, or (--pure_bf16, not in chunks: a micro-batch's whole) into grad_acc, rounded as
// the device rounds them there (grads_bf16_add)
static void grads_add_host(Model *m, size_t at, const float *x, size_t n) {
    if (m->pure_bf16 && !pure_bf16_chunked(m)) { grads_bf16_add(m->grad_acc + at, x, n); return; }
    float *g = m->grads + at;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) g[i] += x[i];
}
// offloaded: adds the gradient staged last (grads_to_host) to the host's, once its copy is in:
// a shard at pending_at, or a whole unit's tensor by tensor
static void grads_add_staged(Model *m) {
    int s = m->stage_pending;
    if (s < 0) return;
    cudaCheck(cudaEventSynchronize(m->staged[s]));
    const HostModel *h = &m->host;
    const FsdpUnit *un = &h->units.units[m->pending_u];
    if (m->sharded) grads_add_host(m, m->pending_at, m->grad_stage[s], m->pending_n);
    else
        for (int k = 0; k < un->n_tensors; k++)
            grads_add_host(m, model_tensor_offset_from(&h->config, h->frozen_units, m->pending_u, k),
                           m->grad_stage[s] + un->tensors[k].offset, un->tensors[k].numel);
    m->stage_pending = -1;
    if (!m->pending_final) return;
    offload_step_hand(m->offload_step, m->pending_u); // (the overlapped step's)
    offload_step_upload(m, false);
}
// The reduced shard of unit u (grad_part; whole, --pure_bf16 not in chunks: its gradient) down
// to a stage, on the collectives' stream; the one before it, staged last time, is added
// meanwhile (so the host adds one while the GPU goes on with the backward), its stage then
// free for the next.
static void grads_to_host(Model *m, int u, size_t at) {
    int s = m->stage_next;
    size_t n = m->sharded ? m->host.units.units[u].shard : m->host.units.units[u].numel;
    cudaCheck(cudaMemcpyAsync(m->grad_stage[s], m->sharded ? m->grad_part : m->unit_grad[u != 0], n * sizeof(float),
                              cudaMemcpyDeviceToHost, m->comm_stream));
    cudaCheck(cudaEventRecord(m->staged[s], m->comm_stream));
    grads_add_staged(m);
    m->stage_pending = s, m->pending_at = at, m->pending_n = n, m->pending_u = u, m->pending_final = offload_step_final(m);
    m->stage_next = s ^ 1;
}
// offloaded: the host's fp32 gradients at zero, none of them held (in parallel: a 7B model's are 27 GB)
static void grads_host_zero(Model *m) {
    memset(m->grad_held, 0, m->host.units.n_units);
    size_t n = m->grads ? m->n_train : 0;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) m->grads[i] = 0.0f;
}

// ----------------------------------------------------------------------------
// --cpu_offload with an adapter: the frozen base's decoder layers in host memory (sharded, the rank's
// shards of them), each copied up a layer ahead of its use into a ring of two (docs/memory.md "The
// frozen base streamed"): unit_prefetch calls layer_up where a sharded unit would be gathered (whole:
// into the ring's two slots; the compute stream waits for the slot's event as it waits for a gather,
// unit_gather), or before it is gathered (sharded: into the shard ring, which the gather reads)

// base_host: QLoRA's runs (sharded, the rank's shards of them), which the host model holds already,
// pinned where they are; else room for each layer's unit in the compute type (sharded, the rank's
// shard of it), which weights_put (layer_shards_put) fills as the base loads. Pinning can fail where
// the host's memory is short or locked memory is limited: said, with how much.
static void base_offload_alloc(Model *m) {
    HostModel *h = &m->host;
    size_t bytes = (size_t)h->config.n_layers * layer_bytes(m);
    bool quant = h->quant_type != QUANT_NONE;
    uint8_t *runs = m->sharded ? h->quant_shards : h->quant_bytes; // (sharded: every packed unit a layer, packed_shard each)
    if (!quant && !h->base_deferred && !m->sharded) die("internal: --cpu_offload's streamed base needs the base read after model_alloc");
    cudaError_t err = quant ? cudaHostRegister(runs, bytes, cudaHostRegisterDefault) : cudaMallocHost((void **)&m->base_host, bytes);
    if (err != cudaSuccess)
        die("--cpu_offload 1: cannot pin %.2f GiB of host memory for the base's %d decoder layers%s (%s): the host memory "
            "plan says what the run needs beside it; free memory, or raise the locked-memory limit (ulimit -l)",
            bytes / 1073741824.0, h->config.n_layers, m->sharded ? " (this rank's shards)" : "", cudaGetErrorString(err));
    if (quant) m->base_host = runs;
    for (int b = 0; b < 2 && m->sharded; b++) cudaCheck(cudaEventCreateWithFlags(&m->ring_read[b], cudaEventDisableTiming));
    if (getenv("LLAMA2TUNE_OFFLOAD_LOG")) fprintf(stderr, "base offload: %zu bytes pinned\n", bytes);
}
static void base_offload_free(Model *m) {
    if (m->base_host && m->host.quant_type != QUANT_NONE) cudaCheck(cudaHostUnregister(m->base_host));
    else if (m->base_host) cudaCheck(cudaFreeHost(m->base_host));
    if (m->base_stream) cudaCheck(cudaStreamDestroy(m->base_stream));
    for (int b = 0; b < 2; b++)
        if (m->ring_read[b]) cudaCheck(cudaEventDestroy(m->ring_read[b]));
}

// layer unit u's bytes this rank holds up into dst on the base's stream (the slot s whole, or the
// shard ring's u & 1), once the last reads of dst's old layer are done: the compute enqueued so far
// (whole), or the gather that read the shard ring's buffer last (sharded); slot s's event marks them in
static void layer_up(Model *m, int u, int s, void *dst) {
    size_t bytes = layer_bytes(m);
    if (m->sharded) cudaCheck(cudaStreamWaitEvent(m->base_stream, m->ring_read[u & 1], 0));
    else stream_after(m->base_stream, m->stream, m->computed);
    PROF_BEGIN_UNIT(m->base_stream, "upload", u, m->host.config.n_layers, (long long)bytes);
    cudaCheck(cudaMemcpyAsync(dst, m->base_host + (size_t)(u - 1) * bytes, bytes, cudaMemcpyHostToDevice, m->base_stream));
    PROF_END(m->base_stream);
    cudaCheck(cudaEventRecord(m->gathered[s], m->base_stream));
}
