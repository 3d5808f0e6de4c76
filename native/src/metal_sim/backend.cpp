// The metal-sim backend: plans a call with the same planner as the Metal host and runs each
// pass of the plan through the simulator, so the kernels and the configuration it tests are
// exactly those a Mac would run. Everything a call needs (scratch, the simulator's fiber
// stacks for every pass) is reserved before its first pass runs, so a call that fails for lack
// of resources has written nothing.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include "core/backend.h"
#include "metal_sim/fiber.h"
#include "metal_sim/sim.h"
#include "planner/planner.h"

namespace {

const char* const kKernels[] = {"mfa_attention_forward", "mfa_attention_backward_query",
                                "mfa_attention_backward_key_value"};

struct SimState {
    mfa_gpu_family family;
    uint64_t schedule_seed;
    int workers;
    char device_name[64];
    mfa::sim::FiberStackPool stacks; // the context's: reused by its calls, unmapped with it
};

int available() {
    for (const char* name : kKernels)
        if (!mfa::sim::has_kernel(name)) return 0;
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
    *state = s;
    return MFA_OK;
}

void destroy(void* state) { delete static_cast<SimState*>(state); }

const char* device_name(void* state) { return static_cast<SimState*>(state)->device_name; }

void capabilities(void* state, mfa_capabilities* caps) {
    const auto* s = static_cast<SimState*>(state);
    caps->dtypes = 1u << MFA_DTYPE_F32 | 1u << MFA_DTYPE_F16 | 1u << MFA_DTYPE_BF16;
    caps->features = MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE | MFA_FEATURE_CAUSAL |
                     MFA_FEATURE_WINDOW | MFA_FEATURE_GQA | MFA_FEATURE_VALUE_HEAD_DIM |
                     MFA_FEATURE_STRIDES;
    caps->max_head_dim = MFA_PLAN_MAX_HEAD_DIM;
    caps->gpu_family = s->family;
    caps->num_threads = s->workers;
}

// The memory behind an operand of the plan.
char* operand_data(const mfa_problem* problem, mfa_operand operand, float* scratch) {
    switch (operand) {
        case MFA_OPERAND_Q: return problem->q.data;
        case MFA_OPERAND_K: return problem->k.data;
        case MFA_OPERAND_V: return problem->v.data;
        case MFA_OPERAND_O: return problem->out.data;
        case MFA_OPERAND_L: return problem->lse.data;
        case MFA_OPERAND_D: return reinterpret_cast<char*>(scratch);
        case MFA_OPERAND_DOUT: return problem->dout.data;
        case MFA_OPERAND_DV: return problem->dv.data;
        case MFA_OPERAND_DK: return problem->dk.data;
        case MFA_OPERAND_DQ: return problem->dq.data;
        default: return nullptr;
    }
}

// The simulator dispatch of one pass; `constants` is its function-constant storage.
mfa_status encode_pass(const SimState* s, const mfa_problem* problem, const mfa_pass_plan& pass,
                       float* scratch, mfa::sim::FunctionConstant* constants,
                       mfa::sim::Dispatch* d) {
    for (uint32_t i = 0; i < pass.num_constants; ++i) {
        const mfa_function_constant& c = pass.constants[i];
        constants[i] = c.type == MFA_CONSTANT_TYPE_BOOL
                           ? mfa::sim::FunctionConstant::of_bool((uint16_t)c.index, c.value != 0)
                           : mfa::sim::FunctionConstant::of_uint((uint16_t)c.index, c.value);
    }
    d->kernel = pass.kernel_name;
    d->constants = constants;
    d->num_constants = pass.num_constants;
    // An operand with no elements is never read; the kernel signature still wants a buffer.
    static char empty_operand[16];
    for (uint32_t i = 0; i < pass.num_bindings; ++i) {
        const mfa_buffer_binding& b = pass.bindings[i];
        mfa::sim::BufferBinding& slot = d->buffers[b.index];
        if (b.byte_length == 0) {
            slot.base = empty_operand;
            slot.length = sizeof empty_operand;
            continue;
        }
        char* data = operand_data(problem, b.operand, scratch);
        if (!data)
            return mfa_set_error(MFA_ERROR_INTERNAL,
                                 "metal-sim: the plan binds %s, which is absent",
                                 mfa_operand_name(b.operand));
        slot.base = data + b.byte_offset;
        slot.length = (size_t)b.byte_length;
    }
    d->buffers[pass.params_index].base = const_cast<mfa_kernel_params*>(&pass.params);
    d->buffers[pass.params_index].length = sizeof pass.params;
    d->threadgroup_memory_lengths[MFA_THREADGROUP_STAGING] = pass.threadgroup_memory_length;
    d->threadgroups.x = (uint32_t)pass.threadgroups[0];
    d->threadgroups.y = (uint32_t)pass.threadgroups[1];
    d->threadgroups.z = (uint32_t)pass.threadgroups[2];
    d->threads_per_threadgroup.x = pass.threads_per_threadgroup;
    d->schedule_seed = s->schedule_seed;
    d->num_workers = s->workers;
    return MFA_OK;
}

// Encodes every pass of the plan, reserves the fiber stacks all of them need, then runs them
// in order. Passes without threadgroups have no work.
mfa_status run_plan(SimState* s, const mfa_problem* problem, const mfa_plan& plan, float* scratch) {
    mfa::sim::FunctionConstant constants[MFA_PLAN_MAX_PASSES][MFA_PLAN_MAX_CONSTANTS];
    mfa::sim::Dispatch dispatches[MFA_PLAN_MAX_PASSES];
    size_t count = 0;
    for (uint32_t i = 0; i < plan.num_passes; ++i) {
        const mfa_pass_plan& pass = plan.passes[i];
        if (pass.threadgroups[0] == 0 || pass.threadgroups[1] == 0 || pass.threadgroups[2] == 0)
            continue;
        mfa_status status =
            encode_pass(s, problem, pass, scratch, constants[count], &dispatches[count]);
        if (status != MFA_OK) return status;
        ++count;
    }
    mfa::sim::FiberStackReservation stacks;
    mfa_status status = mfa::sim::reserve(s->stacks, dispatches, count, &stacks);
    for (size_t i = 0; i < count && status == MFA_OK; ++i) {
        dispatches[i].stacks = &stacks;
        status = mfa::sim::dispatch(dispatches[i]);
    }
    return status;
}

mfa_status forward(void* state, const mfa_problem* problem) {
    auto* s = static_cast<SimState*>(state);
    mfa_plan plan;
    mfa_status status =
        mfa_plan_forward(problem, s->family, mfa::sim::kMaxThreadsPerThreadgroup, &plan);
    if (status != MFA_OK) return status;
    return run_plan(s, problem, plan, nullptr);
}

mfa_status backward(void* state, const mfa_problem* problem) {
    auto* s = static_cast<SimState*>(state);
    mfa_plan plan;
    mfa_status status =
        mfa_plan_backward(problem, s->family, mfa::sim::kMaxThreadsPerThreadgroup, &plan);
    if (status != MFA_OK) return status;
    if ((uint64_t)plan.scratch_bytes > SIZE_MAX)
        return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                             "metal-sim: backward scratch of %lld bytes exceeds the address space",
                             (long long)plan.scratch_bytes);
    float* scratch = nullptr;
    if (plan.scratch_bytes > 0) {
        scratch = static_cast<float*>(std::malloc((size_t)plan.scratch_bytes));
        if (!scratch)
            return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                                 "metal-sim: cannot allocate %lld bytes of backward scratch",
                                 (long long)plan.scratch_bytes);
    }
    status = run_plan(s, problem, plan, scratch);
    std::free(scratch);
    return status;
}

const mfa_backend_ops ops = {MFA_BACKEND_METAL_SIM, available,    create,  destroy,
                             device_name,           capabilities, forward, backward};

} // namespace

extern "C" const mfa_backend_ops* mfa_metal_sim_backend_ops(void) { return &ops; }
