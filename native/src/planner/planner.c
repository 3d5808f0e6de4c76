/*
 * The attention planner: problem + GPU family -> kernels, constants, grid, memory, bindings.
 */
#include "planner/planner.h"

#include <limits.h>
#include <string.h>

#include "planner/tables.h"

_Static_assert(sizeof(mfa_kernel_params) == MFA_KERNEL_PARAMS_SIZE,
               "mfa_kernel_params must have the layout the kernels assume");

/* Sequence lengths are int32 in the kernels, and row + band sums must not overflow. */
#define MFA_PLAN_MAX_SEQUENCE (INT64_C(1) << 30)

static const char* const kernel_names[MFA_PASS_KIND_COUNT] = {
    "kernel_attention_forward",
    "kernel_attention_backward_query",
    "kernel_attention_backward_key_value",
};

const char* mfa_pass_kernel_name(mfa_pass_kind kind) {
    return (unsigned)kind < MFA_PASS_KIND_COUNT ? kernel_names[kind] : NULL;
}

const char* mfa_operand_name(mfa_operand operand) {
    static const char* const names[MFA_OPERAND_COUNT] = {"q",     "k",    "v",  "out", "lse",
                                                         "delta", "dout", "dv", "dk",  "dq"};
    return operand < MFA_OPERAND_COUNT ? names[operand] : "?";
}

static uint32_t round_up(uint32_t value, uint32_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
}

/* The extent of a strided view in elements: the lowest and highest element offsets reached. */
typedef struct extent {
    int64_t lowest, highest;
    int empty;
} extent;

static mfa_status view_extent(const int64_t shape[4], const int64_t stride[4], const char* name,
                              extent* out) {
    out->lowest = out->highest = 0;
    out->empty = 0;
    for (int i = 0; i < 4; ++i)
        if (shape[i] == 0) out->empty = 1;
    if (out->empty) return MFA_OK;
    for (int i = 0; i < 4; ++i) {
        int64_t reach;
        if (__builtin_mul_overflow(stride[i], shape[i] - 1, &reach) ||
            __builtin_add_overflow(reach < 0 ? out->lowest : out->highest, reach,
                                   reach < 0 ? &out->lowest : &out->highest))
            return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                                 "metal planner: the extent of %s does not fit in 64 bits", name);
    }
    return MFA_OK;
}

int mfa_problem_operand(const mfa_problem* p, mfa_operand operand, mfa_operand_view* out) {
    const int64_t element = p->dtype == MFA_DTYPE_F32 ? 4 : 2; /* f16 and bf16 */
    const int64_t query[4] = {p->batch, p->heads_q, p->seq_q, p->head_dim};
    const int64_t key[4] = {p->batch, p->heads_kv, p->seq_k, p->head_dim};
    const int64_t value[4] = {p->batch, p->heads_kv, p->seq_k, p->head_dim_v};
    const int64_t output[4] = {p->batch, p->heads_q, p->seq_q, p->head_dim_v};
    const int64_t rows[4] = {p->batch, p->heads_q, p->seq_q, 1};
    const struct {
        const mfa_view* view;
        const int64_t* shape;
        int64_t element_size;
    } table[MFA_OPERAND_COUNT] = {
        [MFA_OPERAND_Q] = {&p->q, query, element},
        [MFA_OPERAND_K] = {&p->k, key, element},
        [MFA_OPERAND_V] = {&p->v, value, element},
        [MFA_OPERAND_O] = {&p->out, output, element},
        [MFA_OPERAND_L] = {&p->lse, rows, 4},
        [MFA_OPERAND_DELTA] = {NULL, rows, 4},
        [MFA_OPERAND_DOUT] = {&p->dout, output, element},
        [MFA_OPERAND_DV] = {&p->dv, value, element},
        [MFA_OPERAND_DK] = {&p->dk, key, element},
        [MFA_OPERAND_DQ] = {&p->dq, query, element},
    };
    if (operand >= MFA_OPERAND_COUNT) return 0;
    out->view = table[operand].view;
    memcpy(out->shape, table[operand].shape, sizeof out->shape);
    out->element_size = table[operand].element_size;
    return 1;
}

