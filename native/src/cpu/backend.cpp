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
#include <atomic>
#include <new>
#include <stdio.h>
#include <string.h>
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
/* Compute tasks per thread a head chunk should offer, and the packs' memory budget (64 MiB: a
 * group of 4 query heads at N 2048, D 128 with its dQ sums, 37 MB, runs in one pass). */
const int64_t kTasksPerThread = 8;
const int64_t kPackBudgetFloats = int64_t(16) << 20;
const int64_t kMaxHeadDim = 1024;
/* Decoding (up to mfa_cpu_decode_max_rows query rows per key/value head read K and V in place
 * instead of packing them): the keys are split so that every thread gets many tasks, but no
 * range is shorter than kDecodeMinSplit keys (below that the merge costs more than it spreads).
 * Many, so that the tasks still even out when a worker wakes late (tens of microseconds in a
 * virtual machine): at B 1, Hkv 8, Nk 4k, f32, 2 threads of an Emerald Rapids kept 1.74-1.86
 * threads busy with 4 tasks a thread, 1.87-1.91 with 16. */
const int64_t kDecodeTasksPerThread = 16;
const int64_t kDecodeMinSplit = 512;
/* Backward: tasks per thread that a chunk's key stripes should make. */
const int64_t kBackwardTasksPerThread = 4;

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
    const uint32_t modifiers = MFA_FEATURE_MASK | MFA_FEATURE_BLOCK_MASK | MFA_FEATURE_SOFTCAP |
                               MFA_FEATURE_ALIBI | MFA_FEATURE_SINKS;
    caps->features = MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE | MFA_FEATURE_CAUSAL |
                     MFA_FEATURE_WINDOW | MFA_FEATURE_GQA | MFA_FEATURE_VALUE_HEAD_DIM |
                     MFA_FEATURE_STRIDES | modifiers | MFA_FEATURE_VARLEN | MFA_FEATURE_PAGED_KV |
                     MFA_FEATURE_INITIAL_STATE;
    caps->backward_features = MFA_FEATURE_CAUSAL | MFA_FEATURE_WINDOW | MFA_FEATURE_GQA |
                              MFA_FEATURE_VALUE_HEAD_DIM | MFA_FEATURE_STRIDES | modifiers |
                              MFA_FEATURE_VARLEN;
    caps->max_head_dim = kMaxHeadDim;
    caps->gpu_family = MFA_GPU_FAMILY_NONE;
    caps->num_threads = static_cast<cpu_state*>(state)->threads;
}

/* Every pack and tile size is a product of a padded sequence length and at most
 * 2 * (padded D + padded Dv) + a few floats per row; checking that bound once here lets the layout
 * code in plan.h use plain int64 arithmetic. (Zero strides let a small input describe a huge
 * sequence, so the core's byte-count checks on the tensors do not imply this.) */
mfa_status check_plan_sizes(const mfa_problem* p, int64_t longest, int64_t panel_width) {
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
    mfa_cpu_plan plan = {};
    plan.problem = p;
    plan.seq_q_max = p->seq_q;
    plan.seq_k_max = p->seq_k;
    if (p->layout == MFA_LAYOUT_VARLEN) {
        plan.seq_q_max = p->varlen.longest_q;
        plan.seq_k_max = p->varlen.longest_k;
    } else if (p->layout == MFA_LAYOUT_PAGED) {
        plan.seq_k_max = p->paged.longest_k;
    }
    const mfa_status status = check_plan_sizes(p, std::max(plan.seq_q_max, plan.seq_k_max), nr);
    if (status != MFA_OK) return status;
    plan.elem_size = static_cast<int64_t>(mfa_dtype_size(p->dtype));
    plan.panel_width = nr;
    plan.operand_pairs = state->kernels->bf16_pairs && p->dtype == MFA_DTYPE_BF16;
    plan.seq_q_padded = mfa_cpu_round_up(plan.seq_q_max, nr);
    plan.seq_k_padded = mfa_cpu_round_up(plan.seq_k_max, nr);
    plan.block_q = std::max(std::min(kBlockQ, plan.seq_q_padded), nr);
    plan.block_k = std::max(std::min(kBlockK, plan.seq_k_padded), nr);
    const int64_t wide =
        plan.operand_pairs && !mfa_view_present(&p->mask) ? state->kernels->wide_block_k : 0;
    plan.wide_block_k =
        plan.block_k < kBlockK
            ? plan.block_k
            : std::max(std::min(wide, mfa_cpu_round_up(plan.seq_k_padded, kBlockK)), plan.block_k);
    plan.pack_rows = kPackRows;
    *out = plan;
    return MFA_OK;
}

