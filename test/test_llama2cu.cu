// The CUDA trainer (train_llama2.cu) against its judge, the CPU twin
// (train_llama2.c, itself checked against transformers + peft by test_llama2),
// set up from the same arguments on the same checkpoint and batches: the
// logits and the loss, every trainable gradient, and 10 optimizer steps of
// losses and gradient norms; for LoRA (with dropout, whose masks are the same
// hash on both; and DoRA, tiny_gqa's peft adapter; and IA3, llama_adapter and prefix, tiny_gqa's and tiny_tied's; and
// --trainable_params embed, norm and both, tiny_gqa's and tiny_tied's, the embedding and norms trained beside) and
// full fine-tuning,
// whole sequences and chunks (keep and
// recompute, the head in pieces, --activation_checkpointing), GQA (tiny_gqa) and
// tied (tiny_tied) models and a random one with head_dim 64 and GQA (bf16
// attention then runs on tensor cores), and tiny_gqa with a sliding window of 5
// keys (Mistral's sliding_window: shorter than T and than most chunks, longer
// than some), in --precision fp32 and bf16 (and a few cases in fp16, whose bf16
// refusal on GPUs without bf16 is checked too); the head_dim-64 model with that
// window too, for the tensor cores' window, in single micro-batches; --s2_attn 1
// (LongLoRA's shifted sparse groups) on tiny_gqa and the head_dim-64 model, rows of
// 24 and of 200 tokens, whole and chunked, and 10 steps of tiny_gqa; rows of 200
// tokens (several attention tiles, a partial last one, chunks whose queries start
// inside a tile against a KV carry) on tiny_gqa and models of head_dim 64 and 128
// (LoRA, fp32 and bf16, whole and in chunks); and a few
// cases of two families' fixtures: Llama-3's RoPE scaling with head_dim 12, not
// hidden_size / heads (tiny_llama3), and CodeLlama's 32016 rows; and 10 steps of
// SGD (--optimizer sgd, momentum 0.9, Nesterov or not, weight decay) on tiny_gqa,
// within AdamW's step tolerances (SGD's update, linear in the gradient, does not
// amplify the gradients' rounding as AdamW's m / sqrt(v) does); and QLoRA
// (--quantize nf4 and fp4 on tiny_qlora, whose 4-bit weights dequantize to the
// CPU's bits in fp32 and their rounding in bf16, so LoRA's tolerances hold; its dequantize
// scratch one projection's, not a layer's; and IA3,
// llama_adapter and prefix on its nf4 base); and 10 steps of 2 micro-batches of --pure_bf16 with
// AnyPrecisionAdamW (Kahan summation off and on, whole and in chunks, --freeze_layers 1); and
// preference tuning's hooks on one pair (check_preference: each target's loss, the weighted
// gradients, a shared prompt == two rows, the reference swap; --quick too). Each
// comparison prints the worst element of what it compares; the program exits 1
// when any check fails. A run with --activation_checkpointing must also give the
// bits of the same CUDA run without it (logits, losses, every gradient): it runs
// the same kernels on the same inputs in the same order, and each layer's slice
// of the activations is 256-byte aligned either way, so cuBLASLt, whose plans
// depend on alignment, picks the same kernels too.
//
// Without a GPU it prints a SKIP line and exits 0; built by the execution layer
// (dev/emu/, build-emu/test/test_llama2cu) it runs on the CPU. --quick runs a few
// cases with 3 steps (for compute-sanitizer, which makes every kernel slow);
// --part i/n a share of the cases (test/test_emu_cuda.sh runs two at once);
// --filter TEXT only the cases whose description contains TEXT (e.g. "sgd").
// --precision P only the cases of that precision (fp32, bf16 or fp16).
// --big_logits T only check_big_logits, on rows of T tokens (dev/gpu_check.sh: 35200,
// logits of more than 2^31 elements; a small T tries it emulated).
//
// Tolerances, each relative to the largest magnitude of what it compares
// (the whole logits, one gradient tensor at a time, each step's loss):
// - fp32: the GPU sums in other orders than the CPU (cuBLASLt's tiles, the
//   attention's key tiles, warp reductions; the CPU's RMSNorm statistics are
//   double), about 1e-7 per operation and a few 1e-6 through the two layers
//   and back: 1e-5 for the forward, 1e-4 for the gradients and for 10 steps of
//   AdamW (whose m / sqrt(v) turns gradient rounding into parameter changes).
// - bf16, against the fp32 CPU: weights and activations rounded to bf16 (8
//   significant bits, 2^-9 relative) at every layer boundary, and the dKV carry
//   added in bf16 once per later chunk: logits within 3e-2 of the largest,
//   losses within 1e-2, gradients within 1e-1 of each tensor's largest element.
// - fp16, against the fp32 CPU: as bf16 with 11 significant bits (2^-12
//   relative, 8 times finer than bf16's 2^-9), so an eighth of bf16's tolerances
//   at most, rounded up: {4e-3, 2e-3, 2e-2, 2e-3}. Its 5 exponent bits flush
//   gradients below 2^-24 to zero, so the backward runs as training runs it: the
//   loss scaled by LOSS_SCALE_INIT (2^16; the gradients compared after dividing
//   by it, exact) and the optimizer steps unscaling it (optimizer_step's inv_scale).
//   The steps' gradient norms are the exception, 5e-2: AdamW's m / sqrt(v) turns
//   the rounding of near-zero gradients into full-size updates, so over 10 steps
//   the drift does not shrink with the storage's precision (emulated, the
//   head_dim-64 model's step 10: 2.4e-2 in fp16, 0.9e-2 in bf16; steps 1-9 of
//   fp16 within 5e-3). Measured worst otherwise: see docs/correctness.md's test table.
// These are estimates from the rounding above: nothing here has run on a GPU
// yet. The first run (dev/gpu_check.sh) measures the real errors, and the
// tolerances should then come down to a few times what it measures.
#define TESTING
#include "../train_llama2.cu"
#define TWIN_PREFIX gpu_
#include "twin.h"
#include "cpu_twin.h"
#include "test_common.h"
#include "random_model.h"
#include <string>
#include <vector>

enum { B = 2, T_DEFAULT = 24 }; // rows, and tokens a row but where a case says otherwise

struct Tol { double logits, loss, grads, steps, norms; }; // steps: their losses; norms: their gradient norms
const Tol FP32_TOL = {1e-5, 1e-5, 1e-4, 1e-4, 1e-4}, BF16_TOL = {3e-2, 1e-2, 1e-1, 1e-2, 1e-1},
          FP16_TOL = {4e-3, 2e-3, 2e-2, 2e-3, 5e-2};
// --pure_bf16's steps (check_steps only): both sides hold the same bf16 weights, gradients
// and moments and round them by the same rules, so the steps differ only by the GPU's bf16
// activations: a few times what they measure (the pure bf16 cases below say how much)
const Tol PURE_BF16_TOL = {0, 0, 0, 1e-3, 1e-2};
const Tol &tol_of(const char *precision) {
    return !strcmp(precision, "fp32") ? FP32_TOL : !strcmp(precision, "fp16") ? FP16_TOL : BF16_TOL;
}
// the loss scale the GPU's backward runs with: fp16's (the CPU, fp32, takes 1; exact either way)
float loss_scale_of(const char *precision) { return !strcmp(precision, "fp16") ? LOSS_SCALE_INIT : 1.0f; }

