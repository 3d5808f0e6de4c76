// Speed smoke test: an attention-sized forward pass (N = 512, D = 64 and 128, 128 threads per
// threadgroup) through the simulator, checked against the float64 reference. Prints the time;
// asserts only correctness.
#include <chrono>

#include "sim_test.h"
#include "test_reference.h"

namespace {

// A dense [1, 1, n, d] f32 tensor over `data`, as the public API describes one.
mfa_tensor view(std::vector<float>& data, int64_t n, int64_t d) {
    return {data.data(), MFA_DTYPE_F32, {1, 1, n, d}, {n * d, n * d, d, 1}};
}

struct AttentionParams {
    uint32_t n;
    float scale_log2;
};

void run_attention(uint32_t d, const char* kernel) {
    const uint32_t n = 512;
    std::vector<float> q(n * d), k(n * d), v(n * d), o(n * d, 0.0f);
    uint32_t state = 7;
    auto random = [&state] {
        state = state * 1664525u + 1013904223u;
        return (float)((state >> 8) & 0xFFFF) / 65536.0f - 0.5f;
    };
    for (auto* t : {&q, &k, &v})
        for (float& x : *t) x = random();
    const float scale = 1.0f / std::sqrt((float)d);
    AttentionParams params{n, scale * 1.4426950408889634f};
    mfa::sim::Dispatch dispatch;
    dispatch.kernel = kernel;
    dispatch.threadgroups = {n / 32, 1, 1};
    dispatch.threads_per_threadgroup = {128, 1, 1};
    dispatch.threadgroup_memory_lengths[0] = 2 * 8 * d * sizeof(float);
    dispatch.buffers[0] = sim_test::bind(q);
    dispatch.buffers[1] = sim_test::bind(k);
    dispatch.buffers[2] = sim_test::bind(v);
    dispatch.buffers[3] = sim_test::bind(o);
    dispatch.buffers[4] = sim_test::bind_value(params);
    const auto start = std::chrono::steady_clock::now();
    if (!sim_test::run(dispatch)) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: N=%u D=%u, %u threadgroups x 128 threads: %.3f s\n", kernel, n, d, n / 32,
                seconds);

    // The float64 reference of test_reference.h, over the same single-head problem.
    const mfa_tensor tq = view(q, n, d), tk = view(k, n, d), tv = view(v, n, d), to = view(o, n, d);
    const ref_problem problem = {1, 1, 1, n, n, d, d, scale, 0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1};
    ref_result reference = ref_forward(&problem, &tq, &tk, &tv);
    double worst = 0;
    for (uint32_t i = 0; i < n; ++i)
        for (uint32_t c = 0; c < d; ++c)
            worst =
                std::max(worst, std::fabs(reference.out[i * d + c] - test_get(&to, 0, 0, i, c)));
    ref_free(&reference);
    CHECK(worst < 1e-5, "%s: max |error| %g", kernel, worst);

    // A correctly synchronised kernel gives bit-identical results under any schedule and
    // number of workers.
    std::vector<float> shuffled(n * d, 0.0f);
    dispatch.buffers[3] = sim_test::bind(shuffled);
    dispatch.schedule_seed = 0x5EED;
    dispatch.num_workers = 3;
    if (sim_test::run(dispatch)) CHECK(std::memcmp(shuffled.data(), o.data(), o.size() * 4) == 0);
}

} // namespace

int main() {
    run_attention(64, "attention_forward_d64");
    run_attention(128, "attention_forward_d128");
    return test_finish("sim_speed");
}
