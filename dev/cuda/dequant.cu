// dequant_tensor (peft/quant.cuh) against peft/quant.h's, the CPU trainer's: random weights
// quantized on the host by quant_tensor, their packed bytes copied to the device as
// they are, and dequantized there. Both sides do the same fp32 operations in the
// same order (no fused multiply-add), so the tolerance is 0: fp32 bit for bit, bf16
// the round-to-nearest of the CPU's fp32. NF4 and FP4, double quantization on and off,
// over a unit of tensors laid out one after another in one buffer (as a decoder
// layer's seven weights): a single weight, a last short block of 64, an odd count
// (the last byte's pad nibble), several blocks of 256 absmax values, a block of zeros.
#include "common.cuh"
#include "../../peft/quant.cuh"

// weights (n) whose blocks of 64 have absmax values spread over two decades (so the
// 8-bit codes of double quantization take many values), the second block all zeros
std::vector<float> random_weights(size_t n) {
    std::vector<float> w = random_vector(n), scale = random_vector((n + QUANT_BLOCK - 1) / QUANT_BLOCK, 0.01f, 1.0f);
    if (scale.size() > 1) scale[1] = 0.0f;
    for (size_t i = 0; i < n; i++) w[i] *= scale[i / QUANT_BLOCK];
    return w;
}

template <typename T> void check_dequant(int type, int double_quant, const std::vector<size_t> &sizes, bool timed) {
    char variant[32], shape[64];
    snprintf(variant, sizeof variant, "%s%s-%s", quant_type_names[type], double_quant ? "+dq" : "", type_name<T>());
    snprintf(shape, sizeof shape, "%zu tensors, n=%zu..%zu", sizes.size(), *std::min_element(sizes.begin(), sizes.end()),
             *std::max_element(sizes.begin(), sizes.end()));
    size_t bytes = 0, total = 0;
    for (size_t n : sizes) {
        QuantTensor q;
        bytes += quant_layout(&q, type, double_quant, n, NULL), total += n;
    }
    // the unit on the host: each tensor quantized into its place, and the CPU's dequantized weights
    std::vector<uint8_t> packed(bytes);
    std::vector<QuantTensor> hq(sizes.size());
    std::vector<float> ref(total);
    size_t off = 0, at = 0;
    for (size_t k = 0; k < sizes.size(); k++) {
        off += quant_layout(&hq[k], type, double_quant, sizes[k], packed.data() + off);
        std::vector<float> w = random_weights(sizes[k]), absmax(hq[k].n_blocks);
        if (quant_tensor(&hq[k], w.data(), absmax.data(), "w") != 0) exit(1);
        dequant_tensor(&hq[k], ref.data() + at, absmax.data());
        at += sizes[k];
    }
    // the same bytes on the device, each tensor's weights into its place of one output;
    // the last tensor first, so one that wrote past its end (an odd count's pad) would
    // overwrite the next one's first weight, already there, and fail
    uint8_t *d_packed = device_alloc<uint8_t>(bytes);
    cudaCheck(cudaMemcpy(d_packed, packed.data(), bytes, cudaMemcpyHostToDevice));
    T *d_out = device_poisoned<T>(total);
    std::vector<QuantTensor> dq(sizes.size());
    for (size_t k = 0, o = 0; k < sizes.size(); k++) o += quant_layout(&dq[k], type, double_quant, sizes[k], d_packed + o);
    auto run = [&] {
        for (size_t k = sizes.size(), end = total; k-- > 0; end -= sizes[k]) dequant_tensor(dq[k], d_out + end - sizes[k], 0);
    };
    run();
    check("dequant_tensor", variant, "w", shape, to_host(d_out, total), rounded<T>(ref), 0.0);
    if (timed) // reads the packed bytes, writes the weights
        report_time("dequant_tensor", variant, shape, time_ms(run), (double)bytes + (double)total * sizeof(T));
    free_device();
}

int main(int argc, char **argv) {
    bool quick = quick_mode(argc, argv);
    // odd sizes: one weight, a short block, a whole one, one more, 1001, and 3 blocks of 256 absmax values
    const std::vector<size_t> unit = {1, 63, 64, 65, 1001, 2 * QUANT_BLOCK * QUANT_BLOCK2 + 33};
    // a decoder layer of Llama-2-7B (hidden 4096, MLP 11008): q, k, v, o, gate, up, down
    const size_t D = 4096, F = 11008;
    const std::vector<size_t> layer = {D * D, D * D, D * D, D * D, F * D, F * D, D * F};
    for (int type : {QUANT_NF4, QUANT_FP4})
        for (int double_quant = 0; double_quant < 2; double_quant++) {
            check_dequant<float>(type, double_quant, unit, false);
            check_dequant<__nv_bfloat16>(type, double_quant, unit, false);
            if (!quick) {
                check_dequant<float>(type, double_quant, layer, true);
                check_dequant<__nv_bfloat16>(type, double_quant, layer, true);
            }
        }
    return finish("dequant");
}