/* The argument block's layout of an operand; operand is one the planner's tables bind. */
static mfa_operand_layout* layout_of(mfa_kernel_params* params, mfa_operand operand) {
    switch (operand) {
        case MFA_OPERAND_Q: return &params->q;
        case MFA_OPERAND_K: return &params->k;
        case MFA_OPERAND_V: return &params->v;
        case MFA_OPERAND_O: return &params->o;
        case MFA_OPERAND_L: return &params->l;
        case MFA_OPERAND_DELTA: return &params->delta;
        case MFA_OPERAND_DOUT: return &params->dout;
        case MFA_OPERAND_DV: return &params->dv;
        case MFA_OPERAND_DK: return &params->dk;
        default: return &params->dq; /* MFA_OPERAND_DQ */
    }
}

/* Binds one operand: the binding covers exactly the bytes the view can reach, and the
 * layout's origin locates element (0,0,0,0) inside it. */
static mfa_status bind_operand(const mfa_problem* problem, mfa_pass_plan* pass, mfa_operand operand,
                               int writable) {
    mfa_operand_view view;
    mfa_problem_operand(problem, operand, &view);
    int64_t stride[4];
    if (view.view) {
        memcpy(stride, view.view->stride, sizeof stride);
    } else { /* the delta scratch: contiguous [B, Hq, Nq] */
        stride[2] = 1;
        stride[1] = view.shape[2];
        stride[0] = view.shape[1] * view.shape[2];
    }
    if (operand == MFA_OPERAND_L || operand == MFA_OPERAND_DELTA) stride[3] = 0;
    extent e;
    mfa_status status = view_extent(view.shape, stride, mfa_operand_name(operand), &e);
    if (status != MFA_OK) return status;
    int64_t bytes, offset;
    if (__builtin_mul_overflow(e.highest - e.lowest + 1, view.element_size, &bytes) ||
        __builtin_mul_overflow(e.lowest, view.element_size, &offset))
        return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                             "metal planner: the byte extent of %s does not fit in 64 bits",
                             mfa_operand_name(operand));
    mfa_operand_layout* layout = layout_of(&pass->params, operand);
    layout->origin = -e.lowest;
    memcpy(layout->stride, stride, sizeof stride);
    mfa_buffer_binding* binding = &pass->bindings[pass->num_bindings++];
    binding->index = operand; /* operands are bound at their own number */
    binding->operand = operand;
    binding->writable = writable;
    binding->byte_offset = e.empty ? 0 : offset;
    binding->byte_length = e.empty ? 0 : bytes;
    return MFA_OK;
}

static void add_constant(mfa_pass_plan* pass, uint32_t index, uint32_t type, uint32_t value) {
    mfa_function_constant* c = &pass->constants[pass->num_constants++];
    c->index = index;
    c->type = type;
    c->value = value;
}