struct Case {
    const char *model;     // a checkpoint folder
    bool full;             // full fine-tuning (else LoRA from the fixture's PEFT adapter, dropout 0.1)
    const char *precision; // fp32 | bf16 | fp16 (the CUDA trainer's; the CPU computes fp32 either way)
    int chunk;             // --chunk_size (0: whole sequences)
    const char *mem;       // --chunk_memory
    int out_chunks;        // --num_output_chunks
    bool ckpt;             // --activation_checkpointing
    bool dora = false;     // LoRA from the fixture's DoRA adapter (dora/peft_init) instead
    const char *quantize = NULL; // QLoRA: --quantize nf4 | fp4 (double quantization, the default)
    int freeze = 0;        // --freeze_layers (full fine-tuning)
    int T = T_DEFAULT;     // tokens a row (--max_seq_len)
    bool s2 = false;       // --s2_attn 1 (and --batching packing, which it needs)
    const char *method = NULL; // ia3, llama_adapter or prefix: that adapter, from the fixture's <method>/peft_init, instead of LoRA
    const char *trainable = NULL; // --trainable_params: "embed,norm" from the fixture's trainable/peft_init (B and the
                                  // saved tensors off their start); "embed" or "norm" a fresh adapter, the copies the base's
    int kahan = -1;        // full fine-tuning with --pure_bf16 1 --optimizer anyprecision --kahan_summation kahan (-1: not)
    bool dpo = false;      // --objective dpo (room for the reference: check_preference)
};
enum { ADAMW, SGD_MOMENTUM, SGD_NESTEROV }; // the optimizer of a Pair (SGD: momentum 0.9, Nesterov or not)

// the case in words, for the check lines
std::string describe(const Case &c, int optimizer = ADAMW) {
    char buf[200];
    const char *model = strrchr(c.model, '/') ? strrchr(c.model, '/') + 1 : c.model;
    const char *optimizers[] = {"", " sgd momentum", " sgd nesterov"};
    snprintf(buf, sizeof buf, "%s %s %s C=%d %s out_chunks=%d%s%s%s%s%s%.0d%s%.0d%s%s%s%s", model, c.full ? "full" : c.dora ? "dora" : c.method ? c.method : "lora",
             c.precision, c.chunk, c.mem, c.out_chunks, c.ckpt ? " activation_checkpointing" : "", optimizers[optimizer],
             c.quantize ? " qlora " : "", c.quantize ? c.quantize : "", c.freeze ? " freeze_layers=" : "", c.freeze,
             c.T != T_DEFAULT ? " T=" : "", c.T != T_DEFAULT ? c.T : 0, c.s2 ? " s2_attn" : "",
             c.trainable ? " trainable_params=" : "", c.trainable ? c.trainable : "",
             c.kahan < 0 ? "" : c.kahan ? " pure_bf16 kahan" : " pure_bf16");
    return buf;
}

const char *filter = NULL;         // --filter: only the cases whose description contains it
const char *only_precision = NULL; // --precision: only the cases of this one
bool filtered_out(const Case &c, const std::string &name) {
    return (filter && name.find(filter) == std::string::npos) || (only_precision && strcmp(c.precision, only_precision));
}

// both backends, set up from the same arguments but for --precision (the CPU
// judges in fp32); the arguments must outlive them: the options point into them
struct Pair {
    std::vector<std::string> args[2]; // cpu, gpu
    std::vector<char *> argv[2];
    void *cpu, *gpu;
    Pair(const Case &c, int optimizer = ADAMW) {
        std::string model = c.model;
        const int T = c.T;
        for (int side = 0; side < 2; side++) {
            std::vector<std::string> &a = args[side];
            a = {"test_llama2cu", "--model", model, "--data", "unused", "--max_seq_len", std::to_string(T),
                 "--chunk_size", std::to_string(c.chunk), "--chunk_memory", c.mem, "--num_output_chunks",
                 std::to_string(c.out_chunks), "--precision", side ? c.precision : "fp32", "--weight_decay", "0.01",
                 "--seed", "3", c.ckpt ? "--activation_checkpointing=1" : "--activation_checkpointing=0"};
            if (optimizer != ADAMW) // SGD moves the weights as far as AdamW's steps do at a larger lr
                a.insert(a.end(), {"--optimizer", "sgd", "--momentum", "0.9", "--nesterov",
                                   optimizer == SGD_NESTEROV ? "1" : "0", "--lr", c.full ? "0.1" : "0.5"});
            else a.insert(a.end(), {"--lr", c.full ? "1e-3" : "5e-3"});
            if (c.kahan >= 0) // (the CPU holds the same bf16 values in fp32: --precision fp32 is its bf16)
                a.insert(a.end(), {"--pure_bf16", "1", "--optimizer", "anyprecision", "--kahan_summation", std::to_string(c.kahan)});
            if (c.full) a.push_back("--full_finetune");
            else if (c.trainable) {
                a.insert(a.end(), {"--trainable_params", c.trainable});
                if (!strcmp(c.trainable, "embed,norm")) a.insert(a.end(), {"--from_peft_checkpoint", model + "/trainable/peft_init"});
            } else if (c.method && c.quantize) { // (no fixture for tiny_qlora: a fresh adapter, IA3's vectors at 1, the gates at 0)
                a.insert(a.end(), {"--peft_method", c.method});
                if (!strcmp(c.method, "ia3")) a.insert(a.end(), {"--ia3_target_modules", "all-linear"});
                else if (!strcmp(c.method, "prefix")) a.insert(a.end(), {"--num_virtual_tokens", "4"});
                else a.insert(a.end(), {"--adapter_len", "4", "--adapter_layers", "2"});
            } else // B != 0, IA3's vectors != 1, the gates != 0
                a.insert(a.end(), {"--from_peft_checkpoint",
                                   model + (c.dora ? "/dora/peft_init" : c.method ? "/" + std::string(c.method) + "/peft_init" : "/peft_init")});
            if (c.freeze) a.insert(a.end(), {"--freeze_layers", std::to_string(c.freeze)});
            if (c.quantize) a.insert(a.end(), {"--quantize", c.quantize});
            if (c.s2) a.insert(a.end(), {"--s2_attn", "1", "--batching", "packing"});
            if (c.dpo) a.insert(a.end(), {"--objective", "dpo"});
            for (std::string &arg : a) argv[side].push_back(&arg[0]);
        }
        cpu = cpu_new((int)argv[0].size(), argv[0].data(), B, T);
        gpu = gpu_new((int)argv[1].size(), argv[1].data(), B, T);
        if (!c.full && !c.method) { // (IA3, llama_adapter and prefix have no dropout)
            cpu_set_lora_dropout(cpu, 0.1f);
            gpu_set_lora_dropout(gpu, 0.1f);
        }
    }
    ~Pair() { cpu_free(cpu); gpu_free(gpu); }
    const HostModel *host() const { return &((Twin *)gpu)->m.host; }
};

// B rows of T tokens from seed; targets are the next token, with none at each
// row's end and at every 7th position (the holes a padded, masked batch has).
// Returns the number of targets.
int make_batch(uint64_t seed, int V, int T, int *tokens, int *targets) {
    uint64_t state = seed;
    int labels = 0;
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(rng_next(&state) % V);
    for (int i = 0; i < B * T; i++) {
        targets[i] = (i % T == T - 1 || i % 7 == 3) ? -100 : tokens[i + 1];
        labels += targets[i] >= 0;
    }
    return labels;
}

