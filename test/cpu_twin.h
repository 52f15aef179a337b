// The CPU twin (train_llama2.c) for test/test_llama2cu.cu: test/twin.h's calls
// bound to the CPU backend, exported by test/cpu_twin.c under cpu_* names so
// that they live in one process with the CUDA trainer's same-named functions.
#ifndef CPU_TWIN_H
#define CPU_TWIN_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
void *cpu_new(int argc, char **argv, int B, int T);
void cpu_free(void *p);
void cpu_set_lora_dropout(void *p, float dropout);
double cpu_forward(void *p, const int *tokens, const int *targets, int B, int T, float *logits);
double cpu_forward_backward(void *p, const int *tokens, const int *targets, int B, int T, float grad_scale, uint64_t key);
double cpu_step(void *p, const int *tokens, const int *targets, int B, int T, float grad_scale, uint64_t key,
                float loss_scale, double *norm, int micro);
size_t cpu_grads(void *p, float *out);
void cpu_set_preference(void *p, const float *weights, double *losses, int shared);
void cpu_reference_swap(void *p);
#ifdef __cplusplus
}
#endif
#endif