/* Shape of the block grid of one pass, chosen from the tables and the limits. */
static mfa_status choose_blocks(const mfa_problem* problem, mfa_gpu_family family,
                                mfa_pass_kind kind, uint32_t max_threads, mfa_pass_plan* pass) {
    const mfa_precision_class precision =
        problem->dtype == MFA_DTYPE_F32 ? MFA_PRECISION_F32 : MFA_PRECISION_16BIT;
    const int64_t widest =
        problem->head_dim > problem->head_dim_v ? problem->head_dim : problem->head_dim_v;
    const mfa_block_row* row =
        mfa_block_row_for(mfa_block_table_for(family, precision, kind), widest);

    /* Tables are edited by hand when retuning: a row the kernels cannot run is a bug to report,
     * never something to dispatch. */
    if (row->block_parallel % 8 || row->block_parallel == 0 ||
        row->block_parallel > MFA_MAX_BLOCK_PARALLEL || row->block_traversal % 8 ||
        row->block_traversal == 0 || row->block_traversal > MFA_MAX_BLOCK_TRAVERSAL ||
        row->block_head % 8 || row->block_head == 0 || row->block_head > MFA_MAX_BLOCK_HEAD)
        return mfa_set_error(MFA_ERROR_INTERNAL,
                             "metal planner: table row (D<=%u: %u, %u, %u) is outside the "
                             "kernels' limits",
                             row->max_head_dim, row->block_parallel, row->block_traversal,
                             row->block_head);

    /* Fewer simdgroups (8 rows each) when the pipeline cannot run the table's threadgroup;
     * check_problem guaranteed room for one. */
    uint32_t parallel = row->block_parallel;
    if (parallel / 8 * 32 > max_threads) parallel = max_threads / 32 * 8;

    const uint32_t widest8 = round_up((uint32_t)widest, 8);
    const uint32_t head = row->block_head < widest8 ? row->block_head : widest8;
    /* Output columns per threadgroup: a whole number of staging tiles, as many as fit the
     * accumulator registers. */
    uint32_t out = round_up(widest8, head);
    const uint32_t out_cap = MFA_MAX_BLOCK_OUT / head * head;
    if (out > out_cap) out = out_cap;

    /* The operand a cache flag keeps in registers, per pass. */
    const int64_t first_width = problem->head_dim;
    const int64_t second_width = kind == MFA_PASS_FORWARD ? 0 : problem->head_dim_v;
    const int cache_first = row->cache_parallel && first_width <= MFA_MAX_CACHED_HEAD;
    const int cache_second =
        row->cache_parallel2 && second_width > 0 && second_width <= MFA_MAX_CACHED_HEAD;

    pass->block_parallel = parallel;
    pass->block_traversal = row->block_traversal;
    pass->block_head = head;
    pass->block_out = out;
    pass->cached_operands = 0;
    if (kind == MFA_PASS_BACKWARD_KEY_VALUE) {
        if (cache_first) pass->cached_operands |= 1u << MFA_OPERAND_K;
        if (cache_second) pass->cached_operands |= 1u << MFA_OPERAND_V;
    } else {
        if (cache_first) pass->cached_operands |= 1u << MFA_OPERAND_Q;
        if (cache_second) pass->cached_operands |= 1u << MFA_OPERAND_DOUT;
    }
    pass->threads_per_threadgroup = parallel / 8 * 32;
    const uint32_t per_row_vectors = kind == MFA_PASS_BACKWARD_KEY_VALUE ? 2 : 0;
    const uint32_t bytes =
        4 * mfa_staging_floats(parallel, row->block_traversal, head, per_row_vectors);
    pass->threadgroup_memory_length = round_up(bytes, 16);
    if (pass->threadgroup_memory_length > MFA_PLAN_THREADGROUP_MEMORY_LIMIT)
        return mfa_set_error(MFA_ERROR_INTERNAL,
                             "metal planner: table row for D=%lld needs %u bytes of threadgroup "
                             "memory (limit %d)",
                             (long long)widest, pass->threadgroup_memory_length,
                             MFA_PLAN_THREADGROUP_MEMORY_LIMIT);

    add_constant(pass, MFA_FC_DTYPE, MFA_CONSTANT_TYPE_UINT, (uint32_t)problem->dtype);
    add_constant(pass, MFA_FC_HEAD_DIM, MFA_CONSTANT_TYPE_UINT, (uint32_t)problem->head_dim);
    add_constant(pass, MFA_FC_HEAD_DIM_V, MFA_CONSTANT_TYPE_UINT, (uint32_t)problem->head_dim_v);
    add_constant(pass, MFA_FC_BLOCK_PARALLEL, MFA_CONSTANT_TYPE_UINT, parallel);
    add_constant(pass, MFA_FC_BLOCK_TRAVERSAL, MFA_CONSTANT_TYPE_UINT, row->block_traversal);
    add_constant(pass, MFA_FC_BLOCK_HEAD, MFA_CONSTANT_TYPE_UINT, head);
    add_constant(pass, MFA_FC_BLOCK_OUT, MFA_CONSTANT_TYPE_UINT, out);
    add_constant(pass, MFA_FC_CACHE_PARALLEL, MFA_CONSTANT_TYPE_BOOL, (uint32_t)cache_first);
    add_constant(pass, MFA_FC_CACHE_PARALLEL2, MFA_CONSTANT_TYPE_BOOL, (uint32_t)cache_second);
    return MFA_OK;
}