// max |got - want| over max |want| for n elements, and the element where |got - want| is largest
struct Diff { double rel, scale; size_t at; float got, want; };
Diff diff(const float *got, const float *want, size_t n) {
    Diff d = {0, 0, 0, 0, 0};
    double err = 0;
    for (size_t i = 0; i < n; i++) {
        d.scale = std::max(d.scale, (double)fabsf(want[i]));
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) { err = e; d.at = i; } // NaN counts as the worst
    }
    if (n) { d.got = got[d.at]; d.want = want[d.at]; }
    d.rel = err / std::max(d.scale, 1e-30);
    if (err != err) d.rel = INFINITY;
    return d;
}

void check_tensor(const std::string &what, const float *got, const float *want, size_t n, double tol) {
    Diff d = diff(got, want, n);
    char line[512];
    snprintf(line, sizeof line, "%s: worst at %zu: gpu %.7g cpu %.7g, err %.2e of max %.3g (tol %.0e)", what.c_str(),
             d.at, d.got, d.want, d.rel, d.scale, tol);
    CHECK(d.rel <= tol, line, "%s", "out of tolerance");
}

void check_scalar(const std::string &what, double got, double want, double tol) {
    double rel = fabs(got - want) / std::max(fabs(want), 1e-30);
    char line[512];
    snprintf(line, sizeof line, "%s: gpu %.9g cpu %.9g, rel err %.2e (tol %.0e)", what.c_str(), got, want, rel, tol);
    CHECK(rel <= tol, line, "%s", "out of tolerance");
}

// calls f(name, offset, count) for every trainable tensor of the flat gradient
// buffer: LoRA's A and B per layer and module, or each base weight per layer
template <typename F> void for_each_trainable(const HostModel *h, F f) {
    char name[200];
    if (h->use_lora) {
        const LoRA *l = &h->lora;
        for (int i = 0; i < l->n_layers; i++)
            for (int t = 0; t < LORA_N_TARGETS; t++)
                for (int k = 0; k < lora_n_kinds(l) && lora_trains(l, i, t); k++) { // A, B (DoRA: m); prompt, gate
                    lora_key(l, name, sizeof name, i, t, k);
                    size_t n = lora_tensor_numel(l, t, k);
                    f(name, (size_t)(lora_tensor(l, l->params, i, t, k) - l->params), n);
                }
        for (int k = 0; k < lora_n_saved(l); k++) { // --trainable_params' whole tensors, after the adapter
            int64_t n;
            if (!lora_saved(l, l->params, k, &n)) continue;
            lora_saved_key(l->n_layers, k, name, sizeof name);
            f(name, (size_t)lora_saved_at(l, k), (size_t)n);
        }
        return;
    }
    for (int u = h->frozen_units; u < h->units.n_units; u++) // the units that train (a tied head is the embedding)
        for (int j = 0; j < h->units.units[u].n_tensors; j++) {
            const FsdpTensor *t = &h->units.units[u].tensors[j];
            f(t->name, model_tensor_offset_from(&h->config, h->frozen_units, u, j), t->numel);
        }
}

// A fresh --trainable_params starts as the base (its copies model_saved_copy's): the CPU twin's
// logits bit for bit those of the same run without it, whose forward reads the base's own
// tensors. The GPU, seeded as its base streams, is then judged against that CPU run.
void check_seeded(Pair &pair, const std::string &name, const std::vector<int> &tokens, const std::vector<int> &targets,
                  const std::vector<float> &logits) {
    std::vector<std::string> args;
    for (size_t i = 0; i < pair.args[0].size(); i++) {
        if (pair.args[0][i] == "--trainable_params") { i++; continue; }
        args.push_back(pair.args[0][i]);
    }
    std::vector<char *> argv;
    for (std::string &a : args) argv.push_back(&a[0]);
    const int T = (int)tokens.size() / B;
    void *plain = cpu_new((int)argv.size(), argv.data(), B, T);
    std::vector<float> want(logits.size());
    cpu_forward(plain, tokens.data(), targets.data(), B, T, want.data());
    cpu_free(plain);
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); i++) differ += memcmp(&want[i], &logits[i], sizeof(float)) != 0;
    char line[512];
    snprintf(line, sizeof line, "%s: the trained copies start as the base (the CPU's logits without them: %zu of %zu differ)",
             name.c_str(), differ, want.size());
    CHECK(differ == 0, line, "%s", "not bit-identical");
}

// logits and loss (no dropout), then the loss and every gradient of a training micro-batch;
// without with_logits the evaluation loss alone (logits too large to copy back)
void check_case(const Case &c, bool with_logits = true) {
    std::string name = describe(c);
    if (filtered_out(c, name)) return;
    if (c.ckpt && !with_logits) die("internal: the activation checkpointing check compares logits");
    const Tol &tol = tol_of(c.precision);
    const int T = c.T;
    Pair pair(c);
    int V = pair.host()->config.vocab_size;
    std::vector<int> tokens(B * T), targets(B * T);
    int labels = make_batch(7, V, T, tokens.data(), targets.data());
    size_t n_logits = with_logits ? (size_t)B * T * V : 0;
    std::vector<float> logits_cpu(n_logits), logits_gpu(n_logits);
    double loss_cpu = cpu_forward(pair.cpu, tokens.data(), targets.data(), B, T, with_logits ? logits_cpu.data() : NULL);
    double loss_gpu = 0, eval_gpu = 0;
    if (with_logits) {
        loss_gpu = eval_gpu = gpu_forward(pair.gpu, tokens.data(), targets.data(), B, T, logits_gpu.data());
        check_scalar(name + ": evaluation loss", loss_gpu, loss_cpu, tol.loss);
        check_tensor(name + ": logits", logits_gpu.data(), logits_cpu.data(), n_logits, tol.logits);
    }
    if (c.trainable && with_logits && strcmp(c.trainable, "embed,norm")) check_seeded(pair, name, tokens, targets, logits_cpu);
    // without logits the head runs on the positions with a target only, as in the trainer's evaluation
    check_scalar(name + ": evaluation loss without logits", gpu_forward(pair.gpu, tokens.data(), targets.data(), B, T, NULL),
                 loss_cpu, tol.loss);
    float scale = 1.0f / labels;
    loss_cpu = cpu_forward_backward(pair.cpu, tokens.data(), targets.data(), B, T, scale, 99);
    float loss_scale = loss_scale_of(c.precision);
    loss_gpu = gpu_forward_backward(pair.gpu, tokens.data(), targets.data(), B, T, scale * loss_scale, 99);
    check_scalar(name + ": training loss", loss_gpu, loss_cpu, tol.loss);
    size_t n = cpu_grads(pair.cpu, NULL);
    std::vector<float> grads_cpu(n), grads_gpu(n);
    cpu_grads(pair.cpu, grads_cpu.data());
    if (gpu_grads(pair.gpu, grads_gpu.data()) != n) die("the backends disagree on the number of trainable parameters");
    std::vector<float> grads_scaled = grads_gpu; // as the backward left them (the bitwise comparison below)
    for (float &g : grads_gpu) g /= loss_scale;
    // every tensor's worst element on a line of its own; one check for the worst tensor
    double worst = -1;
    std::string worst_name;
    for_each_trainable(pair.host(), [&](const char *tensor, size_t off, size_t count) {
        Diff d = diff(grads_gpu.data() + off, grads_cpu.data() + off, count);
        printf("    %s grad %s: worst at %zu: gpu %.7g cpu %.7g, err %.2e of max %.3g\n", name.c_str(), tensor, d.at,
               d.got, d.want, d.rel, d.scale);
        if (!(d.rel <= worst)) { worst = d.rel; worst_name = tensor; }
    });
    char line[512];
    snprintf(line, sizeof line, "%s: every gradient (worst %s: err %.2e of its max, tol %.0e)", name.c_str(),
             worst_name.c_str(), worst, tol.grads);
    CHECK(worst <= tol.grads, line, "%s", "out of tolerance");
    if (c.ckpt) { // the same CUDA run without activation checkpointing: the same bits
        Case plain = c;
        plain.ckpt = false;
        Pair ref(plain);
        std::vector<float> logits_ref((size_t)B * T * V), grads_ref(n);
        double eval_ref = gpu_forward(ref.gpu, tokens.data(), targets.data(), B, T, logits_ref.data());
        double train_ref = gpu_forward_backward(ref.gpu, tokens.data(), targets.data(), B, T, scale * loss_scale, 99);
        gpu_grads(ref.gpu, grads_ref.data());
        bool same_loss = !memcmp(&eval_ref, &eval_gpu, sizeof eval_ref) && !memcmp(&train_ref, &loss_gpu, sizeof train_ref);
        size_t dl = 0, dg = 0;
        for (size_t i = 0; i < logits_ref.size(); i++) dl += memcmp(&logits_ref[i], &logits_gpu[i], sizeof(float)) != 0;
        for (size_t i = 0; i < n; i++) dg += memcmp(&grads_ref[i], &grads_scaled[i], sizeof(float)) != 0;
        snprintf(line, sizeof line, "%s: the bits of the run without it (losses %s, %zu logits and %zu of %zu gradients differ)",
                 name.c_str(), same_loss ? "equal" : "differ", dl, dg, n);
        CHECK(same_loss && dl == 0 && dg == 0, line, "%s", "not bit-identical");
    }
}

