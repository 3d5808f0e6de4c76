/*
 * The CPU backend's entry points (core/backend.h): per-context state (kernel build, worker pool)
 * and, for each call, a plan, its allocations (all made before any output is touched), and the
 * pack and compute passes of each head chunk on the context's pool.
 */
#include "core/backend.h"
#include "cpu/isa_select.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

#include <algorithm>
#include <new>
#include <stdio.h>
#include <string>
#include <system_error>
#include <thread>

namespace {

/* Rows of a task, and the block the reduction side is walked in (multiples of every ISA's panel
 * width). Measured on Zen 5 (1 MiB L2 per core) at D = 64 and 128: 128 x 128 beats 64 x 64 by
 * about 10 % (fewer passes over the O accumulator and the row statistics), and larger tiles gain
 * nothing once the score tile (64 KiB) and O stop fitting in L2 beside the packed panels.
 * B * H * N / 128 tasks still balance two to a few dozen threads. */
const int64_t kBlockQ = 128;
const int64_t kBlockK = 128;
/* Rows a pack task converts: a multiple of every ISA's panel width. */
const int64_t kPackRows = 256;
/* Compute tasks per thread a head chunk should offer, and the packs' memory budget (32 MiB). */
const int64_t kTasksPerThread = 8;
const int64_t kPackBudgetFloats = int64_t(8) << 20;
const int64_t kMaxHeadDim = 1024;

struct cpu_state {
    const mfa_cpu_kernels* kernels;
    int threads;
    std::string device_name;
    mfa_cpu::ThreadPool pool;

    cpu_state(const mfa_cpu_kernels* k, int n) : kernels(k), threads(n), pool(n) {}
};

const char* architecture_name() {
#if defined(__x86_64__)
    return "x86-64";
#elif defined(__aarch64__)
    return "arm64";
#else
    return "unknown architecture";
#endif
}

int cpu_available(void) { return 1; }

mfa_status cpu_create(const mfa_context_options* options, void** state) {
    int threads = options ? options->num_threads : 0;
    if (threads <= 0) {
        const unsigned hardware = std::thread::hardware_concurrency();
        threads = hardware > 0 ? static_cast<int>(hardware) : 1;
    }
    const mfa_cpu_kernels* kernels = nullptr;
    const mfa_status selected = mfa_cpu_select_kernels(&kernels);
    if (selected != MFA_OK) return selected;
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

const char* cpu_device_name(void* state) {
    return static_cast<cpu_state*>(state)->device_name.c_str();
}

void cpu_capabilities(void* state, mfa_capabilities* caps) {
    caps->struct_size = sizeof *caps;
    caps->dtypes = (1u << MFA_DTYPE_F32) | (1u << MFA_DTYPE_F16) | (1u << MFA_DTYPE_BF16);
    caps->features = MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE | MFA_FEATURE_CAUSAL |
                     MFA_FEATURE_WINDOW | MFA_FEATURE_GQA | MFA_FEATURE_VALUE_HEAD_DIM |
                     MFA_FEATURE_STRIDES;
    caps->backward_features = MFA_FEATURE_CAUSAL | MFA_FEATURE_WINDOW | MFA_FEATURE_GQA |
                              MFA_FEATURE_VALUE_HEAD_DIM | MFA_FEATURE_STRIDES;
    caps->max_head_dim = kMaxHeadDim;
    caps->gpu_family = MFA_GPU_FAMILY_NONE;
    caps->num_threads = static_cast<cpu_state*>(state)->threads;
}

/* Every pack and tile size is a product of a padded sequence length and at most
 * 2 * (padded D + padded Dv) + a few floats per row; checking that bound once here lets the layout
 * code in plan.h use plain int64 arithmetic. (Zero strides let a small input describe a huge
 * sequence, so the core's byte-count checks on the tensors do not imply this.) */
mfa_status check_plan_sizes(const mfa_problem* p, int64_t panel_width) {
    const int64_t longest = p->seq_q > p->seq_k ? p->seq_q : p->seq_k;
    const int64_t per_row = 2 * (p->head_dim + p->head_dim_v) + 4 * panel_width + 64;
    int64_t floats;
    if (longest > (INT64_MAX >> 2) ||
        __builtin_mul_overflow(longest + panel_width, per_row, &floats) ||
        floats > (INT64_MAX >> 3))
        return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                             "cpu backend: sequence length %lld with head dims %lld/%lld needs "
                             "packed operands whose size overflows",
                             static_cast<long long>(longest), static_cast<long long>(p->head_dim),
                             static_cast<long long>(p->head_dim_v));
    return MFA_OK;
}

/* The plan every pass of a call shares; made only after check_plan_sizes, which also keeps the
 * padded sequence lengths computed here from overflowing. */
mfa_status make_plan(const cpu_state* state, const mfa_problem* p, mfa_cpu_plan* out) {
    const int64_t nr = state->kernels->panel_width;
    const mfa_status status = check_plan_sizes(p, nr);
    if (status != MFA_OK) return status;
    mfa_cpu_plan plan = {};
    plan.problem = p;
    plan.elem_size = static_cast<int64_t>(mfa_dtype_size(p->dtype));
    plan.panel_width = nr;
    plan.seq_q_padded = mfa_cpu_round_up(p->seq_q, nr);
    plan.seq_k_padded = mfa_cpu_round_up(p->seq_k, nr);
    plan.block_q = kBlockQ;
    plan.block_k = kBlockK;
    plan.q_blocks = (p->seq_q + kBlockQ - 1) / kBlockQ;
    plan.k_blocks = (p->seq_k + kBlockK - 1) / kBlockK;
    plan.pack_rows = kPackRows;
    plan.score_scale = p->scale * mfa_cpu_log2e;
    *out = plan;
    return MFA_OK;
}

/* How many key/value heads to pack and run at once: enough tasks to keep every thread busy
 * between the pass barriers, within a memory budget for the packs (at least one head). */
int64_t chunk_kv_heads(const mfa_problem* p, int threads, int64_t tasks_per_kv_head,
                       int64_t pack_floats_per_kv_head) {
    const int64_t total = p->batch * p->heads_kv;
    int64_t chunk = (kTasksPerThread * threads + tasks_per_kv_head - 1) / tasks_per_kv_head;
    const int64_t affordable = kPackBudgetFloats / pack_floats_per_kv_head;
    if (chunk > affordable) chunk = affordable;
    if (chunk > total) chunk = total;
    return chunk > 0 ? chunk : 1;
}

/* 64-byte-aligned floats, or an OUT_OF_MEMORY / SIZE_OVERFLOW error naming what was wanted. */
class float_buffer {
  public:
    ~float_buffer() { operator delete(data_, std::align_val_t(64), std::nothrow); }
    float* data() const { return data_; }