/* How many key/value heads to pack and run at once: enough tasks to keep every thread busy
 * between the pass barriers, within a memory budget for the packs (at least one head). */
int64_t chunk_kv_heads(const mfa_problem* p, int threads, int64_t tasks_per_kv_head,
                       int64_t pack_floats_per_kv_head) {
    const int64_t total = p->batch * p->heads_kv;
    tasks_per_kv_head = std::max<int64_t>(tasks_per_kv_head, 1);
    int64_t chunk = (kTasksPerThread * threads + tasks_per_kv_head - 1) / tasks_per_kv_head;
    const int64_t affordable = kPackBudgetFloats / std::max<int64_t>(pack_floats_per_kv_head, 1);
    if (chunk > affordable) chunk = affordable;
    if (chunk > total) chunk = total;
    return chunk > 0 ? chunk : 1;
}

/* The chunk that starts at unit `first`: the units that follow it until their tasks under
 * `count`, each unit's counted by its own sequence, reach `wanted`; at most `most` units and at
 * least one. Every unit of a dense problem has the same tasks, so its chunks have one size; in a
 * packed batch the short sequences' units go many to a chunk, as they would in calls of their
 * own, rather than as few as the longest sequence's: every pass ends in a barrier, and a pass
 * with few tasks leaves threads idle. */
int64_t chunk_units(const mfa_cpu_plan* plan, mfa_cpu_task_count count, int64_t first,
                    int64_t wanted, int64_t most) {
    const mfa_problem* p = plan->problem;
    const int64_t last = std::min(p->batch * p->heads_kv, first + std::max<int64_t>(most, 1));
    int64_t u = first, tasks = 0;
    do {
        const mfa_cpu_sequence s = mfa_cpu_sequence_of(plan, mfa_cpu_unit_batch(plan, u));
        tasks += count(plan, &s);
        ++u;
    } while (u < last && tasks < wanted);
    return u - first;
}

/* 64-byte-aligned arrays of T, or an OUT_OF_MEMORY / SIZE_OVERFLOW error naming what was
 * wanted. */
template <class T>
class aligned_buffer {
  public:
    aligned_buffer() = default;
    aligned_buffer(const aligned_buffer&) = delete;
    aligned_buffer& operator=(const aligned_buffer&) = delete;
    ~aligned_buffer() { operator delete(data_, std::align_val_t(64), std::nothrow); }
    T* data() const { return data_; }

    mfa_status allocate(int64_t count, int64_t copies, const char* what) {
        int64_t elements, bytes;
        if (__builtin_mul_overflow(count, copies, &elements) ||
            __builtin_mul_overflow(elements, static_cast<int64_t>(sizeof(T)), &bytes))
            return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                                 "cpu backend: %s of %lld x %lld elements overflows", what,
                                 static_cast<long long>(copies), static_cast<long long>(count));
        data_ = static_cast<T*>(operator new(static_cast<size_t>(std::max<int64_t>(bytes, 1)),
                                             std::align_val_t(64), std::nothrow));
        if (!data_)
            return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                                 "cpu backend: could not allocate %lld bytes for %s",
                                 static_cast<long long>(bytes), what);
        return MFA_OK;
    }

  private:
    T* data_ = nullptr;
};

typedef aligned_buffer<float> float_buffer;