// QLoRA's dequantize scratch holds one linear weight at a time (each dequantized just before its
// product): the biggest, gate's, up's and down's (H, D), then the two norms' places of D, each place
// 256-byte aligned (wk and wv, side by side for llama_adapter, fit in the biggest here). A whole
// layer's, as before, would be 4 (D, D)-sized and 3 (H, D) weights: 4.4 times that at tiny_qlora.
void check_dequant_scratch(const Case &c) {
    std::string name = describe(c);
    if (filtered_out(c, name)) return;
    Pair pair(c);
    const Config *cf = &pair.host()->config;
    size_t a = 256 / sizeof(bf16), D = cf->dim, up = ceil_div((size_t)cf->hidden_dim * D, a) * a; // (elements)
    size_t want = (up + ceil_div(D, a) * a + D) * sizeof(bf16), got = model_dequant_scratch_bytes(&((Twin *)pair.gpu)->m);
    CHECK(got == want, (name + ": the dequantize scratch is one projection's (and two norms')").c_str(), "%zu bytes, not %zu", got, want);
}

// optimizer steps, each on `micro` micro-batches of its own: losses and gradient norms
void check_steps(const Case &c, int steps, int optimizer = ADAMW, int micro = 1) {
    std::string name = describe(c, optimizer);
    if (filtered_out(c, name)) return;
    const Tol &tol = c.kahan >= 0 ? PURE_BF16_TOL : tol_of(c.precision);
    const int T = c.T;
    Pair pair(c, optimizer);
    int V = pair.host()->config.vocab_size;
    std::vector<int> tokens(micro * B * T), targets(micro * B * T);
    double worst_loss = 0, worst_norm = 0;
    int at_loss = 0, at_norm = 0;
    std::vector<double> loss_cpu(steps), loss_gpu(steps);
    for (int s = 0; s < steps; s++) {
        int labels = 0;
        for (int k = 0; k < micro; k++) labels += make_batch(100 + s + 1000 * k, V, T, &tokens[k * B * T], &targets[k * B * T]);
        double norm_cpu, norm_gpu;
        // fp16: the scale alternates 2^16, 2^15 as a backoff would change it, on both sides (exact in
        // fp32): AdamW is blind to a constant factor on every gradient, not to one that changes,
        // so a step that did not unscale would show
        float loss_scale = loss_scale_of(c.precision) / (s % 2 ? 2.0f : 1.0f);
        loss_cpu[s] = cpu_step(pair.cpu, tokens.data(), targets.data(), B, T, 1.0f / labels, 1000 + s, loss_scale,
                               &norm_cpu, micro);
        loss_gpu[s] = gpu_step(pair.gpu, tokens.data(), targets.data(), B, T, 1.0f / labels, 1000 + s, loss_scale,
                               &norm_gpu, micro);
        double el = fabs(loss_gpu[s] - loss_cpu[s]) / fabs(loss_cpu[s]), en = fabs(norm_gpu - norm_cpu) / norm_cpu;
        printf("    %s step %d: loss gpu %.9g cpu %.9g, grad norm gpu %.9g cpu %.9g\n", name.c_str(), s + 1,
               loss_gpu[s], loss_cpu[s], norm_gpu, norm_cpu);
        if (!(el <= worst_loss)) { worst_loss = el; at_loss = s; }
        if (!(en <= worst_norm)) { worst_norm = en; at_norm = s; }
    }
    char line[512];
    snprintf(line, sizeof line, "%s: %d steps of losses (worst step %d: gpu %.9g cpu %.9g, rel err %.2e, tol %.0e)",
             name.c_str(), steps, at_loss + 1, loss_gpu[at_loss], loss_cpu[at_loss], worst_loss, tol.steps);
    CHECK(worst_loss <= tol.steps, line, "%s", "out of tolerance");
    snprintf(line, sizeof line, "%s: %d steps of gradient norms (worst step %d: rel err %.2e, tol %.0e)", name.c_str(),
             steps, at_norm + 1, worst_norm, tol.norms);
    CHECK(worst_norm <= tol.norms, line, "%s", "out of tolerance");
}

