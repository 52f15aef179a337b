// st_compare A.safetensors B.safetensors TOL [FLIPS ABS]: the same tensors (names, shapes)
// in both files, and every tensor of A within TOL of B's: the largest absolute
// difference over the largest magnitude of B's tensor (the scale test_llama2
// judges weights by). Prints the worst tensor and its error; exits 0 when all
// are within TOL, 1 when one is not or the tensors differ, 2 when a file is bad.
// test/test_sharded.sh uses it to judge runs at several world sizes.
// FLIPS, ABS (8-bit optimizer states): besides, at most FLIPS elements of the file
// may lie beyond TOL if each is within ABS of B's, absolute: a moment near the midpoint
// of two 8-bit codes takes the other when a gradient rounds otherwise, which moves that
// one element by a part of a step (ABS: a bound in lr's units) however small its tensor's
// scale (a LoRA B near zero), while an error in the sums moves many.
#include "../support/safetensors.h"
#include "../support/utils.h"
#include <math.h>

int main(int argc, char **argv) {
    if (argc != 4 && argc != 6) { fprintf(stderr, "usage: %s A.safetensors B.safetensors TOL [FLIPS ABS]\n", argv[0]); return 2; }
    StFile a, b;
    if (st_open(&a, argv[1]) != 0 || st_open(&b, argv[2]) != 0) return 2;
    double tol = atof(argv[3]), worst = 0, flip_abs = argc == 6 ? atof(argv[5]) : 0, worst_flip = 0;
    long max_flips = argc == 6 ? atol(argv[4]) : 0, flips = 0;
    const char *worst_name = "(none)";
    int bad = a.n_tensors != b.n_tensors;
    for (int i = 0; i < a.n_tensors && !bad; i++) {
        const StTensor *ta = &a.tensors[i], *tb = st_find(&b, ta->name);
        if (!tb || tb->numel != ta->numel) { printf("tensor '%s' is missing from %s or has another size\n", ta->name, argv[2]); bad = 1; break; }
        float *x = (float *)mallocCheck(ta->numel * sizeof(float)), *y = (float *)mallocCheck(ta->numel * sizeof(float));
        if (st_read_f32(&a, ta, 0, ta->numel, x) != 0 || st_read_f32(&b, tb, 0, tb->numel, y) != 0) return 2;
        double diff = 0, scale = 0;
        for (size_t k = 0; k < ta->numel; k++) scale = fmax(scale, fabs((double)y[k]));
        for (size_t k = 0; k < ta->numel; k++) {
            double d = fabs((double)x[k] - y[k]);
            if (max_flips && !(d <= tol * (scale > 0 ? scale : 1)) && d <= flip_abs) { flips++, worst_flip = fmax(worst_flip, d); continue; }
            diff = fmax(diff, isnan(d) ? INFINITY : d);
        }
        double err = scale > 0 ? diff / scale : diff;
        if (i == 0 || !(err <= worst)) { worst = err; worst_name = ta->name; } // a NaN is the worst
        free(x);
        free(y);
    }
    if (a.n_tensors != b.n_tensors) printf("%d tensors against %d\n", a.n_tensors, b.n_tensors);
    printf("worst tensor %s: %.3g of its scale (tolerance %.3g)", worst_name, worst, tol);
    if (max_flips) printf("; %ld elements beyond it (at most %ld), the largest %.3g apart (at most %.3g)", flips, max_flips, worst_flip, flip_abs);
    printf("\n");
    st_close(&a);
    st_close(&b);
    return bad || !(worst <= tol) || flips > max_flips;
}