    mfa_status allocate(int64_t count, int64_t copies, const char* what) {
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

struct pass {
    const mfa_cpu_plan* plan;
    mfa_cpu_task task;
};

void run_pass_task(void* context, int64_t index, int slot) {
    const pass* p = static_cast<const pass*>(context);
    p->task(p->plan, index, p->plan->workspace + slot * p->plan->workspace_slot_floats);
}

void run_pass(cpu_state* state, const mfa_cpu_plan* plan, mfa_cpu_task task, int64_t count) {
    pass p = {plan, task};
    state->pool.run(count, run_pass_task, &p);
}

mfa_status cpu_forward(void* opaque, const mfa_problem* problem) {
    cpu_state* state = static_cast<cpu_state*>(opaque);
    mfa_cpu_plan plan;
    mfa_status status = make_plan(state, problem, &plan);
    if (status != MFA_OK) return status;
    mfa_cpu_kv_pack kv_layout;
    mfa_cpu_forward_tiles tile_layout;
    plan.kv_pack_floats = mfa_cpu_kv_pack_carve(&plan, 0, nullptr, &kv_layout);
    plan.workspace_slot_floats = mfa_cpu_forward_tiles_carve(&plan, nullptr, &tile_layout);
    const int64_t chunk = chunk_kv_heads(problem, state->threads, problem->group * plan.q_blocks,
                                         plan.kv_pack_floats);
    float_buffer packs, workspace;
    status = packs.allocate(plan.kv_pack_floats, chunk, "packed K and V");
    if (status == MFA_OK)
        status =
            workspace.allocate(plan.workspace_slot_floats, state->pool.threads(), "forward tiles");
    if (status != MFA_OK) return status;
    plan.kv_packs = packs.data();
    plan.workspace = workspace.data();

    const int64_t kv_heads = problem->batch * problem->heads_kv;
    for (plan.first_kv_head = 0; plan.first_kv_head < kv_heads; plan.first_kv_head += chunk) {
        plan.chunk_kv_heads = std::min(chunk, kv_heads - plan.first_kv_head);
        run_pass(state, &plan, state->kernels->forward_pack, mfa_cpu_forward_pack_tasks(&plan));
        run_pass(state, &plan, state->kernels->forward, mfa_cpu_forward_tasks(&plan));
    }
    return MFA_OK;
}

mfa_status cpu_backward(void* opaque, const mfa_problem* problem) {
    cpu_state* state = static_cast<cpu_state*>(opaque);
    mfa_cpu_plan plan;
    mfa_status status = make_plan(state, problem, &plan);
    if (status != MFA_OK) return status;
    mfa_cpu_kv_pack kv_layout;
    mfa_cpu_q_pack q_layout;
    mfa_cpu_kv_grads grads_layout;
    mfa_cpu_backward_tiles tile_layout;
    plan.kv_pack_floats = mfa_cpu_kv_pack_carve(&plan, 1, nullptr, &kv_layout);
    plan.q_pack_floats = mfa_cpu_q_pack_carve(&plan, nullptr, &q_layout);
    plan.kv_grads_floats = mfa_cpu_kv_grads_carve(&plan, nullptr, &grads_layout);
    /* The query-side pack task borrows its slot for one row of O and one of dO. */
    plan.workspace_slot_floats =
        std::max(mfa_cpu_backward_tiles_carve(&plan, nullptr, &tile_layout),
                 2 * mfa_cpu_round_up(problem->head_dim_v, 16));

    const int64_t group = problem->group;
    int64_t chunk = 1, members = group;
    if (plan.kv_pack_floats + group * plan.q_pack_floats <= kPackBudgetFloats) {
        chunk = chunk_kv_heads(problem, state->threads, group * plan.q_blocks + plan.k_blocks,
                               plan.kv_pack_floats + group * plan.q_pack_floats);
    } else {
        /* One key/value head at a time, its query heads in as many passes as the budget needs
         * (large groups, MQA above all, would otherwise pack every query head at once). */
        members = (kPackBudgetFloats - plan.kv_pack_floats) / plan.q_pack_floats;
        members = std::min(std::max(members, int64_t(1)), group);
    }
    float_buffer kv_packs, q_packs, kv_grads, workspace;
    status = kv_packs.allocate(plan.kv_pack_floats, chunk, "packed K and V");
    if (status == MFA_OK)
        status = q_packs.allocate(plan.q_pack_floats, chunk * members, "packed Q and dO");
    if (status == MFA_OK && members < group)
        status = kv_grads.allocate(plan.kv_grads_floats, chunk, "dK and dV between passes");
    if (status == MFA_OK)
        status =
            workspace.allocate(plan.workspace_slot_floats, state->pool.threads(), "backward tiles");
    if (status != MFA_OK) return status;
    plan.kv_packs = kv_packs.data();
    plan.q_packs = q_packs.data();
    plan.kv_grads = kv_grads.data();
    plan.workspace = workspace.data();

    const int64_t kv_heads = problem->batch * problem->heads_kv;
    for (plan.first_kv_head = 0; plan.first_kv_head < kv_heads; plan.first_kv_head += chunk) {
        plan.chunk_kv_heads = std::min(chunk, kv_heads - plan.first_kv_head);
        for (plan.first_member = 0; plan.first_member < group; plan.first_member += members) {
            plan.members = std::min(members, group - plan.first_member);
            run_pass(state, &plan, state->kernels->backward_pack,
                     mfa_cpu_backward_pack_tasks(&plan));
            run_pass(state, &plan, state->kernels->backward, mfa_cpu_backward_tasks(&plan));
        }
    }
    return MFA_OK;
}

const mfa_backend_ops cpu_ops = {
    MFA_BACKEND_CPU,  cpu_available, cpu_create,   cpu_destroy, cpu_device_name,
    cpu_capabilities, cpu_forward,   cpu_backward, nullptr, /* no GPU time */
    nullptr,                                                /* host memory only */
};

} // namespace

extern "C" const mfa_backend_ops* mfa_cpu_backend_ops(void) { return &cpu_ops; }
