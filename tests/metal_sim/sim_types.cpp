// half and bfloat rounding (including ties to even, overflow and subnormals), bfloat in device
// memory, vector constructors and swizzles, and the math library.
#include "sim_test.h"

namespace {

using sim_test::bind;
using sim_test::bits_float;

void test_rounding() {
    std::vector<float> input = {
        0.0f, -0.0f, 1.0f, -1.0f, 0.1f, 1.0f / 3.0f, 65504.0f, 65519.0f, 65520.0f, 70000.0f,
        -70000.0f, 6.1e-5f, 6.0e-8f, 3.0e-8f, 2.9e-8f, 1e-10f, 3.0e38f, -3.4e38f, 1.7e38f,
        // half ties: 1 + 2^-11 sits halfway between 1 and 1 + 2^-10 (even: 1);
        // 1 + 3 * 2^-11 halfway between 1 + 2^-10 and 1 + 2^-9 (even: 1 + 2^-9).
        1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
        // bfloat ties: 1 + 2^-8 (even: 1) and 1 + 3 * 2^-8 (even: 1 + 2^-6).
        1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f),
        // just above and below the bfloat tie
        bits_float(0x3F808001), bits_float(0x3F807FFF)};
    uint32_t state = 99;
    for (int i = 0; i < 300; ++i) { // random patterns across every exponent
        state = state * 1664525u + 1013904223u;
        const uint32_t bits = state & 0xFFFFFFFFu;
        const float f = bits_float(bits);
        if (!std::isnan(f) && !std::isinf(f)) input.push_back(f);
    }
    const uint32_t n = (uint32_t)input.size();
    std::vector<uint16_t> half_bits(n), bfloat_bits(n);
    std::vector<float> widened(2 * n);
    mfa::sim::Dispatch d;
    d.kernel = "convert_rounding";
    d.threads_per_threadgroup = {n, 1, 1};
    d.buffers[0] = bind(input);
    d.buffers[1] = bind(half_bits);
    d.buffers[2] = bind(bfloat_bits);
    d.buffers[3] = bind(widened);
    if (!sim_test::run(d)) return;
    for (uint32_t i = 0; i < n; ++i) {
        const uint16_t h = sim_test::reference_half(input[i]);
        const uint16_t b = sim_test::reference_bfloat(input[i]);
        CHECK(half_bits[i] == h, "half(%a) = 0x%04x, expected 0x%04x", input[i], half_bits[i], h);
        CHECK(bfloat_bits[i] == b, "bfloat(%a) = 0x%04x, expected 0x%04x", input[i], bfloat_bits[i],
              b);
        const double hv =
            (h & 0x7C00) == 0x7C00 ? std::copysign(INFINITY, input[i]) : sim_test::decode_half(h);
        CHECK(widened[2 * i] == (float)hv);
        CHECK(widened[2 * i + 1] == (float)sim_test::decode_bfloat(b));
    }
}

void test_bfloat_memory() {
    std::vector<uint16_t> input = {0x3F80, 0x4049, 0xC2F7, 0x0000, 0x3C23};
    std::vector<uint16_t> output(input.size());
    mfa::sim::Dispatch d;
    d.kernel = "bfloat_memory";
    d.threads_per_threadgroup = {(uint32_t)input.size(), 1, 1};
    d.buffers[0] = bind(input);
    d.buffers[1] = bind(output);
    if (!sim_test::run(d)) return;
    for (size_t i = 0; i < input.size(); ++i) {
        const float x = (float)sim_test::decode_bfloat(input[i]);
        // bfloat(2x) is exact; the sum is rounded once more.
        const uint16_t expected = sim_test::reference_bfloat(
            (float)sim_test::decode_bfloat(sim_test::reference_bfloat(2 * x)) + x);
        CHECK(output[i] == expected, "bfloat arithmetic [%zu]: 0x%04x, expected 0x%04x", i,
              output[i], expected);
    }
}

void test_vectors_and_math() {
    const float a = 0.75f, b = -1.25f, c = 2.5f;
    std::vector<float> x = {a, b, c};
    std::vector<float> out(64, -12345.0f);
    auto d = sim_test::one_group("vectors_and_math", 1);
    d.buffers[0] = bind(x);
    d.buffers[1] = bind(out);
    if (!sim_test::run(d)) return;
    const double expected[] = {
        1.0,
        c,
        2 * a + 2 * b,
        b,
        std::exp(a),
        std::exp2(a),
        std::log(c),
        std::log2(c),
        std::exp2(b),
        std::exp(b),
        1 / std::sqrt(c),
        std::fma(a, b, c),
        std::max(a, b),
        std::min(a, b),
        std::clamp(a, -0.5f, 0.5f),
        c,
        5,
        3,
        3,
        std::max(a, b),
        3.0,
        2.0, // select picks b's components where (a, b) > 0: (a > 0 -> 3, b > 0 -> 2)
        std::exp2(b),
        c,
        FLT_MAX,
        INFINITY,
        65504.0,
        1.5,
        2.5,
        INFINITY,
        a,
        0.0};
    const size_t count = sizeof(expected) / sizeof(expected[0]);
    for (size_t i = 0; i < count; ++i) {
        const double tolerance = std::isinf(expected[i]) ? 0 : 1e-6 * (1 + std::fabs(expected[i]));
        CHECK(out[i] == expected[i] || std::fabs(out[i] - expected[i]) <= tolerance,
              "slot %zu: got %.9g, expected %.9g", i, out[i], expected[i]);
    }
    CHECK(out[count] == -12345.0f); // the kernel wrote exactly count slots
}

} // namespace

int main() {
    test_rounding();
    test_bfloat_memory();
    test_vectors_and_math();
    return test_finish("sim_types");
}
