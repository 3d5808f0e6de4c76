/*
 * The CPU backend's entry points (core/backend.h): per-context state, and for each call a plan,
 * one workspace allocation made before any output is touched, and jobs on the context's pool.
 */
#include "core/backend.h"
#include "cpu/isa_select.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

#include <new>
#include <stdio.h>
#include <string>
#include <system_error>
#include <thread>

namespace {

/* Rows of a task. 64 x 64 f32 score tiles (16 KiB) and D x 64 panels stay in L1/L2 while
 * giving B * H * N / 64 tasks, plenty to balance two to a few dozen threads. */
const int64_t kBlockQ = 64;
const int64_t kBlockK = 64;
const int64_t kMaxHeadDim = 1024;

struct cpu_state {
    const mfa_cpu_kernels* kernels;
    int threads;
    std::string device_name;
    mfa_cpu::ThreadPool pool;

    cpu_state(const mfa_cpu_kernels* k, int n) : kernels(k), threads(n), pool(n) {}
};

const char* architecture_name()
{
#if defined(__x86_64__) || defined(_M_X64)
    return "x86-64";
#elif defined(__aarch64__) || defined(_M_ARM64)
    return "arm64";
#else
    return "unknown architecture";
#endif
}

int cpu_available(void) { return 1; }

mfa_status cpu_create(const mfa_context_options* options, void** state)
{
    int threads = options ? options->num_threads : 0;
    if (threads <= 0) {
        const unsigned hardware = std::thread::hardware_concurrency();
        threads = hardware > 0 ? static_cast<int>(hardware) : 1;
    }
    const mfa_cpu_kernels* kernels = nullptr;
    const mfa_status selected = mfa_cpu_select_kernels(&kernels);
    if (selected != MFA_OK)
        return selected;
    try {
        cpu_state* created = new cpu_state(kernels, threads);
        char name[96];
        snprintf(name, sizeof name, "%s CPU (%s, %d thread%s)", architecture_name(),
                 kernels->isa_name, threads, threads == 1 ? "" : "s");
        created->device_name = name;
        *state = created;
        return MFA_OK;
    } catch (const std::bad_alloc&) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory creating the "
                                                      "context");
    } catch (const std::system_error& error) {
        return mfa_set_error(MFA_ERROR_DEVICE, "cpu backend: could not start %d worker threads: %s",
                             threads - 1, error.what());
    }
}

void cpu_destroy(void* state) { delete static_cast<cpu_state*>(state); }

const char* cpu_device_name(void* state)
{
    return static_cast<cpu_state*>(state)->device_name.c_str();
}

void cpu_capabilities(void* state, mfa_capabilities* caps)
{
    caps->struct_size = sizeof *caps;
    caps->dtypes = (1u << MFA_DTYPE_F32) | (1u << MFA_DTYPE_F16) | (1u << MFA_DTYPE_BF16);
    caps->features = MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE | MFA_FEATURE_CAUSAL |
                     MFA_FEATURE_WINDOW | MFA_FEATURE_GQA | MFA_FEATURE_VALUE_HEAD_DIM |
                     MFA_FEATURE_STRIDES;
    caps->max_head_dim = kMaxHeadDim;
    caps->gpu_family = MFA_GPU_FAMILY_NONE;
    caps->num_threads = static_cast<cpu_state*>(state)->threads;
}

int64_t clamp_window(int64_t bound, const mfa_problem* p)
{
    const int64_t widest = p->seq_q + p->seq_k;
    return bound > widest ? widest : bound;
}

mfa_cpu_plan make_plan(const cpu_state* state, const mfa_problem* p)
{
    mfa_cpu_plan plan = {};
    plan.problem = p;
    plan.elem_size = static_cast<int64_t>(mfa_dtype_size(p->dtype));
    plan.block_q = kBlockQ;
    plan.block_k = kBlockK;
    plan.q_blocks = (p->seq_q + kBlockQ - 1) / kBlockQ;
    plan.k_blocks = (p->seq_k + kBlockK - 1) / kBlockK;
    plan.window_left = clamp_window(p->window_left, p);
    plan.window_right = clamp_window(p->window_right, p);
    plan.score_scale = p->scale * 1.44269504088896341f;
    plan.panel_width = state->kernels->panel_width;
    return plan;
}