// Preference tuning's hooks (trainer.h's contract, docs/preference.md) on one pair (row 0 chosen, row
// 1 rejected) whose rows share their first S tokens, unlabelled: each target's cross-entropy
// (target_losses) and the gradients of the loss weighted per target (loss_weights, both signs, as
// DPO's) against the CPU twin, within the case's forward and gradient tolerances; the prompt run once
// (shared_prompt S) against two rows, both sides, and the GPU's against the CPU's: the dK, dV of the
// prompt summed before its backward instead of after, so fp32 rounding (1e-5 the losses, 1e-4 the
// gradients, check_case's; in keep mode, chunks of 8 make one more chunk than the capacity's 3, which
// slots_place lays out by their real sizes, and with S = 1 in bf16 the last of them beside the slots' room);
// and the reference (model_reference_swap): after a step,
// swapped in, the forward gives the starting losses bit for bit, and swapped back it does not.
void check_preference(Case c, int S) {
    c.dpo = true;
    std::string name = "preference S=" + std::to_string(S) + " " + describe(c);
    if (filtered_out(c, name)) return;
    const Tol &tol = tol_of(c.precision);
    const int T = c.T;
    Pair pair(c);
    cpu_set_lora_dropout(pair.cpu, 0.0f), gpu_set_lora_dropout(pair.gpu, 0.0f); // (a shared prompt's rows draw one mask)
    int V = pair.host()->config.vocab_size;
    std::vector<int> tokens(B * T), targets(B * T);
    make_batch(7, V, T, tokens.data(), targets.data());
    std::vector<float> weights(B * T);
    for (int t = 0; t < S; t++) tokens[T + t] = tokens[t], targets[t] = targets[T + t] = -100;
    int labels = 0;
    for (int i = 0; i < B * T; i++) {
        weights[i] = targets[i] < 0 ? 0.0f : (i < T ? 1.0f : -1.0f) * (0.5f + 0.25f * (i % 3));
        labels += targets[i] >= 0;
    }
    // [side][shared]: each target's cross-entropy, then the weighted gradients
    std::vector<double> losses[2][2];
    std::vector<float> grads[2][2];
    size_t n = cpu_grads(pair.cpu, NULL);
    for (int side = 0; side < 2; side++)
        for (int shared = 0; shared < 2; shared++) {
            void *twin = side ? pair.gpu : pair.cpu;
            losses[side][shared].assign(B * T, 0.0);
            grads[side][shared].resize(n);
            (side ? gpu_set_preference : cpu_set_preference)(twin, NULL, losses[side][shared].data(), shared ? S : 0);
            (side ? gpu_forward : cpu_forward)(twin, tokens.data(), targets.data(), B, T, NULL);
            (side ? gpu_set_preference : cpu_set_preference)(twin, weights.data(), NULL, shared ? S : 0);
            float scale = 1.0f / labels * (side ? loss_scale_of(c.precision) : 1.0f);
            (side ? gpu_forward_backward : cpu_forward_backward)(twin, tokens.data(), targets.data(), B, T, scale, 99);
            (side ? gpu_grads : cpu_grads)(twin, grads[side][shared].data());
            if (side) for (float &g : grads[side][shared]) g /= loss_scale_of(c.precision);
            (side ? gpu_set_preference : cpu_set_preference)(twin, NULL, NULL, 0);
        }
    auto floats = [](const std::vector<double> &x) { return std::vector<float>(x.begin(), x.end()); };
    const char *how[2] = {"two rows", "the prompt once"};
    for (int shared = 0; shared < 2; shared++) {
        std::vector<float> got = floats(losses[1][shared]), want = floats(losses[0][shared]);
        check_tensor(name + ": each target's loss, " + how[shared], got.data(), want.data(), got.size(), tol.loss);
        check_tensor(name + ": weighted gradients, " + how[shared], grads[1][shared].data(), grads[0][shared].data(), n, tol.grads);
    }
    for (int side = 0; side < 2; side++) {
        std::string who = side ? ": GPU" : ": CPU";
        std::vector<float> once = floats(losses[side][1]), two = floats(losses[side][0]);
        check_tensor(name + who + " the prompt once == two rows, each target's loss", once.data(), two.data(), once.size(), tol.loss);
        check_tensor(name + who + " the prompt once == two rows, weighted gradients", grads[side][1].data(), grads[side][0].data(), n, tol.grads);
    }
    if (!strcmp(c.mem, "keep") && c.chunk && S == 1) { // (the case is chosen to need it: its slack is 1 position)
        size_t beside = ((Twin *)pair.gpu)->m.share_room_bytes;
        CHECK(beside > 0, (name + ": the shared prompt's one more chunk laid out beside the slots' room").c_str(), "%zu bytes", beside);
    }
    // the reference: taken at the first swap, before any step (as the trainer's reference forward)
    std::vector<double> start(B * T), now(B * T);
    auto forward = [&](std::vector<double> &out) {
        gpu_set_preference(pair.gpu, NULL, out.data(), 0);
        gpu_forward(pair.gpu, tokens.data(), targets.data(), B, T, NULL);
        gpu_set_preference(pair.gpu, NULL, NULL, 0);
    };
    forward(start);
    gpu_reference_swap(pair.gpu), gpu_reference_swap(pair.gpu);
    double norm;
    gpu_step(pair.gpu, tokens.data(), targets.data(), B, T, 1.0f / labels, 7, loss_scale_of(c.precision), &norm, 1);
    gpu_reference_swap(pair.gpu);
    forward(now);
    bool same = !memcmp(start.data(), now.data(), start.size() * sizeof(double));
    gpu_reference_swap(pair.gpu);
    forward(now);
    bool moved = memcmp(start.data(), now.data(), start.size() * sizeof(double)) != 0;
    CHECK(same && moved, (name + ": after a step the reference swapped in gives the starting losses bit for bit, swapped back not").c_str(),
          "swapped in: %s; swapped back: %s", same ? "the same" : "differ", moved ? "moved" : "the same");
}

// The start-up refusal of bf16 on GPUs without it (precision_supported, which
// check_precision asks about this process's GPU): compute capability 7.0 (V100)
// and 7.5 (T4) refuse bf16, naming the GPU and suggesting fp16; they run fp16
// and fp32; 8.0 and 9.0 run bf16.
void check_precision_refusal() {
    struct { const char *precision; int major, minor; const char *gpu; bool ok; } cases[] = {
        {"bf16", 7, 0, "Tesla V100-SXM2-16GB", false}, {"bf16", 7, 5, "Tesla T4", false},
        {"fp16", 7, 0, "Tesla V100-SXM2-16GB", true},  {"fp16", 7, 5, "Tesla T4", true},
        {"fp32", 7, 5, "Tesla T4", true},              {"bf16", 8, 0, "NVIDIA A100-SXM4-80GB", true},
        {"bf16", 9, 0, "NVIDIA H100 80GB HBM3", true}};
    for (auto &c : cases) {
        char msg[512] = "", what[256];
        int rc = precision_supported(c.precision, c.major, c.minor, c.gpu, msg, sizeof msg);
        bool says = c.ok || (strstr(msg, c.gpu) && strstr(msg, "--precision fp16"));
        snprintf(what, sizeof what, "--precision %s on %s (%d.%d): %s", c.precision, c.gpu, c.major, c.minor,
                 c.ok ? "runs" : "refused, naming the GPU and suggesting --precision fp16");
        CHECK((rc == 0) == c.ok && says, what, "rc %d, message '%s'", rc, msg);
    }
}

// A model with head_dim hd (2 query heads, 1 KV head: GQA; hidden 2 hd, intermediate 4 hd)
// and an adapter for it with every B != 0, as the fixtures have: bf16 attention runs on
// tensor cores for head_dim 64 or 128 only, and the fixtures' is 16.
void write_tc_model(const char *dir, int hd) {
    write_random_model(dir, 2 * hd, 4 * hd, 2, 2, 1, 512);
    HostModel h;
    memset(&h, 0, sizeof h);
    if (model_load(&h, dir) != 0) die("cannot read back %s", dir);
    int in[LORA_N_TARGETS], out[LORA_N_TARGETS];
    lora_shapes(&h.config, in, out);
    LoRA l;
    lora_alloc(&l, h.config.n_layers, in, out, 4, 8.0f, 0.0f, 0, 0, (1u << LORA_N_TARGETS) - 1);
    lora_init(&l, 5);
    uint64_t state = 9;
    for (int i = 0; i < l.n_layers; i++)
        for (int t = 0; t < LORA_N_TARGETS; t++)
            for (int k = 0; k < l.r * l.out[t]; k++) lora_B(&l, l.params, i, t)[k] = 0.2f * (rng_uniform(&state) - 0.5f);
    std::string adapter = std::string(dir) + "/peft_init";
    if (lora_save_peft(&l, adapter.c_str(), dir) != 0) die("cannot write %s", adapter.c_str());
    lora_free(&l);
    host_model_free(&h);
}

