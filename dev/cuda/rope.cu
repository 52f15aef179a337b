// rope_forward / rope_backward (layers.cuh) against train_llama2.c's, on the tables both
// trainers compute on the host with one function (model.h's rope_tables); rotations run on
// chunks (t0 > 0).
#include "common.cuh"
#include "../../layers.cuh"

template <typename T> void check_rope(int B, int Tn, int t0, int len, int nh, int hd, bool timed) {
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d t0=%d len=%d nh=%d hd=%d", B, Tn, t0, len, nh, hd);
    Chunk ch = {B, Tn, t0, len, 0, 0};
    size_t n = (size_t)B * len * nh * hd, nt = (size_t)Tn * hd / 2;
    std::vector<float> cosb(nt), sinb(nt), x = rounded<T>(random_vector(n)), dx = rounded<T>(random_vector(n));
    std::vector<float> inv_freq(hd / 2);
    ref_rope_inv_freq(inv_freq.data(), hd, 10000.0f, "default", 0, 0, 0, 0);
    ref_rope_tables(cosb.data(), sinb.data(), Tn, hd, inv_freq.data());
    float *d_cos = to_device<float>(cosb), *d_sin = to_device<float>(sinb);
    T *d_x = to_device<T>(x), *d_dx = to_device<T>(dx);
    ref_rope_forward(x.data(), cosb.data(), sinb.data(), B, Tn, t0, len, nh, hd, 0);
    ref_rope_backward(dx.data(), cosb.data(), sinb.data(), B, Tn, t0, len, nh, hd);
    rope_forward(d_x, d_cos, d_sin, &ch, nh, hd, 0, 0);
    rope_backward(d_dx, d_cos, d_sin, &ch, nh, hd, 0);
    check("rope_forward", type_name<T>(), "x", shape, to_host(d_x, n), x, tol<T>(1e-5, 4e-3));
    check("rope_backward", type_name<T>(), "dx", shape, to_host(d_dx, n), dx, tol<T>(1e-5, 4e-3));
    if (timed) {
        float ms = time_ms([&] { rope_forward(d_x, d_cos, d_sin, &ch, nh, hd, 0, 0); });
        report_time("rope_forward", type_name<T>(), shape, ms, 2.0 * n * sizeof(T));
    }
    free_device();
}

template <typename T> void check_all(bool quick) {
    check_rope<T>(2, 40, 0, 40, 4, 16, false);
    check_rope<T>(2, 100, 37, 29, 3, 64, false);
    if (!quick) check_rope<T>(4, 4096, 1024, 1024, 32, 128, true); // Llama-2-7B's q, the second of 4 chunks
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    check_all<float>(quick);
    check_all<__nv_bfloat16>(quick);
    return finish("rope");
}