/* 64-byte-aligned floats, or an OUT_OF_MEMORY / SIZE_OVERFLOW error naming what was wanted. */
class float_buffer {
public:
    ~float_buffer() { operator delete(data_, std::align_val_t(64), std::nothrow); }
    float* data() const { return data_; }

    mfa_status allocate(int64_t count, int64_t copies, const char* what)
    {
        int64_t floats, bytes;
        if (__builtin_mul_overflow(count, copies, &floats) ||
            __builtin_mul_overflow(floats, static_cast<int64_t>(sizeof(float)), &bytes))
            return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                                 "cpu backend: %s of %lld x %lld floats overflows", what,
                                 static_cast<long long>(copies), static_cast<long long>(count));
        data_ = static_cast<float*>(operator new(static_cast<size_t>(bytes), std::align_val_t(64),
                                                 std::nothrow));
        if (!data_)
            return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                                 "cpu backend: could not allocate %lld bytes for %s",
                                 static_cast<long long>(bytes), what);
        return MFA_OK;
    }

private:
    float* data_ = nullptr;
};

typedef void (*kernel_task)(const mfa_cpu_plan*, int64_t, float*);

struct pass {
    const mfa_cpu_plan* plan;
    kernel_task task;
};

void run_pass_task(void* context, int64_t index, int slot)
{
    const pass* p = static_cast<const pass*>(context);
    p->task(p->plan, index, p->plan->workspace + slot * p->plan->workspace_slot_floats);
}

void run_pass(cpu_state* state, const mfa_cpu_plan* plan, kernel_task task, int64_t count)
{
    pass p = {plan, task};
    state->pool.run(count, run_pass_task, &p);
}

mfa_status cpu_forward(void* opaque, const mfa_problem* problem)
{
    cpu_state* state = static_cast<cpu_state*>(opaque);
    mfa_cpu_plan plan = make_plan(state, problem);
    mfa_cpu_forward_tiles layout;
    plan.workspace_slot_floats = mfa_cpu_forward_tiles_carve(&plan, nullptr, &layout);
    float_buffer workspace;
    const mfa_status status =
        workspace.allocate(plan.workspace_slot_floats, state->pool.threads(), "forward tiles");
    if (status != MFA_OK)
        return status;
    plan.workspace = workspace.data();
    run_pass(state, &plan, state->kernels->forward_task,
             problem->batch * problem->heads_q * plan.q_blocks);
    return MFA_OK;
}

mfa_status cpu_backward(void* opaque, const mfa_problem* problem)
{
    cpu_state* state = static_cast<cpu_state*>(opaque);
    mfa_cpu_plan plan = make_plan(state, problem);
    mfa_cpu_backward_tiles layout;
    plan.workspace_slot_floats = mfa_cpu_backward_tiles_carve(&plan, nullptr, &layout);
    float_buffer workspace, row_dot;
    mfa_status status =
        workspace.allocate(plan.workspace_slot_floats, state->pool.threads(), "backward tiles");
    if (status == MFA_OK)
        status = row_dot.allocate(problem->seq_q, problem->batch * problem->heads_q,
                                  "rowsum(dO * O)");
    if (status != MFA_OK)
        return status;
    plan.workspace = workspace.data();
    plan.row_dot = row_dot.data();
    const int64_t query_tasks = problem->batch * problem->heads_q * plan.q_blocks;
    const int64_t key_tasks = problem->batch * problem->heads_kv * plan.k_blocks;
    run_pass(state, &plan, state->kernels->row_dot_task, query_tasks);
    run_pass(state, &plan, state->kernels->backward_task, query_tasks + key_tasks);
    return MFA_OK;
}

const mfa_backend_ops cpu_ops = {
    MFA_BACKEND_CPU, cpu_available,    cpu_create,  cpu_destroy,
    cpu_device_name, cpu_capabilities, cpu_forward, cpu_backward,
};

} // namespace

extern "C" const mfa_backend_ops* mfa_cpu_backend_ops(void)
{
    return &cpu_ops;
}