static mfa_status check_problem(const mfa_problem* problem, mfa_gpu_family family,
                                uint32_t max_threads) {
    if (family != MFA_GPU_FAMILY_APPLE7 && family != MFA_GPU_FAMILY_APPLE8 &&
        family != MFA_GPU_FAMILY_APPLE9)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal planner: gpu family %d is not Apple7, Apple8 or Apple9",
                             (int)family);
    if (max_threads < 32)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal planner: max_threads_per_threadgroup %u is below one "
                             "simdgroup (32 threads)",
                             max_threads);
    if (problem->head_dim < 1 || problem->head_dim > MFA_PLAN_MAX_HEAD_DIM ||
        problem->head_dim_v < 1 || problem->head_dim_v > MFA_PLAN_MAX_HEAD_DIM)
        return mfa_set_error(
            MFA_ERROR_UNSUPPORTED, "metal planner: head dims D=%lld Dv=%lld outside 1..%d",
            (long long)problem->head_dim, (long long)problem->head_dim_v, MFA_PLAN_MAX_HEAD_DIM);
    if (problem->seq_q > MFA_PLAN_MAX_SEQUENCE || problem->seq_k > MFA_PLAN_MAX_SEQUENCE)
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "metal planner: sequence lengths Nq=%lld Nk=%lld exceed 2^30",
                             (long long)problem->seq_q, (long long)problem->seq_k);
    if (problem->batch > INT32_MAX || problem->heads_q > INT32_MAX)
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "metal planner: batch %lld or heads %lld exceed 2^31-1",
                             (long long)problem->batch, (long long)problem->heads_q);
    return MFA_OK;
}

/* The per-call argument block, minus operand layouts (filled when binding). */
static void fill_params(const mfa_problem* problem, mfa_kernel_params* params) {
    memset(params, 0, sizeof *params);
    params->group = (int32_t)problem->group;
    params->seq_q = (int32_t)problem->seq_q;
    params->seq_k = (int32_t)problem->seq_k;
    /* The core's band lies in [-seq_q, seq_k], which check_problem bounds by 2^30. */
    params->band_lo = (int32_t)problem->band_lo;
    params->band_hi = (int32_t)problem->band_hi;
    params->scale = problem->scale;
}

