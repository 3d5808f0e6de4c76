// The race detector: each kind of data race in threadgroup and device memory is reported,
// naming the kernel, the memory and offset, the kind and both threads, on every schedule; the
// same kernels with the right barriers run clean; mem_flags decide what a barrier orders; a
// matrix constructor reached by part of a SIMD-group is divergence.
#include "sim_test.h"

namespace {

constexpr uint32_t kThreads = 64;

// Runs `kernel` on 2 threadgroups of kThreads threads with a kThreads-float tile and a
// 2 * kThreads-float output; returns the status, the message in mfa_last_error().
mfa_status run_kernel(const char* kernel, uint64_t seed, int workers = 1) {
    std::vector<float> output(2 * kThreads, 0.0f);
    mfa::sim::Dispatch d;
    d.kernel = kernel;
    d.threads_per_threadgroup = {kThreads, 1, 1};
    d.threadgroups = {2, 1, 1};
    d.threadgroup_memory_lengths[0] = kThreads * sizeof(float);
    d.buffers[0] = sim_test::bind(output);
    d.schedule_seed = seed;
    d.num_workers = workers;
    return mfa::sim::dispatch(d);
}

// The race is reported on the index-order schedule and on shuffled ones, each time as a data
// race of one of `kinds` on `memory`, naming the kernel and threads.
void expect_race(const char* kernel, const char* memory, std::vector<const char*> kinds) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
        const mfa_status status = run_kernel(kernel, seed);
        const std::string message = mfa_last_error();
        CHECK(status == MFA_ERROR_DEVICE, "%s, seed %llu: status %d", kernel,
              (unsigned long long)seed, (int)status);
        bool kind_found = false;
        for (const char* kind : kinds)
            kind_found |=
                message.find(std::string("data race (") + kind + ")") != std::string::npos;
        CHECK(kind_found, "%s, seed %llu: %s", kernel, (unsigned long long)seed, message.c_str());
        for (const char* fragment : {kernel, memory, "races.metal", " and thread ", "byte offset"})
            CHECK(message.find(fragment) != std::string::npos, "%s, seed %llu: no '%s' in: %s",
                  kernel, (unsigned long long)seed, fragment, message.c_str());
    }
}

void expect_clean(const char* kernel) {
    for (uint64_t seed = 0; seed < 4; ++seed)
        CHECK(run_kernel(kernel, seed, seed % 2 ? 2 : 1) == MFA_OK, "%s, seed %llu: %s", kernel,
              (unsigned long long)seed, mfa_last_error());
}

void test_missing_barriers() {
    // In index order each thread reads the element its predecessor has just written.
    expect_race("missing_leading_barrier", "threadgroup memory [[threadgroup(0)]]",
                {"read-after-write", "write-after-read"});
    expect_race("missing_trailing_barrier", "threadgroup memory [[threadgroup(0)]]",
                {"write-after-read", "read-after-write"});
    expect_clean("both_barriers");
    // The exact report of the index-order run, where the thread that completes a barrier (the
    // last, 63) runs on first: it reads element 0 for round 1, then thread 0 rewrites element 0
    // for round 2 with no barrier in between.
    run_kernel("missing_trailing_barrier", 0);
    const std::string message = mfa_last_error();
    for (const char* fragment :
         {"thread 0: data race (write-after-read) on threadgroup memory [[threadgroup(0)]] at "
          "byte offset 0: thread 0 writes 4 bytes there at ",
          ", after threadgroup_barrier at ", "races.metal:23, and thread 63 read it at ",
          " with no threadgroup_barrier ordering mem_threadgroup in between"})
        CHECK(message.find(fragment) != std::string::npos, "no '%s' in: %s", fragment,
              message.c_str());
}

void test_memory_flags() {
    expect_race("barrier_without_memory", "threadgroup memory", {"read-after-write"});
    expect_race("device_barrier_for_threadgroup_memory", "threadgroup memory",
                {"read-after-write"});
    expect_race("threadgroup_barrier_for_device_memory", "device memory buffer(0)",
                {"read-after-write"});
    expect_clean("device_barrier_for_device_memory");
    CHECK_ERROR("threadgroup_barrier_for_device_memory",
                run_kernel("threadgroup_barrier_for_device_memory", 0), MFA_ERROR_DEVICE,
                "on device memory buffer(0) at byte offset 0: thread 63 reads 4 bytes");
}

void test_write_after_write() {
    expect_race("all_write_one_element", "threadgroup memory [[threadgroup(0)]] at byte offset 0",
                {"write-after-write"});
    expect_clean("halves_of_one_word");
}

void test_matrix_transfers() {
    expect_clean("matrix_store_then_barrier");
    expect_race("matrix_store_without_barrier", "threadgroup memory",
                {"read-after-write", "write-after-read"});
}

void test_matrix_constructor_divergence() {
    CHECK_ERROR("filled_matrix_in_branch", run_kernel("filled_matrix_in_branch", 0),
                MFA_ERROR_DEVICE, "waiting in make_filled_simdgroup_matrix at");
}

// Off when asked: the racy kernel then runs to completion.
void test_off_switch() {
    std::vector<float> output(2 * kThreads, 0.0f);
    mfa::sim::Dispatch d = sim_test::one_group("missing_leading_barrier", kThreads);
    d.threadgroup_memory_lengths[0] = kThreads * sizeof(float);
    d.buffers[0] = sim_test::bind(output);
    d.check_races = false;
    CHECK(sim_test::run(d));
}

} // namespace

int main() {
    test_missing_barriers();
    test_memory_flags();
    test_write_after_write();
    test_matrix_transfers();
    test_matrix_constructor_divergence();
    test_off_switch();
    return test_finish("sim_races");
}