/* The workspace of a call: one slot per task that can run at once, which is the pool's thread
 * count or, when a call has fewer tasks than threads, its largest pass's task count (so that
 * scratch follows the work, not the context). Slots are then handed out per task. */
class workspace_slots {
  public:
    ~workspace_slots() { delete[] busy_; }

    mfa_status allocate(const cpu_state* state, int64_t slot_floats, int64_t most_tasks,
                        const char* what) {
        slot_floats_ = slot_floats;
        slots_ =
            static_cast<int>(std::min<int64_t>(state->threads, std::max<int64_t>(most_tasks, 1)));
        if (slots_ < state->threads) {
            busy_ = new (std::nothrow) std::atomic<bool>[slots_]();
            if (!busy_)
                return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                                     "cpu backend: could not allocate %d slot flags", slots_);
        }
        return memory_.allocate(slot_floats, slots_, what);
    }

    /* The slot of a task that the pool runs on worker `worker`; release it with release(). */
    int acquire(int worker) {
        if (!busy_) return worker;
        int slot = worker % slots_;
        while (busy_[slot].exchange(true, std::memory_order_acquire)) slot = (slot + 1) % slots_;
        return slot;
    }
    void release(int slot) {
        if (busy_) busy_[slot].store(false, std::memory_order_release);
    }
    float* slot(int index) const { return memory_.data() + index * slot_floats_; }

  private:
    float_buffer memory_;
    int64_t slot_floats_ = 0;
    int slots_ = 0;
    std::atomic<bool>* busy_ = nullptr;
};

struct pass {
    const mfa_cpu_plan* plan;
    mfa_cpu_task task;
    workspace_slots* slots;
};

void run_pass_task(void* context, int64_t index, int worker) {
    const pass* p = static_cast<const pass*>(context);
    const int slot = p->slots->acquire(worker);
    p->task(p->plan, index, p->slots->slot(slot));
    p->slots->release(slot);
}

/* Fills prefix (chunk_kv_heads + 1 entries) with the first task of each unit of the plan's
 * chunk under `count`; returns the pass's task count. */
int64_t count_tasks(const mfa_cpu_plan* plan, mfa_cpu_task_count count, int64_t* prefix) {
    int64_t total = 0;
    for (int64_t u = 0; u < plan->chunk_kv_heads; ++u) {
        prefix[u] = total;
        const mfa_cpu_sequence s =
            mfa_cpu_sequence_of(plan, mfa_cpu_unit_batch(plan, plan->first_kv_head + u));
        total += count(plan, &s);
    }
    prefix[plan->chunk_kv_heads] = total;
    return total;
}

/* One pass over the plan's chunk: every unit's tasks under `count`. */
void run_pass(cpu_state* state, mfa_cpu_plan* plan, workspace_slots* slots, mfa_cpu_task task,
              mfa_cpu_task_count count, int64_t* prefix) {
    const int64_t tasks = count_tasks(plan, count, prefix);
    plan->task_prefix = prefix;
    pass p = {plan, task, slots};
    state->pool.run(tasks, run_pass_task, &p);
}

/* Paged caches with new keys: the rows appended, every unit at once, before anything reads. */
mfa_status append_new_keys(cpu_state* state, mfa_cpu_plan* plan, int64_t* prefix) {
    const mfa_problem* p = plan->problem;
    if (p->layout != MFA_LAYOUT_PAGED || p->paged.new_len == 0) return MFA_OK;
    workspace_slots workspace;
    const mfa_status status = workspace.allocate(state, 16, p->batch * p->heads_kv, "appending");
    if (status != MFA_OK) return status;
    plan->first_kv_head = 0;
    plan->chunk_kv_heads = p->batch * p->heads_kv;
    run_pass(state, plan, &workspace, state->kernels->append, mfa_cpu_append_tasks, prefix);
    return MFA_OK;
}

/* Decoding: the keys split so that every thread has a few tasks: ranges of the same length for
 * every unit (so that longer sequences get more of them), no shorter than kDecodeMinSplit. */
