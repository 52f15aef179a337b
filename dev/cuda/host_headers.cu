// Every host header the CUDA trainer includes, compiled as C++17 by nvcc with
// the project's warnings-as-errors flags (make cuda, dev/cuda/compile_check.sh),
// so C that C++ rejects (an unconverted malloc, restrict, a string literal as
// char *, a goto over an initialisation) cannot creep into shared code.
// The declarations stand in for what a backend defines before the headers
// that use it (trainer.h's contract); this file is compiled, never linked.
#include <stddef.h>
#include <stdint.h>
void matmul_forward(float *out, const float *inp, const float *weight, int N, int I, int O, float alpha, int accumulate);
void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, int N,
                     int I, int O, float alpha);
#include "../../utils.h"
#include "../../json.h"
#include "../../safetensors.h"
#include "../../tokenizer.h"
#include "../../lora.h"
#include "../../model.h"
#include "../../dataloader.h"
#include "../../checkpoint.h"
#include "../../default_model.h"

typedef struct {
    HostModel host;
    int B, T, chunk_size, recompute;
    size_t act_bytes, carry_bytes;
    uint64_t dropout_key;
} Model;
typedef struct { size_t n; int t; float *m, *v; } Optimizer;
void model_alloc(Model *m, int B, int T, int C, int recompute, int num_output_chunks);
void model_free(Model *m);
double model_forward(Model *m, const int *tokens, const int *targets, int B, int T, float *logits_out);
double model_forward_backward(Model *m, const int *tokens, const int *targets, int B, int T, float grad_scale);
float *model_next_logits(Model *m, const int *seq, const Chunk *ch);
void optimizer_init(Optimizer *o, Model *m);
void optimizer_free(Optimizer *o);
void optimizer_zero_grad(Optimizer *o);
double optimizer_step(Optimizer *o, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip, int update);
void model_sync_host(Model *m, Optimizer *o);
void optimizer_sync_device(Optimizer *o);
#include "../../trainer.h"

// every static function of the headers is used from here, as in the CUDA
// trainer (so none is reported unused): the host side through train_main,
// the LoRA pieces a backend's linear layers call by themselves
int host_headers_main(int argc, char **argv) { return train_main(argc, argv); }
extern const void *const host_headers_backend_pieces[] = {(const void *)&lora_forward, (const void *)&lora_backward};
