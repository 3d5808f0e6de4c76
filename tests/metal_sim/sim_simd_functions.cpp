// SIMD-group functions against their definitions, lane by lane, including a partial last
// SIMD-group.
#include "sim_test.h"

namespace {

using sim_test::bind;

struct PermuteParams {
    uint32_t argument;
};

// The lane whose value `lane` receives, or -1 for its own (definitions from the MSL spec).
int permute_source(int function, int lane, int argument, int width) {
    switch (function) {
        case 0: return (lane * 7 + argument) % 32;                     // simd_shuffle
        case 1: return lane ^ argument;                                // simd_shuffle_xor
        case 2: return lane - argument >= 0 ? lane - argument : -1;    // simd_shuffle_up
        case 3: return lane + argument < width ? lane + argument : -1; // simd_shuffle_down
        case 4: return ((lane - argument) % width + width) % width;    // rotate_up
        case 5: return (lane + argument) % width;                      // rotate_down
        case 6: return argument;                                       // simd_broadcast
        case 7: return 0;                                              // broadcast_first
    }
    return -1;
}

void test_permutations() {
    const uint32_t threads = 64;
    std::vector<float> input(threads);
    for (uint32_t i = 0; i < threads; ++i) input[i] = 1000.0f + 3.0f * i;
    for (uint32_t argument = 0; argument < 32; ++argument) {
        std::vector<float> output(8 * threads, -1.0f);
        std::vector<float> output4(4 * threads, -1.0f);
        PermuteParams params{argument};
        auto d = sim_test::one_group("simd_permutations", threads);
        d.buffers[0] = bind(input);
        d.buffers[1] = bind(output);
        d.buffers[2] = bind(output4);
        d.buffers[3] = sim_test::bind_value(params);
        if (!sim_test::run(d)) return;
        for (int f = 0; f < 8; ++f) {
            for (uint32_t tid = 0; tid < threads; ++tid) {
                const int lane = tid % 32, base = tid - lane;
                const int source = permute_source(f, lane, argument, 32);
                const float expected = input[base + (source < 0 ? lane : source)];
                CHECK(output[f * threads + tid] == expected,
                      "function %d argument %u thread %u: got %g, expected %g", f, argument, tid,
                      output[f * threads + tid], expected);
            }
        }
        for (uint32_t tid = 0; tid < threads; ++tid) {
            const uint32_t from = (tid & ~31u) | ((tid % 32) ^ argument);
            for (int c = 0; c < 4; ++c) CHECK(output4[tid * 4 + c] == input[from] + c);
        }
    }
}

void test_reductions(uint32_t threads) {
    std::vector<int> input(threads);
    uint32_t state = 12345;
    for (uint32_t i = 0; i < threads; ++i) {
        state = state * 1103515245u + 12345u;
        input[i] = (int)((state >> 16) % 201) - 100;
    }
    input[threads / 2] = 7; // simd_any(x == 7) is true in that SIMD-group only
    std::vector<int> output(11 * threads, -999);
    std::vector<uint32_t> products(threads);
    std::vector<float> float_sums(threads);
    auto d = sim_test::one_group("simd_reductions", threads);
    d.buffers[0] = bind(input);
    d.buffers[1] = bind(output);
    d.buffers[2] = bind(products);
    d.buffers[3] = bind(float_sums);
    if (!sim_test::run(d)) return;
    for (uint32_t group = 0; group * 32 < threads; ++group) {
        const uint32_t first = group * 32, last = std::min(threads, first + 32);
        int sum = 0, max = INT32_MIN, min = INT32_MAX, all_and = -1, all_or = 0, all_xor = 0;
        uint32_t product = 1;
        bool any7 = false;
        for (uint32_t i = first; i < last; ++i) {
            sum += input[i];
            max = std::max(max, input[i]);
            min = std::min(min, input[i]);
            all_and &= input[i];
            all_or |= input[i];
            all_xor ^= input[i];
            product *= (uint32_t)input[i];
            any7 = any7 || input[i] == 7;
        }
        int running = 0;
        for (uint32_t i = first; i < last; ++i) {
            const int exclusive = running;
            running += input[i];
            const int expected[11] = {
                sum,       max, min,          all_and,           all_or, all_xor, running,
                exclusive, 1,   any7 ? 1 : 0, i == first ? 1 : 0};
            for (int f = 0; f < 11; ++f)
                CHECK(output[f * threads + i] == expected[f],
                      "threads %u, reduction %d, thread %u: got %d, expected %d", threads, f, i,
                      output[f * threads + i], expected[f]);
            CHECK(products[i] == product);
            CHECK(std::fabs(float_sums[i] - 0.5f * sum) <= 1e-3f, "float sum %g vs %g",
                  float_sums[i], 0.5 * sum);
        }
    }
}

} // namespace

int main() {
    test_permutations();
    test_reductions(64);
    test_reductions(48); // a SIMD-group of 16 lanes at the end
    test_reductions(7);
    return test_finish("sim_simd_functions");
}