// the model of folder from in folder to, with "sliding_window": W (Mistral's) in
// its config.json; the other files are links to from's
void windowed_copy(const char *from, const char *to, int W) {
    if (mkdir_p(to) != 0) die("mkdir %s", to);
    char *abs_from = realpath(from, NULL);
    if (!abs_from) die("%s: %s", from, strerror(errno));
    for (const char *name : {"model.safetensors", "tokenizer.model", "peft_init"}) {
        std::string src = std::string(abs_from) + "/" + name, dst = std::string(to) + "/" + name;
        if (access(src.c_str(), F_OK) == 0 && symlink(src.c_str(), dst.c_str()) != 0) die("link %s: %s", dst.c_str(), strerror(errno));
    }
    free(abs_from);
    std::string path = std::string(from) + "/config.json";
    size_t len;
    char *text = read_file(path.c_str(), &len);
    if (!text || text[0] != '{') die("cannot read %s", path.c_str());
    std::string json = "{\"sliding_window\": " + std::to_string(W) + ", " + std::string(text + 1, len - 1);
    free(text);
    path = std::string(to) + "/config.json";
    if (write_bytes_atomic(path.c_str(), json.data(), json.size()) != 0) die("cannot write %s", path.c_str());
}

// the window binds: on the same weights and batch, both backends' losses differ from the causal model's
void check_window_binds(const char *causal, const char *windowed) {
    double loss[2][2]; // [causal, windowed][cpu, gpu]
    const int T = T_DEFAULT;
    const char *models[2] = {causal, windowed};
    for (int w = 0; w < 2; w++) {
        Pair pair({models[w], false, "fp32", 0, "keep", 1, false});
        int V = pair.host()->config.vocab_size;
        std::vector<int> tokens(B * T), targets(B * T);
        std::vector<float> logits((size_t)B * T * V);
        make_batch(7, V, T, tokens.data(), targets.data());
        loss[w][0] = cpu_forward(pair.cpu, tokens.data(), targets.data(), B, T, logits.data());
        loss[w][1] = gpu_forward(pair.gpu, tokens.data(), targets.data(), B, T, logits.data());
    }
    char line[300];
    snprintf(line, sizeof line, "the sliding window binds: loss with it cpu %.9g gpu %.9g, without cpu %.9g gpu %.9g",
             loss[1][0], loss[1][1], loss[0][0], loss[0][1]);
    CHECK(loss[1][0] != loss[0][0] && loss[1][1] != loss[0][1], line, "%s", "a backend ignores the window");
}

// Logits of more than 2^31 elements, past where an int index would wrap: full fine-tuning
// of a 1-layer model with Llama-2's vocabulary (32000) and width 64 on B rows of T tokens,
// whole, its head in one piece (B * T * 32000 elements: 2.25e9 at T = 35200) and in 4 (each
// under 2^31), in fp32 and bf16, against the CPU twin: the evaluation and training losses
// and every gradient (the head's summed over all B * T rows). GPU only (--big_logits T),
// about 9 GB of logits a side.
void check_big_logits(const char *dir, int T) {
    write_random_model(dir, 64, 128, 1, 4, 2, 32000);
    for (const char *precision : {"fp32", "bf16"})
        for (int pieces : {1, 4}) {
            Case c = {dir, true, precision, 0, "keep", pieces, false};
            c.T = T;
            check_case(c, false);
        }
}