int64_t decode_split_size(const cpu_state* state, const mfa_cpu_plan* plan) {
    const mfa_problem* p = plan->problem;
    int64_t keys = 0;
    for (int64_t b = 0; b < p->batch; ++b) {
        const mfa_cpu_sequence s = mfa_cpu_sequence_of(plan, b);
        if (s.seq_q > 0)
            keys += p->heads_kv *
                    std::max<int64_t>(mfa_cpu_decode_end_key(&s) - mfa_cpu_decode_first_key(&s), 0);
    }
    const int64_t wanted = kDecodeTasksPerThread * state->threads;
    return mfa_cpu_round_up(std::max((keys + wanted - 1) / wanted, kDecodeMinSplit),
                            mfa_cpu_decode_block);
}

mfa_status cpu_decode(cpu_state* state, mfa_cpu_plan* plan, int64_t* prefix) {
    const mfa_problem* problem = plan->problem;
    const int64_t units = problem->batch * problem->heads_kv;
    plan->first_kv_head = 0;
    plan->chunk_kv_heads = units;
    plan->key_split_size = decode_split_size(state, plan);
    const int64_t tasks = count_tasks(plan, mfa_cpu_decode_tasks, prefix);
    int64_t most_splits = 1;
    for (int64_t u = 0; u < units; ++u)
        most_splits = std::max(most_splits, prefix[u + 1] - prefix[u]);
    const int64_t rows = mfa_cpu_decode_rows(plan);
    mfa_cpu_decode_tiles tile_layout;
    /* The task that merges a unit reuses its slot for the split weights and one merged row. */
    const int64_t slot_floats =
        std::max(mfa_cpu_decode_tiles_carve(plan, nullptr, &tile_layout),
                 mfa_cpu_round_up(most_splits, 16) + mfa_cpu_round_up(problem->head_dim_v, 16));
    float_buffer partials;
    aligned_buffer<int64_t> splits_done;
    workspace_slots workspace;
    mfa_status status = MFA_OK;
    if (most_splits > 1) {
        status = partials.allocate(rows * mfa_cpu_decode_partial_row_floats(plan), tasks,
                                   "partial decoding states");
        if (status == MFA_OK) status = splits_done.allocate(units, 1, "decoding split counts");
        if (status == MFA_OK) std::fill(splits_done.data(), splits_done.data() + units, 0);
    }
    if (status == MFA_OK) status = workspace.allocate(state, slot_floats, tasks, "decoding tiles");
    if (status == MFA_OK) status = append_new_keys(state, plan, prefix);
    if (status != MFA_OK) return status;
    plan->first_kv_head = 0;
    plan->chunk_kv_heads = units;
    plan->partials = partials.data();
    plan->splits_done = splits_done.data();
    run_pass(state, plan, &workspace, state->kernels->decode, mfa_cpu_decode_tasks, prefix);
    return MFA_OK;
}

