// Argument binding from kernel signatures: built-ins over a 3-D grid, function constants (set
// per dispatch, derived, undefined, type-checked, concurrent), optional buffers, struct
// arguments, and the errors for what cannot be bound. The kernel forms the code generator
// rejects are compile_fail cases.
#include <thread>

#include "sim_test.h"

namespace {

using mfa::sim::FunctionConstant;
using sim_test::bind;

void test_builtins_3d() {
    mfa::sim::Dispatch d;
    d.kernel = "builtins_3d";
    d.threadgroups = {3, 2, 2};
    d.threads_per_threadgroup = {5, 4, 3}; // 60 threads: SIMD-groups of 32 and 28
    const uint32_t gx = 15, gy = 8, gz = 6;
    std::vector<uint32_t> out(gx * gy * gz * 12, 0xFFFFFFFFu);
    d.buffers[0] = bind(out);
    if (!sim_test::run(d)) return;
    for (uint32_t z = 0; z < gz; ++z)
        for (uint32_t y = 0; y < gy; ++y)
            for (uint32_t x = 0; x < gx; ++x) {
                const uint32_t* o = &out[((z * gy + y) * gx + x) * 12];
                const uint32_t lx = x % 5, ly = y % 4, lz = z % 3;
                const uint32_t flat = lx + 5 * ly + 20 * lz;
                const uint32_t expected[12] = {x,
                                               y,
                                               z,
                                               lx + 100 * ly + 10000 * lz,
                                               x / 5 + 100 * (y / 4) + 10000 * (z / 3),
                                               5 + 100 * 4 + 10000 * 3,
                                               3 + 100 * 2 + 10000 * 2,
                                               flat,
                                               flat % 32 + 100 * (flat / 32),
                                               2,
                                               lx + 100 * ly,
                                               32};
                for (int i = 0; i < 12; ++i)
                    CHECK(o[i] == expected[i], "thread (%u, %u, %u) value %d: %u, expected %u", x,
                          y, z, i, o[i], expected[i]);
            }
}

struct ConstantsResult {
    std::vector<float> out = std::vector<float>(9, -1.0f);
    std::vector<float> optional = std::vector<float>(1, 0.0f);
};

mfa_status run_constants(const std::vector<FunctionConstant>& constants, ConstantsResult* r,
                         bool bind_optional) {
    auto d = sim_test::one_group("function_constants", 32);
    d.constants = constants.data();
    d.num_constants = constants.size();
    d.buffers[0] = bind(r->out);
    if (bind_optional) d.buffers[1] = bind(r->optional);
    return mfa::sim::dispatch(d);
}

void test_function_constants() {
    {
        ConstantsResult r;
        const std::vector<FunctionConstant> c = {
            FunctionConstant::of_bool(0, true), FunctionConstant::of_int(1, -7),
            FunctionConstant::of_float(2, 1.5f), FunctionConstant::of_half(3, 0.1f)};
        CHECK(run_constants(c, &r, true) == MFA_OK);
        const float expected[9] = {
            1, -7,    1.5f, (float)sim_test::decode_half(sim_test::reference_half(0.1f)), -13, 0,
            1, 0.25f, 1};
        for (int i = 0; i < 9; ++i)
            CHECK(r.out[i] == expected[i], "constant slot %d: %g, expected %g", i, r.out[i],
                  expected[i]);
        CHECK(r.optional[0] == 42.0f);
    }
    {
        // fc_flag false: the optional buffer may stay unbound and arrives as a null pointer;
        // fc_unset given this time.
        ConstantsResult r;
        const std::vector<FunctionConstant> c = {
            FunctionConstant::of_bool(0, false), FunctionConstant::of_int(1, 20),
            FunctionConstant::of_float(2, -2.0f), FunctionConstant::of_half(3, 2.0f),
            FunctionConstant::of_uint(4, 9)};
        CHECK(run_constants(c, &r, false) == MFA_OK);
        const float expected[9] = {0, 20, -2.0f, 2.0f, 40, 1, 1, 0.25f, 0};
        for (int i = 0; i < 9; ++i)
            CHECK(r.out[i] == expected[i], "constant slot %d: %g, expected %g", i, r.out[i],
                  expected[i]);
    }
    {
        // Nothing given: every constant reads as zero and is undefined.
        ConstantsResult r;
        CHECK(run_constants({}, &r, false) == MFA_OK);
        const float expected[9] = {0, 0, 0, 0, 0, 0, 0, 0.25f, 0};
        for (int i = 0; i < 9; ++i) CHECK(r.out[i] == expected[i]);
    }
    {
        // The optional buffer is required when its constant is true.
        ConstantsResult r;
        CHECK_ERROR("optional buffer required",
                    run_constants({FunctionConstant::of_bool(0, true)}, &r, false),
                    MFA_ERROR_DEVICE, "parameter 'optional': buffer(1) is not bound");
    }
    {
        // A value of the wrong type is refused, as Metal's pipeline creation refuses it.
        ConstantsResult r;
        CHECK_ERROR("constant of the wrong type",
                    run_constants({FunctionConstant::of_int(0, 1)}, &r, false),
                    MFA_ERROR_INVALID_ARGUMENT, "function constant 'fc_flag'");
    }
}

// Dispatches with different constants from several threads at once: each must see its own.
void test_concurrent_constants() {
    const int kThreads = 4, kRounds = 25;
    std::vector<int> wrong(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([t, &wrong] {
            for (int round = 0; round < kRounds; ++round) {
                const int count = t * 1000 + round;
                ConstantsResult r;
                const std::vector<FunctionConstant> c = {FunctionConstant::of_bool(0, false),
                                                         FunctionConstant::of_int(1, count)};
                if (run_constants(c, &r, false) != MFA_OK || r.out[1] != (float)count ||
                    r.out[4] != (float)(2 * count))
                    ++wrong[t];
            }
        });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) CHECK(wrong[t] == 0, "thread %d: %d wrong", t, wrong[t]);
}

struct ScaleParams {
    uint32_t count;
    float scale;
};

void test_struct_argument() {
    ScaleParams params{10, 0.5f};
    std::vector<float> out(16, -1.0f);
    mfa::sim::Dispatch d;
    d.kernel = "struct_argument";
    d.threads_per_threadgroup = {8, 1, 1};
    d.threadgroups = {2, 1, 1};
    d.buffers[0] = sim_test::bind_value(params);
    d.buffers[1] = bind(out);
    if (sim_test::run(d)) {
        for (uint32_t i = 0; i < 16; ++i) CHECK(out[i] == (i < 10 ? 0.5f * i : -1.0f));
    }
    // The kernel sees base + offset.
    std::vector<float> shifted(18, -1.0f);
    d.buffers[1] = bind(shifted);
    d.buffers[1].offset = 2 * sizeof(float);
    if (sim_test::run(d)) {
        for (uint32_t i = 0; i < 18; ++i)
            CHECK(shifted[i] == (i >= 2 && i < 12 ? 0.5f * (i - 2) : -1.0f));
    }
    // An offset that breaks the element alignment is an error.
    d.buffers[1].offset = 2;
    CHECK_ERROR("misaligned offset", mfa::sim::dispatch(d), MFA_ERROR_DEVICE,
                "buffer(1) is not aligned for its type");
    d.buffers[1] = bind(out);
    // A binding too small for the struct the kernel reads is an error, not a wild read.
    d.buffers[0].length = sizeof(uint32_t);
    CHECK_ERROR("binding smaller than the struct", mfa::sim::dispatch(d), MFA_ERROR_DEVICE,
                "buffer(0) is smaller than the parameter's type");
    // So is an offset that leaves too little.
    d.buffers[0].length = sizeof(params);
    d.buffers[0].offset = 4;
    CHECK_ERROR("offset leaving less than the struct", mfa::sim::dispatch(d), MFA_ERROR_DEVICE,
                "buffer(0) is smaller than the parameter's type");
    // An unbound buffer the kernel uses.
    d.buffers[0] = sim_test::bind_value(params);
    d.buffers[1] = {};
    CHECK_ERROR("unbound buffer", mfa::sim::dispatch(d), MFA_ERROR_DEVICE,
                "kernel 'struct_argument', parameter 'out': buffer(1) is not bound");
}

void test_dispatch_validation() {
    std::vector<float> out(64);
    auto d = sim_test::one_group("no_such_kernel", 32);
    CHECK_ERROR("unknown kernel", mfa::sim::dispatch(d), MFA_ERROR_INVALID_ARGUMENT,
                "no kernel named 'no_such_kernel'");
    CHECK(!mfa::sim::has_kernel("no_such_kernel"));
    CHECK(mfa::sim::has_kernel("struct_argument"));

    d = sim_test::one_group("struct_argument", 1025);
    CHECK_ERROR("1025 threads", mfa::sim::dispatch(d), MFA_ERROR_INVALID_ARGUMENT,
                "1025 x 1 x 1 threads per threadgroup; must be 1 to 1024");
    d = sim_test::one_group("struct_argument", 32);
    d.threadgroups = {0, 1, 1};
    CHECK_ERROR("empty grid", mfa::sim::dispatch(d), MFA_ERROR_INVALID_ARGUMENT,
                "empty grid of threadgroups (0, 1, 1)");
    d = sim_test::one_group("struct_argument", 32);
    const FunctionConstant twice[2] = {FunctionConstant::of_int(1, 1),
                                       FunctionConstant::of_int(1, 2)};
    d.constants = twice;
    d.num_constants = 2;
    CHECK_ERROR("constant set twice", mfa::sim::dispatch(d), MFA_ERROR_INVALID_ARGUMENT,
                "function constant 1 is set twice");
}

} // namespace

int main() {
    test_builtins_3d();
    test_function_constants();
    test_concurrent_constants();
    test_struct_argument();
    test_dispatch_validation();
    return test_finish("sim_bindings");
}