int main(int argc, char **argv) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("SKIP test_llama2cu: no GPU\n");
        return 0;
    }
    // --quick: a few cases with 3 steps; --part i/n: every n-th case from the i-th
    // (0-based), so that n processes share the cases (the emulated build's on n cores)
    bool quick = false;
    int part = 0, parts = 1, big_logits = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--part") && i + 1 < argc && sscanf(argv[i + 1], "%d/%d", &part, &parts) == 2 &&
                 parts > 0 && part >= 0 && part < parts) i++;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) only_precision = argv[++i];
        else if (!strcmp(argv[i], "--big_logits") && i + 1 < argc && (big_logits = atoi(argv[i + 1])) > 0) i++;
        else die("usage: test_llama2cu [--quick] [--part i/n] [--filter TEXT] [--precision fp32|bf16|fp16] [--big_logits T]");
    }
    int case_index = 0;
    auto mine = [&]() { return case_index++ % parts == part; };
    char tmp[] = "/tmp/llama2tune_test_llama2cu_XXXXXX";
    if (!mkdtemp(tmp)) die("mkdtemp: %s", strerror(errno));
    if (big_logits) { // that check alone
        check_big_logits((std::string(tmp) + "/vocab32000").c_str(), big_logits);
        remove_tree(tmp);
        printf("test_llama2cu --big_logits: %d passed, %d failed\n", test_passed, test_failed);
        return test_summary();
    }
    std::string hd64 = std::string(tmp) + "/hd64", windowed = std::string(tmp) + "/tiny_gqa_window5";
    std::string hd64_windowed = std::string(tmp) + "/hd64_window5", hd128 = std::string(tmp) + "/hd128";
    write_tc_model(hd64.c_str(), 64);
    write_tc_model(hd128.c_str(), 128);
    windowed_copy("test/fixtures/tiny_gqa", windowed.c_str(), 5);
    windowed_copy(hd64.c_str(), hd64_windowed.c_str(), 5);
    std::vector<const char *> models = {"test/fixtures/tiny_gqa", hd64.c_str()};
    if (!quick) models.push_back("test/fixtures/tiny_tied");
    if (mine()) check_window_binds("test/fixtures/tiny_gqa", windowed.c_str());
    // preference tuning's hooks: LoRA in kept chunks of 8, prompts of 9 (fp32) and 1 (bf16) (--quick); full fine-tuning whole, and LoRA in bf16
    // in chunks of 7 recomputed, activation checkpointing and 3 output pieces
    for (int S : {9, 1})
        if (mine()) check_preference({"test/fixtures/tiny_gqa", false, S == 1 ? "bf16" : "fp32", 8, "keep", 1, false}, S);
    if (!quick && mine()) check_preference({"test/fixtures/tiny_gqa", true, "fp32", 0, "keep", 1, false}, 9);
    if (!quick && mine()) check_preference({"test/fixtures/tiny_gqa", false, "bf16", 7, "recompute", 3, true}, 9);
    const char *precisions[] = {"fp32", "bf16"};
    // whole sequences; chunks that divide T and one that does not; one position at a time;
    // activation checkpointing with each memory mode (--quick: the first two)
    Case chunkings[] = {{NULL, false, NULL, 0, "keep", 1, false}, {NULL, false, NULL, 7, "recompute", 3, true},
                        {NULL, false, NULL, 8, "keep", 1, false}, {NULL, false, NULL, 7, "recompute", 3, false},
                        {NULL, false, NULL, 1, "recompute", 1, false}, {NULL, false, NULL, 0, "keep", 1, true},
                        {NULL, false, NULL, 5, "keep", 2, true}};
    int n_chunkings = quick ? 2 : 7, steps = quick ? 3 : 10;
    for (size_t mi = 0; mi < models.size(); mi++)
        for (const char *precision : precisions)
            for (int full = 0; full < 2; full++) {
                for (int k = 0; k < n_chunkings; k++) {
                    Case c = chunkings[k];
                    c.model = models[mi]; c.full = full; c.precision = precision;
                    if (mine()) check_case(c);
                }
                Case whole = {models[mi], (bool)full, precision, 0, "keep", 1, false};
                Case chunked = {models[mi], (bool)full, precision, 5, "recompute", 1, false};
                Case checkpointed = {models[mi], (bool)full, precision, 5, "keep", 1, true};
                if (mine()) check_steps(whole, steps);
                if (mine()) check_steps(chunked, steps);
                if (mine()) check_steps(checkpointed, steps);
            }
    // Several attention tiles (SIMT's of 32, the tensor cores' of 64) in rows of 200 tokens, a
    // multiple of neither: whole, and in recomputed chunks of 72 (the head in 3 pieces), whose
    // queries start inside a tile and see a KV carry of up to 144 keys; on tiny_gqa (SIMT) and
    // the head_dim-64 and -128 models (bf16 on tensor cores; 128 is Llama-2-7B's head_dim)
    for (const std::string &model : {std::string("test/fixtures/tiny_gqa"), hd64, hd128})
        for (const char *precision : precisions) {
            Case whole = {model.c_str(), false, precision, 0, "keep", 1, false};
            Case chunked = {model.c_str(), false, precision, 72, "recompute", 3, false};
            whole.T = chunked.T = 200;
            if (!quick && mine()) check_case(whole);
            if (mine()) check_case(chunked);
        }
    // With the window: whole, in chunks of 7 (longer than it; activation checkpointing) and of
    // 1 (shorter; not --quick), and for tiny_gqa 10 steps whole and in chunks of 5 (its length).
    // The head_dim-64 model (bf16 on tensor cores) in single micro-batches only: on this random
    // model (weights +-0.02, gradient norms ~0.008) bf16's rounding, amplified by AdamW, moves
    // step 9's gradient norm 0.22 from the CPU's, with the SIMT kernels as with tensor cores
    // (emulated), where the model without the window stays within 0.03 (0.08 on SIMT): past
    // the bf16 estimate of 0.1, for the model, not the kernels, whose single steps agree as
    // the causal model's do.
    for (const std::string &model : {windowed, hd64_windowed})
        for (const char *precision : precisions)
            for (int full = 0; full < 2; full++) {
                for (int k : {0, 1, 4}) {
                    Case c = chunkings[k];
                    c.model = model.c_str(); c.full = full; c.precision = precision;
                    if ((k != 4 || !quick) && mine()) check_case(c);
                }
                Case whole = {model.c_str(), (bool)full, precision, 0, "keep", 1, false};
                Case chunked = {model.c_str(), (bool)full, precision, 5, "recompute", 1, false};
                if (model == windowed && mine()) check_steps(whole, steps);
                if (model == windowed && mine()) check_steps(chunked, steps);
            }
    // --s2_attn 1: groups of T/4 (6 positions in rows of 24: cut by chunks of 7 and 1, whose queries
    // see the carry only within their group), tiny_gqa (SIMT) and the head_dim-64 model (bf16 on
    // tensor cores); rows of 200 (groups of 50, shifted by 25, across the 32- and 64-key tiles) whole
    // and in chunks of 72; 10 steps of tiny_gqa whole and in chunks of 5
    for (const std::string &model : {std::string("test/fixtures/tiny_gqa"), hd64})
        for (const char *precision : precisions)
            for (int full = 0; full < 2; full++) {
                for (int k : {0, 1, 4}) {
                    Case c = chunkings[k];
                    c.model = model.c_str(); c.full = full; c.precision = precision; c.s2 = true;
                    if ((k != 4 || !quick) && mine()) check_case(c);
                }
                Case whole = {model.c_str(), (bool)full, precision, 0, "keep", 1, false};
                Case chunked = {model.c_str(), (bool)full, precision, 72, "recompute", 3, false};
                whole.T = chunked.T = 200;
                whole.s2 = chunked.s2 = true;
                if (!full && !quick && mine()) check_case(whole);
                if (!full && mine()) check_case(chunked);
                Case steps_whole = {model.c_str(), (bool)full, precision, 0, "keep", 1, false};
                Case steps_chunked = {model.c_str(), (bool)full, precision, 5, "recompute", 1, false};
                steps_whole.s2 = steps_chunked.s2 = true;
                if (model != hd64 && mine()) check_steps(steps_whole, steps);
                if (model != hd64 && mine()) check_steps(steps_chunked, steps);
            }
    // DoRA (peft's adapter of tiny_gqa, dropout 0.1): whole and in chunks with activation
    // checkpointing, and 10 steps whole and in chunks, in each precision
    for (const char *precision : precisions) {
        Case dora[] = {{"test/fixtures/tiny_gqa", false, precision, 0, "keep", 1, false, true},
                       {"test/fixtures/tiny_gqa", false, precision, 7, "recompute", 3, true, true}};
        for (const Case &c : dora)
            if (mine()) check_case(c);
        Case chunked = {"test/fixtures/tiny_gqa", false, precision, 5, "recompute", 1, false, true};
        if (mine()) check_steps(dora[0], steps);
        if (!quick && mine()) check_steps(chunked, steps);
    }
    // an adapter (set on each case) of model in precision: a micro-batch whole and in chunks of 7
    // with activation checkpointing (the head in 3 pieces), 10 steps whole and in recomputed
    // chunks of 5; --quick runs the micro-batches of the main ones (main) and tiny_gqa's steps
    auto check_adapter = [&](const char *model, const char *precision, bool main, const auto &set) {
        Case whole = {model, false, precision, 0, "keep", 1, false}, chunked = {model, false, precision, 7, "recompute", 3, true};
        Case steps_chunked = {model, false, precision, 5, "recompute", 1, false};
        set(whole), set(chunked), set(steps_chunked);
        bool gqa = !strcmp(model, "test/fixtures/tiny_gqa");
        if (mine()) check_case(whole);
        if ((main || !quick) && mine()) check_case(chunked);
        if ((!quick || (main && gqa)) && mine()) check_steps(whole, steps);
        if (main && !quick && mine()) check_steps(steps_chunked, steps);
    };
    // --trainable_params (LoRA, dropout 0.1): embed,norm from each fixture's trainable/peft_init (tiny_tied:
    // the trained embedding is the head too), embed and norm alone on a fresh adapter (the copies seeded
    // from the base as it streams to the GPU), in each precision; embed,norm in fp16 too
    for (const char *trainable : {"embed,norm", "embed", "norm"})
        for (const char *model : {"test/fixtures/tiny_gqa", "test/fixtures/tiny_tied"})
            for (const char *precision : precisions)
                check_adapter(model, precision, !strcmp(trainable, "embed,norm"), [&](Case &c) { c.trainable = trainable; });
    for (const char *model : {"test/fixtures/tiny_gqa", "test/fixtures/tiny_tied"}) { // and fp16 (loss scaling), whole
        Case whole = {model, false, "fp16", 0, "keep", 1, false};
        whole.trainable = "embed,norm";
        if (mine()) check_case(whole);
        if (!quick && mine()) check_steps(whole, steps);
    }
    // IA3 (peft's adapters of tiny_gqa, and of tiny_tied with gate_proj and down_proj
    // feedforward and o_proj) and llama_adapter (peft's prompts, gates off 0: tiny_gqa's top
    // layer, GQA; both of tiny_tied's) and prefix (peft's N(0, 1) keys and values, 3 and 5
    // virtual positions), in each precision
    for (const char *method : {"ia3", "llama_adapter", "prefix"})
        for (const char *model : {"test/fixtures/tiny_gqa", "test/fixtures/tiny_tied"})
            for (const char *precision : precisions)
                check_adapter(model, precision, true, [&](Case &c) { c.method = method; });
    // each family's fixture a few cases (the emulated suite runs them all)
    Case families[] = {{"test/fixtures/tiny_llama3", false, "fp32", 0, "keep", 1, false},
                       {"test/fixtures/tiny_llama3", true, "fp32", 7, "recompute", 3, true},
                       {"test/fixtures/tiny_llama3", false, "bf16", 5, "keep", 1, false},
                       {"test/fixtures/tiny_codellama", false, "fp32", 0, "keep", 1, false},
                       {"test/fixtures/tiny_codellama", true, "bf16", 7, "recompute", 3, false}};
    for (const Case &c : families)
        if (!quick && mine()) check_case(c);
    Case llama3_steps = {"test/fixtures/tiny_llama3", true, "fp32", 5, "recompute", 1, false};
    if (!quick && mine()) check_steps(llama3_steps, steps);
    // --freeze_layers 1 (the embedding and layer 0 frozen; tied: the head with them): one micro-batch
    // whole, and steps in recomputed chunks of 5, against the CPU twin (itself against transformers)
    for (const char *model : {"test/fixtures/tiny_gqa", "test/fixtures/tiny_tied"})
        for (const char *precision : precisions) {
            Case whole = {model, true, precision, 0, "keep", 1, false}, chunked = {model, true, precision, 5, "recompute", 1, false};
            whole.freeze = chunked.freeze = 1;
            if ((!quick || !strcmp(model, "test/fixtures/tiny_gqa")) && mine()) check_case(whole);
            if ((!quick || !strcmp(model, "test/fixtures/tiny_gqa")) && mine()) check_steps(chunked, steps);
        }
    // SGD, momentum and Nesterov momentum: steps whole (LoRA and full) and in chunks (full)
    for (const char *precision : precisions)
        for (int optimizer : {SGD_MOMENTUM, SGD_NESTEROV}) {
            Case lora = {"test/fixtures/tiny_gqa", false, precision, 0, "keep", 1, false};
            Case full = {"test/fixtures/tiny_gqa", true, precision, 5, "recompute", 1, false};
            if (!quick && mine()) check_steps(lora, steps, optimizer);
            if (!quick && mine()) check_steps(full, steps, optimizer);
        }
    // fp16 (V100, T4): tiny_gqa (SIMT attention) and the head_dim-64 model (fp16 tensor
    // cores), LoRA and full, whole and in chunks with activation checkpointing, and steps
    for (const char *model : {"test/fixtures/tiny_gqa", hd64.c_str()})
        for (int full = 0; full < 2; full++) {
            for (int k : {0, 1}) {
                Case c = chunkings[k];
                c.model = model; c.full = full; c.precision = "fp16";
                if (mine()) check_case(c);
            }
            Case whole = {model, (bool)full, "fp16", 0, "keep", 1, false};
            if (mine()) check_steps(whole, steps);
        }
    // --pure_bf16 1 --optimizer anyprecision (llama-recipes' pure bf16; the CPU twin itself against
    // llama-recipes, test_llama2): bf16 weights, gradients and AnyPrecisionAdamW state, Kahan
    // summation off and on; 10 steps of 2 micro-batches (each micro-batch's gradient rounded and
    // added into the step's bf16 one), whole (each unit's gradient rounded as its backward ends)
    // and in recomputed chunks of 5 (a micro-batch's fp32 sum over its chunks rounded at its
    // end), within PURE_BF16_TOL: the GPU computes in bf16, the CPU in fp32 from the same bf16
    // weights (measured: losses within 2.6e-4, the first step's 1.9e-4 already, norms within
    // 2.0e-3; tolerances 1e-3 and 1e-2). That noise hides a single wrong rounding (a micro-batch's
    // gradient added unrounded moved nothing outside it): dev/cuda/elementwise's bit-for-bit
    // checks of round_bf16 and grads_bf16_add carry the rules; and with --freeze_layers 1 (the trained weights then runs of the whole bf16
    // weights, the frozen ones never written), whole, Kahan summation on
    for (int kahan : {0, 1})
        for (int chunk : {0, 5}) {
            Case c = {"test/fixtures/tiny_gqa", true, "bf16", chunk, chunk ? "recompute" : "keep", 1, false};
            c.kahan = kahan;
            if (mine()) check_steps(c, steps, ADAMW, 2);
        }
    Case pure_frozen = {"test/fixtures/tiny_gqa", true, "bf16", 0, "keep", 1, false};
    pure_frozen.kahan = 1;
    pure_frozen.freeze = 1;
    if (!quick && mine()) check_steps(pure_frozen, steps, ADAMW, 2);
    if (mine()) check_precision_refusal();
    // QLoRA (tiny_qlora's peft adapter on all seven linear layers, dropout 0.1): the 4-bit
    // weights dequantize to the CPU's exactly in fp32 and to their bf16 rounding (dev/cuda/dequant),
    // which is what LoRA's bf16 cases round the weights to as they upload, so the same
    // tolerances hold. NF4 and FP4, whole, in chunks with activation checkpointing (each
    // chunk's layers dequantized again), and 10 steps.
    for (const char *precision : precisions)
        for (const char *type : {"nf4", "fp4"}) {
            Case whole = {"test/fixtures/tiny_qlora", false, precision, 0, "keep", 1, false, false, type};
            Case chunked = {"test/fixtures/tiny_qlora", false, precision, 7, "recompute", 3, true, false, type};
            if (mine()) check_case(whole);
            if (mine()) check_case(chunked);
            if ((!quick || !strcmp(type, "nf4")) && mine()) check_steps(whole, steps);
            if (!strcmp(precision, "bf16") && !strcmp(type, "nf4") && mine()) check_dequant_scratch(whole);
        }
    // IA3 (every module, down_proj feedforward), llama_adapter (a prompt in both layers) and
    // prefix (4 virtual positions) on the 4-bit base: their products read the dequantized
    // weights as LoRA's do; one micro-batch and 10 steps, in each precision
    for (const char *method : {"ia3", "llama_adapter", "prefix"})
        for (const char *precision : precisions) {
            Case whole = {"test/fixtures/tiny_qlora", false, precision, 0, "keep", 1, false, false, "nf4"};
            whole.method = method;
            if (mine()) check_case(whole);
            if (!quick && mine()) check_steps(whole, steps);
        }
    remove_tree(tmp);
    printf("test_llama2cu: %d passed, %d failed\n", test_passed, test_failed);
    return test_summary();
}