mfa_status cpu_forward(void* opaque, const mfa_problem* problem) {
    cpu_state* state = static_cast<cpu_state*>(opaque);
    mfa_cpu_plan plan;
    mfa_status status = make_plan(state, problem, &plan);
    if (status != MFA_OK) return status;
    const int64_t units = problem->batch * problem->heads_kv;
    aligned_buffer<int64_t> prefix;
    status = prefix.allocate(units + 1, 1, "task offsets");
    if (status != MFA_OK) return status;
    if (problem->group * plan.seq_q_max <= mfa_cpu_decode_max_rows)
        return cpu_decode(state, &plan, prefix.data());
    mfa_cpu_kv_pack kv_layout;
    mfa_cpu_forward_tiles tile_layout;
    plan.kv_pack_floats = mfa_cpu_kv_pack_carve(&plan, 0, nullptr, &kv_layout);
    const int64_t slot_floats = mfa_cpu_forward_tiles_carve(&plan, nullptr, &tile_layout);
    const int64_t q_blocks = mfa_cpu_blocks(plan.seq_q_max, plan.block_q);
    /* Enough tasks to keep every thread busy between the pass barriers, within the packs' memory
     * budget. */
    const int64_t wanted = kTasksPerThread * state->threads;
    const int64_t affordable =
        std::max<int64_t>(kPackBudgetFloats / std::max<int64_t>(plan.kv_pack_floats, 1), 1);
    int64_t largest_chunk = 1;
    for (int64_t first = 0; first < units;) {
        const int64_t chunk = chunk_units(&plan, mfa_cpu_forward_tasks, first, wanted, affordable);
        largest_chunk = std::max(largest_chunk, chunk);
        first += chunk;
    }
    const int64_t most_tasks = largest_chunk * std::max(mfa_cpu_pack_blocks(&plan, plan.seq_k_max),
                                                        problem->group * q_blocks);
    float_buffer packs;
    workspace_slots workspace;
    status = packs.allocate(plan.kv_pack_floats, largest_chunk, "packed K and V");
    if (status == MFA_OK)
        status = workspace.allocate(state, slot_floats, most_tasks, "forward tiles");
    if (status == MFA_OK) status = append_new_keys(state, &plan, prefix.data());
    if (status != MFA_OK) return status;
    plan.kv_packs = packs.data();

    for (plan.first_kv_head = 0; plan.first_kv_head < units;
         plan.first_kv_head += plan.chunk_kv_heads) {
        plan.chunk_kv_heads =
            chunk_units(&plan, mfa_cpu_forward_tasks, plan.first_kv_head, wanted, affordable);
        run_pass(state, &plan, &workspace, state->kernels->forward_pack, mfa_cpu_forward_pack_tasks,
                 prefix.data());
        run_pass(state, &plan, &workspace, state->kernels->forward, mfa_cpu_forward_tasks,
                 prefix.data());
    }
    return MFA_OK;
}

