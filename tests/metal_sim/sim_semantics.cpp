// Execution semantics: a missing barrier is exposed by schedule randomisation (with the race
// detector off), divergent barriers and partial SIMD-group operations are reported (naming
// kernel and threadgroup), threadgroup memory starts as garbage, its 32 KB limit holds, and
// parallel workers agree with one worker.
#include "sim_test.h"

namespace {

using sim_test::bind;

bool neighbour_run(const char* kernel, uint64_t seed, int workers) {
    const uint32_t threads = 256, groups = 4;
    std::vector<float> input(threads), output(threads * groups, -1.0f);
    for (uint32_t i = 0; i < threads; ++i) input[i] = (float)i + 0.5f;
    mfa::sim::Dispatch d;
    d.kernel = kernel;
    d.threads_per_threadgroup = {threads, 1, 1};
    d.threadgroups = {1, 1, 1};
    d.threadgroup_memory_lengths[0] = threads * sizeof(float);
    d.schedule_seed = seed;
    d.num_workers = workers;
    // What the schedule alone shows; the race detector reports the missing barrier on any
    // schedule (sim_races).
    d.check_races = false;
    d.buffers[0] = bind(input);
    d.buffers[1] = bind(output);
    if (!sim_test::run(d)) return false;
    for (uint32_t i = 0; i < threads; ++i)
        if (output[i] != input[i == 0 ? 0 : i - 1]) return false;
    return true;
}

void test_missing_barrier_detected() {
    for (uint64_t seed = 0; seed < 6; ++seed)
        CHECK(neighbour_run("neighbour_with_barrier", seed, 1), "seed %llu",
              (unsigned long long)seed);
    // In index order every thread runs after its neighbour, so the bug hides...
    CHECK(neighbour_run("neighbour_without_barrier", 0, 1));
    // ...and a shuffled schedule exposes it.
    int wrong = 0;
    for (uint64_t seed = 1; seed <= 4; ++seed)
        wrong += neighbour_run("neighbour_without_barrier", seed, 1) ? 0 : 1;
    CHECK(wrong == 4, "only %d of 4 shuffled schedules exposed the missing barrier", wrong);
}

// Runs a kernel expected to fail on the first threadgroup of a 2 x 1 x 1 grid (one worker takes
// them in order), and checks the message names the kernel, that threadgroup, the source file
// and each expected fragment.
void expect_fault(const char* kernel, uint32_t threads, std::vector<const char*> fragments,
                  uint64_t seed = 0) {
    std::vector<float> buffer(2 * threads + 64, 0.0f);
    mfa::sim::Dispatch d;
    d.kernel = kernel;
    d.threads_per_threadgroup = {threads, 1, 1};
    d.threadgroups = {2, 1, 1};
    d.buffers[0] = bind(buffer);
    d.buffers[1] = bind(buffer);
    d.schedule_seed = seed;
    d.num_workers = 1;
    const mfa_status status = mfa::sim::dispatch(d);
    fragments.push_back(kernel);
    fragments.push_back("threadgroup (0, 0, 0)");
    fragments.push_back("semantics.metal");
    for (const char* fragment : fragments) CHECK_ERROR(kernel, status, MFA_ERROR_DEVICE, fragment);
}

void test_divergence_reported() {
    expect_fault("barrier_in_branch", 64,
                 {"reached by only part of its group",
                  "threads 0-15: waiting in threadgroup_barrier", "threads 16-63: returned"});
    expect_fault("barriers_in_both_branches", 64, {"different barriers", "threadgroup_barrier at"});
    expect_fault("return_before_barrier", 64, {"threads 5: returned"}, 3);
    expect_fault("simd_sum_in_branch", 64,
                 {"reached by only part of its group", "waiting in simd_sum at",
                  "threads 16-31, 48-63: returned"});
    expect_fault("simd_sums_in_both_branches", 64,
                 {"different SIMD-group functions", "in simd_sum at"}, 7);
    expect_fault("matrix_in_partial_simdgroup", 16, {"need a full SIMD-group of 32 threads"});
}

void test_threadgroup_memory_is_garbage() {
    const uint32_t threads = 128, groups = 3;
    std::vector<uint32_t> output(threads * groups, 0);
    mfa::sim::Dispatch d;
    d.kernel = "read_unwritten_threadgroup_memory";
    d.threads_per_threadgroup = {threads, 1, 1};
    d.threadgroups = {groups, 1, 1};
    d.threadgroup_memory_lengths[0] = threads * sizeof(uint32_t);
    d.buffers[0] = bind(output);
    if (!sim_test::run(d)) return;
    int zeros = 0;
    for (uint32_t v : output) zeros += v == 0;
    CHECK(zeros < 4, "%d of %zu words of fresh threadgroup memory are zero", zeros, output.size());
    // Each threadgroup gets its own memory, not the previous group's leftovers.
    CHECK(!std::equal(output.begin(), output.begin() + threads, output.begin() + threads));
}

void test_threadgroup_memory_limits() {
    std::vector<uint32_t> output(128);
    mfa::sim::Dispatch d = sim_test::one_group("read_unwritten_threadgroup_memory", 32);
    d.buffers[0] = bind(output);
    d.threadgroup_memory_lengths[0] = 16384;
    d.threadgroup_memory_lengths[1] = 16384;
    CHECK(sim_test::run(d)); // exactly 32 KB is allowed
    d.threadgroup_memory_lengths[2] = 16;
    CHECK_ERROR("32 KB and 16 bytes", mfa::sim::dispatch(d), MFA_ERROR_INVALID_ARGUMENT,
                "32784 bytes of threadgroup memory exceed the 32768-byte");
    d.threadgroup_memory_lengths[1] = 0;
    d.threadgroup_memory_lengths[2] = 0;
    d.threadgroup_memory_lengths[0] = 100;
    CHECK_ERROR("length 100", mfa::sim::dispatch(d), MFA_ERROR_INVALID_ARGUMENT,
                "not a multiple of 16");
    d.threadgroup_memory_lengths[0] = 0;
    CHECK_ERROR("length 0", mfa::sim::dispatch(d), MFA_ERROR_DEVICE,
                "threadgroup(0) has no memory");
}

// Many threadgroups spread over workers give the same answer as one worker.
void test_workers_agree() {
    const uint32_t threads = 64, groups = 40;
    std::vector<float> input(threads);
    for (uint32_t i = 0; i < threads; ++i) input[i] = (float)i;
    std::vector<float> one(threads * groups), many(threads * groups);
    for (int pass = 0; pass < 2; ++pass) {
        mfa::sim::Dispatch d;
        d.kernel = "neighbour_with_barrier";
        d.threads_per_threadgroup = {threads, 1, 1};
        d.threadgroups = {groups, 1, 1};
        d.threadgroup_memory_lengths[0] = threads * sizeof(float);
        d.schedule_seed = 11;
        d.num_workers = pass == 0 ? 1 : 4;
        d.buffers[0] = bind(input);
        d.buffers[1] = bind(pass == 0 ? one : many);
        CHECK(sim_test::run(d));
    }
    CHECK(one == many);
}

} // namespace

int main() {
    test_missing_barrier_detected();
    test_divergence_reported();
    test_threadgroup_memory_is_garbage();
    test_threadgroup_memory_limits();
    test_workers_agree();
    return test_finish("sim_semantics");
}
