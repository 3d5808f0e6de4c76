// The metal-sim backend: the plan runner (planner/runner.h), the same one the Metal host uses,
// drives the simulator as its device, so the kernels, the configuration and the host-side rules
// it tests are exactly those a Mac would run. What is left here is the simulator's side of the
// device: caller memory is used in place, the scratch is heap memory, and the commands of a call
// are recorded dispatches that run when committed. Everything a call needs is reserved before
// its first pass runs (the scratch at prepare, the fiber stacks of every pass at commit), so a
// call that fails for lack of resources has written nothing.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "core/backend.h"
#include "metal_sim/fiber.h"
#include "metal_sim/sim.h"
#include "planner/runner.h"

namespace {

struct SimState {
    mfa_gpu_family family;
    uint64_t schedule_seed;
    int workers;
    char device_name[64];
    mfa_gpu_device device;
    mfa::sim::FiberStackPool stacks; // the context's: reused by its calls, unmapped with it
};

// Bound where a pass has nothing to bind; the kernels never touch it.
char placeholder_bytes[16];

// A call's commands: its passes, recorded with everything they refer to, run by commit.
struct SimCommands {
    uint32_t count = 0;
    mfa::sim::Dispatch dispatches[MFA_PLAN_MAX_PASSES];
    mfa::sim::FunctionConstant constants[MFA_PLAN_MAX_PASSES][MFA_PLAN_MAX_CONSTANTS];
    mfa_kernel_params params[MFA_PLAN_MAX_PASSES];
};

mfa_status sim_pipeline(void* device, const mfa_pass_plan* pass, mfa_gpu_pipeline* out) {
    (void)device;
    if (!mfa::sim::has_kernel(pass->kernel_name))
        return mfa_set_error(MFA_ERROR_INTERNAL, "metal-sim: kernel %s is not compiled in",
                             pass->kernel_name);
    // Function constants are bound per dispatch: there is nothing to compile ahead.
    out->pipeline = nullptr;
    out->max_total_threads_per_threadgroup = mfa::sim::kMaxThreadsPerThreadgroup;
    out->static_threadgroup_memory_length = 0;
    return MFA_OK;
}

mfa_status sim_wrap_host(void* device, const mfa_host_range* range, mfa_gpu_memory* out) {
    (void)device;
    out->buffer = range->first; // host memory is the simulator's device memory
    out->offset = 0;
    out->length = range->length;
    out->owner = nullptr;
    return MFA_OK;
}

mfa_status sim_scratch(void* device, uint64_t bytes, mfa_gpu_memory* out) {
    (void)device;
    void* memory = bytes <= SIZE_MAX ? std::malloc((size_t)bytes) : nullptr;
    if (!memory)
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                             "metal-sim: cannot allocate %llu bytes of scratch",
                             (unsigned long long)bytes);
    out->buffer = memory;
    out->offset = 0;
    out->length = bytes;
    out->owner = memory;
    return MFA_OK;
}

void sim_release(void* device, void* owner, bool completed) {
    (void)device;
    (void)completed; // nothing is staged: outputs were written in place
    std::free(owner);
}

mfa_status sim_begin(void* device, const char* label, void** commands) {
    (void)device;
    (void)label;
    auto* recorded = new (std::nothrow) SimCommands;
    if (!recorded)
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal-sim: cannot allocate commands");
    *commands = recorded;
    return MFA_OK;
}

// The runner encodes at most one dispatch per pass of a plan, MFA_PLAN_MAX_PASSES in all.
void sim_encode(void* device, void* commands, const mfa_gpu_dispatch* dispatch) {
    const auto* s = static_cast<const SimState*>(device);
    auto* recorded = static_cast<SimCommands*>(commands);
    const uint32_t n = recorded->count++;
    const mfa_pass_plan& pass = *dispatch->pass;
    mfa::sim::FunctionConstant* constants = recorded->constants[n];
    for (uint32_t i = 0; i < pass.num_constants; ++i) {
        const mfa_function_constant& c = pass.constants[i];
        constants[i] = c.type == MFA_CONSTANT_TYPE_BOOL
                           ? mfa::sim::FunctionConstant::of_bool((uint16_t)c.index, c.value != 0)
                           : mfa::sim::FunctionConstant::of_uint((uint16_t)c.index, c.value);
    }
    mfa::sim::Dispatch& d = recorded->dispatches[n];
    d.kernel = pass.kernel_name;
    d.constants = constants;
    d.num_constants = pass.num_constants;
    for (uint32_t i = 0; i < dispatch->num_buffers; ++i) {
        const mfa_gpu_memory& memory = *dispatch->buffers[i].memory;
        mfa::sim::BufferBinding& slot = d.buffers[dispatch->buffers[i].index];
        slot.base = memory.buffer;
        slot.offset = (size_t)memory.offset;
        slot.length = (size_t)(memory.offset + memory.length);
    }
    // setBytes copies the arguments when encoding; so does this.
    std::memcpy(&recorded->params[n], &pass.params, sizeof pass.params);
    d.buffers[pass.params_index].base = &recorded->params[n];
    d.buffers[pass.params_index].length = sizeof pass.params;
    d.threadgroup_memory_lengths[MFA_THREADGROUP_STAGING] = pass.threadgroup_memory_length;
    d.threadgroups.x = (uint32_t)pass.threadgroups[0];
    d.threadgroups.y = (uint32_t)pass.threadgroups[1];
    d.threadgroups.z = (uint32_t)pass.threadgroups[2];
    d.threads_per_threadgroup.x = pass.threads_per_threadgroup;
    d.schedule_seed = s->schedule_seed;
    d.num_workers = s->workers;
}