/* dsinks(h) = -sum over b and the pack blocks of their p_sink * delta, in that order. */
void store_dsinks(const mfa_cpu_plan* plan) {
    const mfa_problem* p = plan->problem;
    const int64_t blocks = mfa_cpu_pack_blocks(plan, plan->seq_q_max);
    for (int64_t h = 0; h < p->heads_q; ++h) {
        double total = 0.0;
        for (int64_t b = 0; b < p->batch; ++b)
            for (int64_t block = 0; block < blocks; ++block)
                total += plan->sink_parts[(b * p->heads_q + h) * blocks + block];
        const float value = static_cast<float>(-total);
        memcpy(p->dsinks.data + 4 * h * p->dsinks.stride[1], &value, sizeof value);
    }
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
    const int64_t slot_floats = std::max(mfa_cpu_backward_tiles_carve(&plan, nullptr, &tile_layout),
                                         2 * mfa_cpu_round_up(problem->head_dim_v, 16));

    /* Stripes: enough tasks per chunk to keep every thread busy (kBackwardTasksPerThread), as
     * many as the key blocks allow, and their dQ sums within half the pack budget (so that they
     * follow the work, not the thread count); the sums count against the budget like the packs.
     * Budget checks divide instead of multiplying, so no product below can overflow. */
    const int64_t group = problem->group;
    const int64_t wanted = kBackwardTasksPerThread * state->threads;
    const int64_t k_blocks = mfa_cpu_blocks(plan.seq_k_max, plan.block_k);
    const int64_t q_blocks = mfa_cpu_blocks(plan.seq_q_max, plan.block_q);
    plan.dq_stripe_floats = std::max<int64_t>(mfa_cpu_dq_stripe_floats(&plan), 1);
    const int64_t affordable_stripes = kPackBudgetFloats / 2 / group / plan.dq_stripe_floats;
    const int64_t most_stripes =
        std::max<int64_t>(std::min({k_blocks, wanted, affordable_stripes}), 1);
    const int64_t per_query_head = plan.q_pack_floats + most_stripes * plan.dq_stripe_floats;
    const int64_t left = kPackBudgetFloats - plan.kv_pack_floats;
    int64_t chunk = 1, members = group;
    if (left > 0 && per_query_head <= left / group) {
        chunk = chunk_kv_heads(problem, state->threads, most_stripes,
                               plan.kv_pack_floats + group * per_query_head);
    } else {
        /* One key/value head at a time, its query heads in as many passes as the budget needs
         * (large groups, MQA above all, would otherwise pack every query head at once). */
        members = left > 0 ? left / per_query_head : 1;
        members = std::min(std::max(members, int64_t(1)), group);
    }
    plan.stripes = std::min(most_stripes, std::max<int64_t>((wanted + chunk - 1) / chunk, 1));
    plan.chunk_kv_heads = chunk;
    plan.members = members;
    plan.first_member = 0;
    const int64_t pack_blocks_q = mfa_cpu_pack_blocks(&plan, plan.seq_q_max);
    const int64_t most_tasks =
        chunk * std::max({mfa_cpu_pack_blocks(&plan, plan.seq_k_max) + members * pack_blocks_q,
                          plan.stripes, members * q_blocks});
    const int64_t units = problem->batch * problem->heads_kv;
    aligned_buffer<int64_t> prefix;
    aligned_buffer<double> sink_parts;
    float_buffer kv_packs, q_packs, kv_grads, dq_stripes;
    workspace_slots workspace;
    status = prefix.allocate(units + 1, 1, "task offsets");
    if (status == MFA_OK && mfa_view_present(&problem->dsinks))
        status = sink_parts.allocate(problem->batch * problem->heads_q, pack_blocks_q,
                                     "the sinks' gradient by blocks");
    if (status == MFA_OK) status = kv_packs.allocate(plan.kv_pack_floats, chunk, "packed K and V");
    if (status == MFA_OK)
        status = q_packs.allocate(plan.q_pack_floats, chunk * members, "packed Q and dO");
    if (status == MFA_OK && members < group)
        status = kv_grads.allocate(plan.kv_grads_floats, chunk, "dK and dV between passes");
    if (status == MFA_OK)
        status = dq_stripes.allocate(plan.dq_stripe_floats, chunk * plan.stripes * members,
                                     "dQ sums of the key stripes");
    if (status == MFA_OK)
        status = workspace.allocate(state, slot_floats, most_tasks, "backward tiles");
    if (status != MFA_OK) return status;
    plan.kv_packs = kv_packs.data();
    plan.q_packs = q_packs.data();
    plan.kv_grads = kv_grads.data();
    plan.dq_stripes = dq_stripes.data();
    plan.sink_parts = sink_parts.data();
    if (plan.sink_parts)
        std::fill(plan.sink_parts,
                  plan.sink_parts + problem->batch * problem->heads_q * pack_blocks_q, 0.0);

    for (plan.first_kv_head = 0; plan.first_kv_head < units; plan.first_kv_head += chunk) {
        plan.chunk_kv_heads = std::min(chunk, units - plan.first_kv_head);
        for (plan.first_member = 0; plan.first_member < group; plan.first_member += members) {
            plan.members = std::min(members, group - plan.first_member);
            run_pass(state, &plan, &workspace, state->kernels->backward_pack,
                     mfa_cpu_backward_pack_tasks, prefix.data());
            run_pass(state, &plan, &workspace, state->kernels->backward, mfa_cpu_backward_tasks,
                     prefix.data());
            run_pass(state, &plan, &workspace, state->kernels->backward_dq,
                     mfa_cpu_backward_dq_tasks, prefix.data());
        }
    }
    if (plan.sink_parts) store_dsinks(&plan);
    return MFA_OK;
}

const mfa_backend_ops cpu_ops = {
    MFA_BACKEND_CPU,  cpu_available, cpu_create,   cpu_destroy, cpu_device_name,
    cpu_capabilities, cpu_forward,   cpu_backward, nullptr, /* no GPU time */
    nullptr,                                                /* host memory only */
};

} // namespace

extern "C" const mfa_backend_ops* mfa_cpu_backend_ops(void) { return &cpu_ops; }
