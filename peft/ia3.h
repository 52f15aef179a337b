// IA3's forward and backward on the CPU (lora.h's top says the maths and the layout):
// the twins of peft/ia3.cuh, on DoRA's elementwise pieces (dora_scale,
// dora_magnitude_backward) with norm NULL.
#ifndef IA3_H
#define IA3_H
#include "../lora.h"

// IA3: out (N, O) = W (l * inp) for a feedforward module, else l * (W inp), inp (N, in),
// w: W (O, in); xs (N, in) scratch
static void ia3_forward(const LoRA *l, int layer, int t, float *out, const float *inp, const float *w, float *xs, int N) {
    int in = l->in[t], O = l->out[t];
    const float *vec = ia3_vector(l, l->params, layer, t);
    if (ia3_feedforward(l, t)) {
        dora_scale(xs, inp, vec, NULL, N, in, 0.0f, 0);
        matmul_forward(out, xs, w, N, in, O, 1.0f, 0);
    } else {
        matmul_forward(out, inp, w, N, in, O, 1.0f, 0);
        dora_scale(out, out, vec, NULL, N, O, 0.0f, 0);
    }
}

// IA3's backward for dout (N, O): the vector's gradient, and dinp (N, in) += the input's
// (dinp NULL: not needed). A feedforward module: dx = dout W, dl += sum x dx, dinp += l dx;
// another: dl += sum dout (W x), the product recomputed, and dinp += (l dout) W.
// xs (N, in), pre (N, O) scratch.
static void ia3_backward(LoRA *l, int layer, int t, float *dinp, const float *dout, const float *inp, const float *w,
                         float *xs, float *pre, int N) {
    int in = l->in[t], O = l->out[t];
    const float *vec = ia3_vector(l, l->params, layer, t);
    float *dvec = ia3_vector(l, l->grads, layer, t);
    if (ia3_feedforward(l, t)) {
        memset(xs, 0, (size_t)N * in * sizeof(float));
        matmul_backward(xs, NULL, dout, NULL, w, N, in, O, 1.0f);
        dora_magnitude_backward(dvec, xs, inp, NULL, N, in);
        if (dinp) dora_scale(dinp, xs, vec, NULL, N, in, 0.0f, 1);
        return;
    }
    matmul_forward(pre, inp, w, N, in, O, 1.0f, 0);
    dora_magnitude_backward(dvec, dout, pre, NULL, N, O);
    if (!dinp) return;
    dora_scale(pre, dout, vec, NULL, N, O, 0.0f, 0);
    matmul_backward(dinp, NULL, pre, NULL, w, N, in, O, 1.0f);
}
#endif