static mfa_status plan_pass(const mfa_problem* problem, mfa_gpu_family family, uint32_t max_threads,
                            mfa_pass_kind kind, mfa_pass_plan* pass) {
    memset(pass, 0, sizeof *pass);
    pass->kind = kind;
    pass->kernel_name = kernel_names[kind];
    mfa_status status = choose_blocks(problem, family, kind, max_threads, pass);
    if (status != MFA_OK) return status;
    /* Decoding with GQA: when a head's queries cannot fill a threadgroup, the forward packs
     * the queries of all heads that share a key/value head into its rows (see forward.h). */
    const int pack_group = kind == MFA_PASS_FORWARD && problem->group > 1 &&
                           problem->group <= INT32_MAX / MFA_MAX_BLOCK_PARALLEL &&
                           problem->seq_q < (int64_t)pass->block_parallel;
    if (kind == MFA_PASS_FORWARD) {
        add_constant(pass, MFA_FC_HAS_LSE, MFA_CONSTANT_TYPE_BOOL, mfa_view_present(&problem->lse));
        add_constant(pass, MFA_FC_PACK_GROUP, MFA_CONSTANT_TYPE_BOOL, (uint32_t)pack_group);
    }

    mfa_kernel_params* params = &pass->params;
    fill_params(problem, params);
    const int64_t rows = kind == MFA_PASS_BACKWARD_KEY_VALUE ? problem->seq_k
                         : pack_group                        ? problem->group * problem->seq_q
                                                             : problem->seq_q;
    const int64_t out_width =
        kind == MFA_PASS_FORWARD ? problem->head_dim_v
        : kind == MFA_PASS_BACKWARD_QUERY
            ? problem->head_dim
            : (problem->head_dim > problem->head_dim_v ? problem->head_dim : problem->head_dim_v);
    const int64_t out_blocks = (out_width + pass->block_out - 1) / pass->block_out;
    const int64_t row_blocks = (rows + pass->block_parallel - 1) / pass->block_parallel;
    params->out_blocks = (int32_t)out_blocks;
    pass->threadgroups[0] = (uint64_t)(row_blocks * out_blocks);
    pass->threadgroups[1] =
        (uint64_t)(kind == MFA_PASS_BACKWARD_KEY_VALUE || pack_group ? problem->heads_kv
                                                                     : problem->heads_q);
    pass->threadgroups[2] = (uint64_t)problem->batch;
    if (pass->threadgroups[0] > UINT32_MAX)
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "metal planner: %llu threadgroups along x exceed 2^32-1",
                             (unsigned long long)pass->threadgroups[0]);
    pass->params_index = MFA_BUFFER_PARAMS;

    /* What each kernel reads (0) and writes (1), in its signature's order. */
    typedef struct operand_use {
        mfa_operand operand;
        int writable;
    } operand_use;
    static const operand_use forward[] = {{MFA_OPERAND_Q, 0},
                                          {MFA_OPERAND_K, 0},
                                          {MFA_OPERAND_V, 0},
                                          {MFA_OPERAND_O, 1},
                                          {MFA_OPERAND_L, 1}};
    static const operand_use backward_query[] = {
        {MFA_OPERAND_Q, 0}, {MFA_OPERAND_K, 0},     {MFA_OPERAND_V, 0},    {MFA_OPERAND_O, 0},
        {MFA_OPERAND_L, 0}, {MFA_OPERAND_DELTA, 1}, {MFA_OPERAND_DOUT, 0}, {MFA_OPERAND_DQ, 1}};
    static const operand_use backward_key_value[] = {
        {MFA_OPERAND_Q, 0},     {MFA_OPERAND_K, 0},    {MFA_OPERAND_V, 0},  {MFA_OPERAND_L, 0},
        {MFA_OPERAND_DELTA, 0}, {MFA_OPERAND_DOUT, 0}, {MFA_OPERAND_DV, 1}, {MFA_OPERAND_DK, 1}};
    const operand_use* uses = kind == MFA_PASS_FORWARD          ? forward
                              : kind == MFA_PASS_BACKWARD_QUERY ? backward_query
                                                                : backward_key_value;
    const size_t count = kind == MFA_PASS_FORWARD
                             ? sizeof forward / sizeof forward[0]
                             : sizeof backward_query / sizeof backward_query[0];
    _Static_assert(sizeof backward_query == sizeof backward_key_value,
                   "both backward passes bind eight operands");
    for (size_t i = 0; i < count; ++i) {
        /* The forward writes L only when the caller asked for it (fc_has_lse). */
        if (kind == MFA_PASS_FORWARD && uses[i].operand == MFA_OPERAND_L &&
            !mfa_view_present(&problem->lse))
            continue;
        if ((status = bind_operand(problem, pass, uses[i].operand, uses[i].writable)) != MFA_OK)
            return status;
    }
    return MFA_OK;
}

mfa_status mfa_plan_forward(const mfa_problem* problem, mfa_gpu_family family,
                            uint32_t max_threads_per_threadgroup, mfa_plan* plan) {
    mfa_status status = check_problem(problem, family, max_threads_per_threadgroup);
    if (status != MFA_OK) return status;
    memset(plan, 0, sizeof *plan);
    plan->num_passes = 1;
    return plan_pass(problem, family, max_threads_per_threadgroup, MFA_PASS_FORWARD,
                     &plan->passes[0]);
}

mfa_status mfa_plan_backward(const mfa_problem* problem, mfa_gpu_family family,
                             uint32_t max_threads_per_threadgroup, mfa_plan* plan) {
    mfa_status status = check_problem(problem, family, max_threads_per_threadgroup);
    if (status != MFA_OK) return status;
    memset(plan, 0, sizeof *plan);
    plan->num_passes = 2;
    int64_t scratch;
    if (__builtin_mul_overflow(problem->batch, problem->heads_q, &scratch) ||
        __builtin_mul_overflow(scratch, problem->seq_q, &scratch) ||
        __builtin_mul_overflow(scratch, (int64_t)sizeof(float), &scratch))
        return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                             "metal planner: the backward scratch size does not fit in 64 bits");
    plan->scratch_bytes = scratch;
    if ((status = plan_pass(problem, family, max_threads_per_threadgroup, MFA_PASS_BACKWARD_QUERY,
                            &plan->passes[0])) != MFA_OK)
        return status;
    return plan_pass(problem, family, max_threads_per_threadgroup, MFA_PASS_BACKWARD_KEY_VALUE,
                     &plan->passes[1]);
}