// The fiber stacks every recorded dispatch needs are reserved first, so that a call that cannot
// get them fails before its first pass writes anything; then the dispatches run in order, each
// to completion before the next, as one serial compute encoder runs them.
mfa_status sim_commit_and_wait(void* device, void* commands, const char* what) {
    (void)what; // the simulator's own message names the kernel and the fault
    auto* s = static_cast<SimState*>(device);
    auto* recorded = static_cast<SimCommands*>(commands);
    mfa::sim::FiberStackReservation stacks;
    mfa_status status =
        mfa::sim::reserve(s->stacks, recorded->dispatches, recorded->count, &stacks);
    for (uint32_t i = 0; i < recorded->count && status == MFA_OK; ++i) {
        recorded->dispatches[i].stacks = &stacks;
        status = mfa::sim::dispatch(recorded->dispatches[i]);
    }
    delete recorded;
    return status;
}

const mfa_gpu_device_ops device_ops = {sim_pipeline, sim_wrap_host, sim_scratch,        sim_release,
                                       sim_encode,   sim_begin,     sim_commit_and_wait};

int available() {
    for (int kind = 0; kind < MFA_PASS_KIND_COUNT; ++kind)
        if (!mfa::sim::has_kernel(mfa_pass_kernel_name((mfa_pass_kind)kind))) return 0;
    return 1;
}

mfa_status create(const mfa_context_options* options, void** state) {
    const mfa_gpu_family family =
        options->gpu_family == MFA_GPU_FAMILY_NONE ? MFA_GPU_FAMILY_APPLE9 : options->gpu_family;
    if (family != MFA_GPU_FAMILY_APPLE7 && family != MFA_GPU_FAMILY_APPLE8 &&
        family != MFA_GPU_FAMILY_APPLE9)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: gpu_family %d is not Apple7, Apple8 or Apple9",
                             (int)options->gpu_family);
    SimState* s = nullptr;
    try {
        s = new SimState();
    } catch (const std::exception&) {}
    if (!s) return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal-sim: cannot allocate a context");
    s->family = family;
    s->schedule_seed = options->sim_schedule_seed;
    const unsigned cores = std::thread::hardware_concurrency();
    s->workers = options->num_threads > 0 ? options->num_threads : (cores ? (int)cores : 1);
    std::snprintf(s->device_name, sizeof s->device_name, "metal-sim (Apple%d tables)", (int)family);
    mfa_gpu_device& device = s->device;
    device.ops = &device_ops;
    device.self = s;
    device.backend = "metal-sim";
    device.name = s->device_name;
    device.family = family;
    device.max_threads_per_threadgroup = mfa::sim::kMaxThreadsPerThreadgroup;
    device.max_threadgroup_memory_length = mfa::sim::kMaxThreadgroupMemoryBytes;
    device.max_buffer_length = SIZE_MAX;
    device.placeholder.buffer = placeholder_bytes;
    device.placeholder.length = sizeof placeholder_bytes;
    *state = s;
    return MFA_OK;
}

void destroy(void* state) { delete static_cast<SimState*>(state); }

const char* device_name(void* state) { return static_cast<SimState*>(state)->device_name; }

void capabilities(void* state, mfa_capabilities* caps) {
    const auto* s = static_cast<SimState*>(state);
    caps->dtypes = 1u << MFA_DTYPE_F32 | 1u << MFA_DTYPE_F16 | 1u << MFA_DTYPE_BF16;
    // What the kernels compute, each checked against the float64 reference on metal-sim
    // (tests/python, capability-gated, and tests/metal_sim).
    const uint32_t modifiers = MFA_FEATURE_MASK | MFA_FEATURE_BLOCK_MASK | MFA_FEATURE_SOFTCAP |
                               MFA_FEATURE_ALIBI | MFA_FEATURE_SINKS;
    caps->features = MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE | MFA_FEATURE_CAUSAL |
                     MFA_FEATURE_WINDOW | MFA_FEATURE_GQA | MFA_FEATURE_VALUE_HEAD_DIM |
                     MFA_FEATURE_STRIDES | modifiers | MFA_FEATURE_VARLEN | MFA_FEATURE_PAGED_KV |
                     MFA_FEATURE_INITIAL_STATE;
    caps->backward_features = MFA_FEATURE_CAUSAL | MFA_FEATURE_WINDOW | MFA_FEATURE_GQA |
                              MFA_FEATURE_VALUE_HEAD_DIM | MFA_FEATURE_STRIDES | modifiers |
                              MFA_FEATURE_VARLEN;
    caps->max_head_dim = MFA_PLAN_MAX_HEAD_DIM;
    caps->gpu_family = s->family;
    caps->num_threads = s->workers;
}

mfa_status forward(void* state, const mfa_problem* problem) {
    return mfa_gpu_run(&static_cast<SimState*>(state)->device, problem, false);
}

mfa_status backward(void* state, const mfa_problem* problem) {
    return mfa_gpu_run(&static_cast<SimState*>(state)->device, problem, true);
}

// No GPU timing: a simulated dispatch's time says nothing about a GPU's.
const mfa_backend_ops ops = {MFA_BACKEND_METAL_SIM, available, create,   destroy, device_name,
                             capabilities,          forward,   backward, nullptr, nullptr};

} // namespace

extern "C" const mfa_backend_ops* mfa_metal_sim_backend_ops(void) { return &ops; }
