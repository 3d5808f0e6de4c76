/*
 * The attention planner: problem + GPU family -> kernels, constants, grid, memory, bindings.
 */
#include "planner/planner.h"

#include <limits.h>
#include <string.h>

#include "planner/tables.h"

_Static_assert(sizeof(mfa_kernel_params) == MFA_KERNEL_PARAMS_SIZE,
               "mfa_kernel_params must have the layout the kernels assume");
/* The planner passes mfa_dtype values and mfa.h's block size to the kernels as they are. */
_Static_assert(MFA_KERNEL_DTYPE_F32 == MFA_DTYPE_F32 && MFA_KERNEL_DTYPE_F16 == MFA_DTYPE_F16 &&
                   MFA_KERNEL_DTYPE_BF16 == MFA_DTYPE_BF16 &&
                   MFA_KERNEL_DTYPE_BOOL == MFA_DTYPE_BOOL,
               "kernel dtype codes are mfa_dtype's");
_Static_assert(MFA_KERNEL_MASK_BLOCK == MFA_MASK_BLOCK,
               "mask summaries cover MFA_MASK_BLOCK queries and keys per block");

/* Sequence lengths are int32 in the kernels, and row + band sums must not overflow. */
#define MFA_PLAN_MAX_SEQUENCE (INT64_C(1) << 30)

static const char* const kernel_names[MFA_PASS_KIND_COUNT] = {
    "kernel_attention_forward",
    "kernel_attention_backward_query",
    "kernel_attention_backward_key_value",
    "kernel_attention_sink_gradient",
    "kernel_attention_append",
    "kernel_attention_combine",
};

const char* mfa_pass_kernel_name(mfa_pass_kind kind) {
    return (unsigned)kind < MFA_PASS_KIND_COUNT ? kernel_names[kind] : NULL;
}

const char* mfa_operand_name(mfa_operand operand) {
    static const char* const names[MFA_OPERAND_COUNT] = {"q",
                                                         "k",
                                                         "v",
                                                         "out",
                                                         "lse",
                                                         "delta",
                                                         "dout",
                                                         "dv",
                                                         "dk",
                                                         "dq",
                                                         "mask",
                                                         "block_mask",
                                                         "alibi_slopes",
                                                         "sinks",
                                                         "dsinks",
                                                         "cu_seqlens_q",
                                                         "cu_seqlens_k",
                                                         "block_table",
                                                         "cache_seqlens",
                                                         "k_new",
                                                         "v_new",
                                                         "partial_o",
                                                         "partial_l"};
    return operand < MFA_OPERAND_COUNT ? names[operand] : "?";
}

int mfa_operand_is_scratch(mfa_operand operand) {
    return operand == MFA_OPERAND_DELTA || operand == MFA_OPERAND_PARTIAL_O ||
           operand == MFA_OPERAND_PARTIAL_L;
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

static int64_t dtype_size(mfa_dtype dtype) {
    return dtype == MFA_DTYPE_F32 || dtype == MFA_DTYPE_I32 ? 4 : dtype == MFA_DTYPE_BOOL ? 1 : 2;
}

int mfa_problem_operand(const mfa_problem* p, mfa_operand operand, mfa_operand_view* out) {
    const int64_t element = dtype_size(p->dtype);
    /* Where the rows of the query side and of the key side live: packed operands hold every
     * sequence's rows in one [1, H, total, D] view; a paged cache is its blocks. */
    const int varlen = p->layout == MFA_LAYOUT_VARLEN, paged = p->layout == MFA_LAYOUT_PAGED;
    const int64_t q_batch = varlen ? 1 : p->batch, q_rows = varlen ? p->varlen.total_q : p->seq_q;
    const int64_t k_batch = varlen ? 1 : paged ? p->paged.num_blocks : p->batch;
    const int64_t k_rows = varlen ? p->varlen.total_k : paged ? p->paged.block_size : p->seq_k;
    const int64_t query[4] = {q_batch, p->heads_q, q_rows, p->head_dim};
    const int64_t key[4] = {k_batch, p->heads_kv, k_rows, p->head_dim};
    const int64_t value[4] = {k_batch, p->heads_kv, k_rows, p->head_dim_v};
    const int64_t output[4] = {q_batch, p->heads_q, q_rows, p->head_dim_v};
    const int64_t rows[4] = {q_batch, p->heads_q, q_rows, 1};
    const int64_t mask[4] = {p->batch, p->heads_q, p->seq_q, p->seq_k};
    const int64_t summary[4] = {p->batch, p->heads_q,
                                (p->seq_q + MFA_MASK_BLOCK - 1) / MFA_MASK_BLOCK,
                                (p->seq_k + MFA_MASK_BLOCK - 1) / MFA_MASK_BLOCK};
    const int64_t slopes[4] = {p->batch, p->heads_q, 1, 1};
    const int64_t per_head[4] = {1, p->heads_q, 1, 1};
    const int64_t offsets[4] = {1, 1, 1, p->batch + 1};
    const int64_t table[4] = {p->batch, 1, 1, p->paged.max_blocks};
    const int64_t lengths[4] = {p->batch, 1, 1, 1};
    const int64_t k_new[4] = {p->batch, p->heads_kv, p->paged.new_len, p->head_dim};
    const int64_t v_new[4] = {p->batch, p->heads_kv, p->paged.new_len, p->head_dim_v};
    const struct {
        const mfa_view* view;
        const int64_t* shape;
        int64_t element_size;
    } operands[MFA_OPERAND_COUNT] = {
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
        [MFA_OPERAND_MASK] = {&p->mask, mask, dtype_size(p->mask_dtype)},
        [MFA_OPERAND_BLOCK_MASK] = {&p->block_mask, summary, 1},
        [MFA_OPERAND_ALIBI] = {&p->alibi_slopes, slopes, 4},
        [MFA_OPERAND_SINKS] = {&p->sinks, per_head, 4},
        [MFA_OPERAND_DSINKS] = {&p->dsinks, per_head, 4},
        [MFA_OPERAND_CU_SEQLENS_Q] = {&p->varlen.cu_seqlens_q, offsets, 4},
        [MFA_OPERAND_CU_SEQLENS_K] = {&p->varlen.cu_seqlens_k, offsets, 4},
        [MFA_OPERAND_BLOCK_TABLE] = {&p->paged.block_table, table, 4},
        [MFA_OPERAND_CACHE_SEQLENS] = {&p->paged.cache_seqlens, lengths, 4},
        [MFA_OPERAND_K_NEW] = {&p->paged.k_new, k_new, element},
        [MFA_OPERAND_V_NEW] = {&p->paged.v_new, v_new, element},
        [MFA_OPERAND_PARTIAL_O] = {NULL, output, 4},
        [MFA_OPERAND_PARTIAL_L] = {NULL, rows, 4},
    };
    if (operand >= MFA_OPERAND_COUNT) return 0;
    out->view = operands[operand].view;
    memcpy(out->shape, operands[operand].shape, sizeof out->shape);
    out->element_size = operands[operand].element_size;
    return 1;
}

/* The argument block's layout of each operand, in MFA_OPERAND_* order. */
static mfa_operand_layout* layout_of(mfa_kernel_params* params, mfa_operand operand) {
    mfa_operand_layout* const layouts[MFA_OPERAND_COUNT] = {&params->q,
                                                            &params->k,
                                                            &params->v,
                                                            &params->o,
                                                            &params->l,
                                                            &params->delta,
                                                            &params->dout,
                                                            &params->dv,
                                                            &params->dk,
                                                            &params->dq,
                                                            &params->mask,
                                                            &params->block_mask,
                                                            &params->alibi,
                                                            &params->sinks,
                                                            &params->dsinks,
                                                            &params->cu_seqlens_q,
                                                            &params->cu_seqlens_k,
                                                            &params->block_table,
                                                            &params->cache_seqlens,
                                                            &params->k_new,
                                                            &params->v_new,
                                                            &params->partial_o,
                                                            &params->partial_l};
    return layouts[operand];
}

/* Binds one operand: the binding covers exactly the bytes the view can reach, and the
 * layout's origin locates element (0,0,0,0) inside it. A scratch operand is contiguous over its
 * shape, `copies` times over (the splits of partial results; 1 otherwise), *copy_stride
 * elements apart. */
/* Whether the kernels may read this operand's rows MFA_VECTOR_ELEMENTS elements at a time
 * (vector_operands): features contiguous, the origin and every other stride (of an axis longer
 * than 1) a multiple of the vector, and element (0, 0, 0, 0) at an address that is one too. The
 * address is the view's in host memory, which devices bind in place or through pages (keeping
 * it modulo a page) or copy to the start of a fresh buffer (which the origin's alignment then
 * keeps aligned), and its byte offset in a device buffer, which devices bind from the buffer's
 * start. */
static int rows_take_vectors(const mfa_operand_view* view, const int64_t shape[4],
                             const int64_t stride[4], int64_t origin) {
    const int64_t vector_bytes = MFA_VECTOR_ELEMENTS * view->element_size;
    if (view->view == NULL || stride[3] != 1 || origin % MFA_VECTOR_ELEMENTS != 0) return 0;
    for (int axis = 0; axis < 3; ++axis)
        if (shape[axis] > 1 && stride[axis] % MFA_VECTOR_ELEMENTS != 0) return 0;
    const uint64_t address = view->view->buffer != NULL ? (uint64_t)view->view->byte_offset
                                                        : (uint64_t)(uintptr_t)view->view->data;
    return address % (uint64_t)vector_bytes == 0;
}

static mfa_status bind_operand(const mfa_problem* problem, mfa_pass_plan* pass, mfa_operand operand,
                               int writable, int64_t copies, int64_t* copy_stride) {
    mfa_operand_view view;
    if (!mfa_problem_operand(problem, operand, &view))
        return mfa_set_error(MFA_ERROR_INTERNAL, "metal planner: no operand %d", (int)operand);
    int64_t stride[4], shape[4];
    memcpy(shape, view.shape, sizeof shape);
    if (view.view) {
        memcpy(stride, view.view->stride, sizeof stride);
    } else {
        stride[3] = 1;
        stride[2] = shape[3];
        stride[1] = shape[2] * stride[2];
        stride[0] = shape[1] * stride[1];
        /* The copies one after another: copies times the first axis, with the same strides. */
        if (__builtin_mul_overflow(shape[0], stride[0], copy_stride) ||
            __builtin_mul_overflow(shape[0], copies, &shape[0]))
            return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                                 "metal planner: the size of %s does not fit in 64 bits",
                                 mfa_operand_name(operand));
    }
    if (operand == MFA_OPERAND_L || operand == MFA_OPERAND_DELTA ||
        operand == MFA_OPERAND_PARTIAL_L)
        stride[3] = 0;
    extent e;
    mfa_status status = view_extent(shape, stride, mfa_operand_name(operand), &e);
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
    if (rows_take_vectors(&view, shape, stride, layout->origin))
        pass->params.vector_operands |= 1u << operand;
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
    /* A forward over a paged cache keeps each traversed key's block and row. */
    const uint32_t per_row_vectors =
        kind == MFA_PASS_FORWARD && problem->layout == MFA_LAYOUT_PAGED ? 2 : 0;
    /* Apple9 rows read every operand from device memory; a paged cache's rows are staged
     * anyway, since each lookup through its block table would cost a threadgroup read. */
    const int direct = row->direct_loads && problem->layout != MFA_LAYOUT_PAGED;
    const uint32_t element_size = problem->dtype == MFA_DTYPE_F32 ? 4 : 2;
    const uint32_t bytes =
        mfa_staging_bytes(direct ? 0 : parallel, direct ? 0 : row->block_traversal,
                          row->block_traversal, head, element_size, per_row_vectors);
    /* A kernel that stages nothing still declares its threadgroup buffer: one 16-byte granule. */
    pass->threadgroup_memory_length = bytes > 0 ? round_up(bytes, 16) : 16;
    if (pass->threadgroup_memory_length > MFA_PLAN_THREADGROUP_MEMORY_LIMIT)
        return mfa_set_error(MFA_ERROR_INTERNAL,
                             "metal planner: table row for D=%lld needs %u bytes of threadgroup "
                             "memory (limit %d)",
                             (long long)widest, pass->threadgroup_memory_length,
                             MFA_PLAN_THREADGROUP_MEMORY_LIMIT);

    add_constant(pass, MFA_FC_BLOCK_PARALLEL, MFA_CONSTANT_TYPE_UINT, parallel);
    add_constant(pass, MFA_FC_BLOCK_TRAVERSAL, MFA_CONSTANT_TYPE_UINT, row->block_traversal);
    add_constant(pass, MFA_FC_BLOCK_HEAD, MFA_CONSTANT_TYPE_UINT, head);
    add_constant(pass, MFA_FC_BLOCK_OUT, MFA_CONSTANT_TYPE_UINT, out);
    add_constant(pass, MFA_FC_CACHE_PARALLEL, MFA_CONSTANT_TYPE_BOOL, (uint32_t)cache_first);
    add_constant(pass, MFA_FC_CACHE_PARALLEL2, MFA_CONSTANT_TYPE_BOOL, (uint32_t)cache_second);
    add_constant(pass, MFA_FC_DIRECT_LOADS, MFA_CONSTANT_TYPE_BOOL, (uint32_t)direct);
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
    /* Packed rows, cache blocks and appended keys are int32 in the kernels. */
    const int varlen = problem->layout == MFA_LAYOUT_VARLEN;
    const int paged = problem->layout == MFA_LAYOUT_PAGED;
    const int64_t first = varlen ? problem->varlen.total_q : paged ? problem->paged.num_blocks : 0;
    const int64_t second = varlen ? problem->varlen.total_k : paged ? problem->paged.new_len : 0;
    if (first > INT32_MAX || second > INT32_MAX)
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "metal planner: %lld %s or %lld %s exceed 2^31-1", (long long)first,
                             varlen ? "packed queries" : "cache blocks", (long long)second,
                             varlen ? "packed keys" : "new keys");
    return MFA_OK;
}

/* A window for the kernels' per-sequence bands: -1 (unbounded) as is, anything wider than a
 * sequence can be (2^30) clamped to 2^31 - 1, which sees the same keys. */
static int32_t window_param(int64_t window) {
    return window < 0 ? -1 : window > INT32_MAX ? INT32_MAX : (int32_t)window;
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
    params->softcap = problem->softcap;
    params->softcap_inverse = problem->softcap > 0 ? 1.0f / problem->softcap : 0.0f;
    params->bottom_right = problem->alignment == MFA_ALIGN_BOTTOM_RIGHT;
    params->window_left = window_param(problem->window_left);
    params->window_right = window_param(problem->window_right);
    if (problem->layout == MFA_LAYOUT_PAGED) {
        params->block_size = (int32_t)problem->paged.block_size;
        params->new_len = (int32_t)problem->paged.new_len;
    }
}

/* The function constants every pass of a problem is compiled with: its dtype, head dimensions,
 * and which operands and modifiers this pass uses. */
static void add_variant_constants(mfa_pass_plan* pass, const mfa_problem* problem, int has_lse,
                                  int has_sinks, int initial_state, int split_keys) {
    const int has_mask = mfa_view_present(&problem->mask);
    add_constant(pass, MFA_FC_DTYPE, MFA_CONSTANT_TYPE_UINT, (uint32_t)problem->dtype);
    add_constant(pass, MFA_FC_HEAD_DIM, MFA_CONSTANT_TYPE_UINT, (uint32_t)problem->head_dim);
    add_constant(pass, MFA_FC_HEAD_DIM_V, MFA_CONSTANT_TYPE_UINT, (uint32_t)problem->head_dim_v);
    add_constant(pass, MFA_FC_HAS_LSE, MFA_CONSTANT_TYPE_BOOL, (uint32_t)has_lse);
    add_constant(pass, MFA_FC_HAS_MASK, MFA_CONSTANT_TYPE_BOOL, (uint32_t)has_mask);
    add_constant(pass, MFA_FC_MASK_DTYPE, MFA_CONSTANT_TYPE_UINT,
                 has_mask ? (uint32_t)problem->mask_dtype : 0u);
    add_constant(pass, MFA_FC_HAS_BLOCK_MASK, MFA_CONSTANT_TYPE_BOOL,
                 (uint32_t)mfa_view_present(&problem->block_mask));
    add_constant(pass, MFA_FC_HAS_SOFTCAP, MFA_CONSTANT_TYPE_BOOL, problem->softcap > 0);
    add_constant(pass, MFA_FC_HAS_ALIBI, MFA_CONSTANT_TYPE_BOOL,
                 (uint32_t)mfa_view_present(&problem->alibi_slopes));
    add_constant(pass, MFA_FC_HAS_SINKS, MFA_CONSTANT_TYPE_BOOL, (uint32_t)has_sinks);
    add_constant(pass, MFA_FC_VARLEN, MFA_CONSTANT_TYPE_BOOL, problem->layout == MFA_LAYOUT_VARLEN);
    add_constant(pass, MFA_FC_PAGED, MFA_CONSTANT_TYPE_BOOL, problem->layout == MFA_LAYOUT_PAGED);
    add_constant(pass, MFA_FC_INITIAL_STATE, MFA_CONSTANT_TYPE_BOOL, (uint32_t)initial_state);
    add_constant(pass, MFA_FC_SPLIT_KEYS, MFA_CONSTANT_TYPE_BOOL, (uint32_t)split_keys);
}

/* Split keys: a forward whose grid cannot fill the GPU (decoding: few query rows against many
 * keys) gives each split of the keys its own threadgroups, and a combine pass merges their
 * results through the log-sum-exps. Splitting pays while threadgroups are fewer than the GPU
 * keeps busy (a few per core on every family), and each split keeps enough key blocks to hide
 * the cost of writing and re-reading its partial row. */
#define MFA_PLAN_SPLIT_TARGET_THREADGROUPS 64
#define MFA_PLAN_SPLIT_MIN_BLOCKS          4
#define MFA_PLAN_MAX_SPLITS                32

static uint32_t choose_splits(uint64_t threadgroups, int64_t key_blocks, int needs_combine) {
    uint32_t splits = 0;
    if (threadgroups > 0 && threadgroups < MFA_PLAN_SPLIT_TARGET_THREADGROUPS &&
        key_blocks >= 2 * MFA_PLAN_SPLIT_MIN_BLOCKS) {
        const uint64_t wanted =
            (MFA_PLAN_SPLIT_TARGET_THREADGROUPS + threadgroups - 1) / threadgroups;
        const uint64_t room = (uint64_t)key_blocks / MFA_PLAN_SPLIT_MIN_BLOCKS;
        splits = (uint32_t)(wanted < room ? wanted : room);
        if (splits > MFA_PLAN_MAX_SPLITS) splits = MFA_PLAN_MAX_SPLITS;
    }
    if (splits == 1) splits = 0;
    /* An initial state over rows that several threadgroups share (output blocks) is read by all
     * of them and rewritten by one: it is folded in by the combine instead, from one split. */
    if (splits == 0 && needs_combine) splits = 1;
    return splits;
}

/* What each kernel reads (0) and writes (1). */
typedef struct operand_use {
    mfa_operand operand;
    int writable;
} operand_use;

static mfa_status bind_operands(const mfa_problem* problem, mfa_pass_plan* pass,
                                const operand_use* uses, size_t count, int64_t copies) {
    for (size_t i = 0; i < count; ++i) {
        int64_t copy_stride = 0;
        mfa_status status =
            bind_operand(problem, pass, uses[i].operand, uses[i].writable, copies, &copy_stride);
        if (status != MFA_OK) return status;
        if (uses[i].operand == MFA_OPERAND_PARTIAL_O) pass->params.split_stride_o = copy_stride;
        if (uses[i].operand == MFA_OPERAND_PARTIAL_L) pass->params.split_stride_l = copy_stride;
    }
    return MFA_OK;
}

/* The operands a tiled pass binds beyond its dense ones, in *uses from uses[count]. */
static size_t add_modifier_uses(const mfa_problem* problem, mfa_pass_kind kind, int has_sinks,
                                operand_use* uses, size_t count) {
    if (mfa_view_present(&problem->mask)) uses[count++] = (operand_use){MFA_OPERAND_MASK, 0};
    if (mfa_view_present(&problem->block_mask))
        uses[count++] = (operand_use){MFA_OPERAND_BLOCK_MASK, 0};
    if (mfa_view_present(&problem->alibi_slopes))
        uses[count++] = (operand_use){MFA_OPERAND_ALIBI, 0};
    if (has_sinks) uses[count++] = (operand_use){MFA_OPERAND_SINKS, 0};
    if (problem->layout == MFA_LAYOUT_VARLEN) {
        uses[count++] = (operand_use){MFA_OPERAND_CU_SEQLENS_Q, 0};
        uses[count++] = (operand_use){MFA_OPERAND_CU_SEQLENS_K, 0};
    }
    if (problem->layout == MFA_LAYOUT_PAGED && kind == MFA_PASS_FORWARD) {
        uses[count++] = (operand_use){MFA_OPERAND_BLOCK_TABLE, 0};
        uses[count++] = (operand_use){MFA_OPERAND_CACHE_SEQLENS, 0};
    }
    return count;
}

/* One pass of the tiled kernels (forward, backward-query, backward-key-value). The forward
 * chooses its splits of the keys (*splits, 0 for none). */
static mfa_status plan_tiled_pass(const mfa_problem* problem, mfa_gpu_family family,
                                  uint32_t max_threads, mfa_pass_kind kind, mfa_pass_plan* pass,
                                  uint32_t* splits) {
    memset(pass, 0, sizeof *pass);
    pass->kind = kind;
    pass->kernel_name = kernel_names[kind];
    mfa_status status = choose_blocks(problem, family, kind, max_threads, pass);
    if (status != MFA_OK) return status;
    const int forward = kind == MFA_PASS_FORWARD;
    const int varlen = problem->layout == MFA_LAYOUT_VARLEN;
    /* The grid covers the longest sequence; threadgroups past a shorter one's end leave. */
    const int64_t query_rows = varlen ? problem->varlen.longest_q : problem->seq_q;
    const int64_t key_rows = varlen                                ? problem->varlen.longest_k
                             : problem->layout == MFA_LAYOUT_PAGED ? problem->paged.longest_k
                                                                   : problem->seq_k;
    /* Decoding with GQA: when a head's queries cannot fill a threadgroup, the forward packs
     * the queries of all heads that share a key/value head into its rows (see forward.h). */
    const int pack_group = forward && problem->group > 1 &&
                           problem->group <= INT32_MAX / MFA_MAX_BLOCK_PARALLEL &&
                           query_rows < (int64_t)pass->block_parallel;

    mfa_kernel_params* params = &pass->params;
    fill_params(problem, params);
    const int64_t rows = kind == MFA_PASS_BACKWARD_KEY_VALUE ? key_rows
                         : pack_group                        ? problem->group * query_rows
                                                             : query_rows;
    const int64_t out_width =
        forward ? problem->head_dim_v
        : kind == MFA_PASS_BACKWARD_QUERY
            ? problem->head_dim
            : (problem->head_dim > problem->head_dim_v ? problem->head_dim : problem->head_dim_v);
    const int64_t out_blocks = (out_width + pass->block_out - 1) / pass->block_out;
    const int64_t row_blocks = (rows + pass->block_parallel - 1) / pass->block_parallel;
    const uint64_t heads =
        (uint64_t)(kind == MFA_PASS_BACKWARD_KEY_VALUE || pack_group ? problem->heads_kv
                                                                     : problem->heads_q);
    uint32_t split_count = 0;
    if (forward) {
        const int64_t key_blocks = (key_rows + pass->block_traversal - 1) / pass->block_traversal;
        split_count =
            choose_splits((uint64_t)(row_blocks * out_blocks) * heads * (uint64_t)problem->batch,
                          key_blocks, problem->initial_state && out_blocks > 1);
        if (split_count > 0) {
            const int64_t per_split =
                key_blocks > 0 ? (key_blocks + split_count - 1) / split_count : 1;
            if (key_blocks > 0) split_count = (uint32_t)((key_blocks + per_split - 1) / per_split);
            params->splits = (int32_t)split_count;
            params->split_keys = (int32_t)(per_split * pass->block_traversal);
        }
        *splits = split_count;
    }
    const int has_sinks = forward && split_count == 0 && mfa_view_present(&problem->sinks);
    const int has_lse = forward ? split_count == 0 && mfa_view_present(&problem->lse) : 1;
    add_variant_constants(pass, problem, has_lse, has_sinks,
                          forward && split_count == 0 && problem->initial_state, split_count > 0);
    if (forward)
        add_constant(pass, MFA_FC_PACK_GROUP, MFA_CONSTANT_TYPE_BOOL, (uint32_t)pack_group);

    params->out_blocks = (int32_t)out_blocks;
    pass->threadgroups[0] = (uint64_t)(row_blocks * out_blocks) * (split_count ? split_count : 1);
    pass->threadgroups[1] = heads;
    pass->threadgroups[2] = (uint64_t)problem->batch;
    if (pass->threadgroups[0] > UINT32_MAX)
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "metal planner: %llu threadgroups along x exceed 2^32-1",
                             (unsigned long long)pass->threadgroups[0]);
    pass->params_index = MFA_BUFFER_PARAMS;

    operand_use uses[MFA_PLAN_MAX_BINDINGS];
    size_t count = 0;
    uses[count++] = (operand_use){MFA_OPERAND_Q, 0};
    uses[count++] = (operand_use){MFA_OPERAND_K, 0};
    uses[count++] = (operand_use){MFA_OPERAND_V, 0};
    if (forward) {
        uses[count++] = (operand_use){MFA_OPERAND_O, 1};
        if (has_lse) uses[count++] = (operand_use){MFA_OPERAND_L, 1};
        if (split_count) {
            uses[count++] = (operand_use){MFA_OPERAND_PARTIAL_O, 1};
            uses[count++] = (operand_use){MFA_OPERAND_PARTIAL_L, 1};
        }
    } else if (kind == MFA_PASS_BACKWARD_QUERY) {
        uses[count++] = (operand_use){MFA_OPERAND_O, 0};
        uses[count++] = (operand_use){MFA_OPERAND_L, 0};
        uses[count++] = (operand_use){MFA_OPERAND_DELTA, 1};
        uses[count++] = (operand_use){MFA_OPERAND_DOUT, 0};
        uses[count++] = (operand_use){MFA_OPERAND_DQ, 1};
    } else {
        uses[count++] = (operand_use){MFA_OPERAND_L, 0};
        uses[count++] = (operand_use){MFA_OPERAND_DELTA, 0};
        uses[count++] = (operand_use){MFA_OPERAND_DOUT, 0};
        uses[count++] = (operand_use){MFA_OPERAND_DV, 1};
        uses[count++] = (operand_use){MFA_OPERAND_DK, 1};
    }
    count = add_modifier_uses(problem, kind, has_sinks, uses, count);
    return bind_operands(problem, pass, uses, count, split_count ? split_count : 1);
}

/* One of the row passes (row_passes.h): MFA_ROW_PASS_THREADS threads per threadgroup. */
static mfa_status plan_row_pass(const mfa_problem* problem, mfa_pass_kind kind, uint32_t splits,
                                const mfa_pass_plan* forward, mfa_pass_plan* pass) {
    memset(pass, 0, sizeof *pass);
    pass->kind = kind;
    pass->kernel_name = kernel_names[kind];
    pass->threads_per_threadgroup = MFA_ROW_PASS_THREADS;
    pass->params_index = MFA_BUFFER_PARAMS;
    const int varlen = problem->layout == MFA_LAYOUT_VARLEN;
    const int64_t query_batch = varlen ? 1 : problem->batch;
    const int64_t query_rows = varlen ? problem->varlen.total_q : problem->seq_q;
    mfa_kernel_params* params = &pass->params;
    fill_params(problem, params);
    operand_use uses[MFA_PLAN_MAX_BINDINGS];
    size_t count = 0;
    if (kind == MFA_PASS_SINK_GRADIENT) {
        add_variant_constants(pass, problem, 1, 1, 0, 0);
        /* One float per simdgroup for the reduction. */
        pass->threadgroup_memory_length = round_up(4 * MFA_ROW_PASS_THREADS / 32, 16);
        pass->threadgroups[0] = (uint64_t)problem->heads_q;
        pass->threadgroups[1] = pass->threadgroups[2] = 1;
        params->batch = (int32_t)query_batch;
        params->rows_per_batch = (int32_t)query_rows;
        uses[count++] = (operand_use){MFA_OPERAND_L, 0};
        uses[count++] = (operand_use){MFA_OPERAND_DELTA, 0};
        uses[count++] = (operand_use){MFA_OPERAND_SINKS, 0};
        uses[count++] = (operand_use){MFA_OPERAND_DSINKS, 1};
    } else if (kind == MFA_PASS_APPEND) {
        add_variant_constants(pass, problem, 0, 0, 0, 0);
        pass->threadgroups[0] = (uint64_t)problem->paged.new_len;
        pass->threadgroups[1] = (uint64_t)problem->heads_kv;
        pass->threadgroups[2] = (uint64_t)problem->batch;
        uses[count++] = (operand_use){MFA_OPERAND_K_NEW, 0};
        uses[count++] = (operand_use){MFA_OPERAND_V_NEW, 0};
        uses[count++] = (operand_use){MFA_OPERAND_K, 1};
        uses[count++] = (operand_use){MFA_OPERAND_V, 1};
        uses[count++] = (operand_use){MFA_OPERAND_BLOCK_TABLE, 0};
        uses[count++] = (operand_use){MFA_OPERAND_CACHE_SEQLENS, 0};
    } else { /* MFA_PASS_COMBINE */
        const int has_lse = mfa_view_present(&problem->lse);
        const int has_sinks = mfa_view_present(&problem->sinks);
        add_variant_constants(pass, problem, has_lse, has_sinks, problem->initial_state, 1);
        pass->threadgroups[0] = (uint64_t)query_rows;
        pass->threadgroups[1] = (uint64_t)problem->heads_q;
        pass->threadgroups[2] = (uint64_t)query_batch;
        params->splits = forward->params.splits;
        params->split_keys = forward->params.split_keys;
        uses[count++] = (operand_use){MFA_OPERAND_PARTIAL_O, 0};
        uses[count++] = (operand_use){MFA_OPERAND_PARTIAL_L, 0};
        if (has_sinks) uses[count++] = (operand_use){MFA_OPERAND_SINKS, 0};
        uses[count++] = (operand_use){MFA_OPERAND_O, 1};
        if (has_lse) uses[count++] = (operand_use){MFA_OPERAND_L, 1};
    }
    if (pass->threadgroups[0] > UINT32_MAX)
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "metal planner: %llu threadgroups along x exceed 2^32-1",
                             (unsigned long long)pass->threadgroups[0]);
    return bind_operands(problem, pass, uses, count, splits ? splits : 1);
}

/* The bytes of every scratch operand of the plan, each counted once. */
static mfa_status total_scratch(mfa_plan* plan) {
    int64_t bytes[MFA_OPERAND_COUNT] = {0};
    for (uint32_t i = 0; i < plan->num_passes; ++i)
        for (uint32_t j = 0; j < plan->passes[i].num_bindings; ++j) {
            const mfa_buffer_binding* binding = &plan->passes[i].bindings[j];
            if (mfa_operand_is_scratch(binding->operand))
                bytes[binding->operand] = binding->byte_length;
        }
    plan->scratch_bytes = 0;
    for (mfa_operand operand = 0; operand < MFA_OPERAND_COUNT; ++operand)
        if (__builtin_add_overflow(plan->scratch_bytes, bytes[operand], &plan->scratch_bytes))
            return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                                 "metal planner: the scratch size does not fit in 64 bits");
    return MFA_OK;
}

/* Every plan starts from a checked problem and an empty plan. */
static mfa_status start_plan(const mfa_problem* problem, mfa_gpu_family family,
                             uint32_t max_threads, mfa_plan* plan) {
    const mfa_status status = check_problem(problem, family, max_threads);
    if (status == MFA_OK) memset(plan, 0, sizeof *plan);
    return status;
}

mfa_status mfa_plan_forward(const mfa_problem* problem, mfa_gpu_family family,
                            uint32_t max_threads_per_threadgroup, mfa_plan* plan) {
    mfa_status status = start_plan(problem, family, max_threads_per_threadgroup, plan);
    if (status != MFA_OK) return status;
    uint32_t n = 0;
    /* New keys go into the caches first, so that the forward reads every key from them. */
    if (problem->layout == MFA_LAYOUT_PAGED && problem->paged.new_len > 0 &&
        (status = plan_row_pass(problem, MFA_PASS_APPEND, 0, NULL, &plan->passes[n++])) != MFA_OK)
        return status;
    mfa_pass_plan* forward = &plan->passes[n++];
    if ((status = plan_tiled_pass(problem, family, max_threads_per_threadgroup, MFA_PASS_FORWARD,
                                  forward, &plan->splits)) != MFA_OK)
        return status;
    if (plan->splits > 0 && (status = plan_row_pass(problem, MFA_PASS_COMBINE, plan->splits,
                                                    forward, &plan->passes[n++])) != MFA_OK)
        return status;
    plan->num_passes = n;
    return total_scratch(plan);
}

mfa_status mfa_plan_backward(const mfa_problem* problem, mfa_gpu_family family,
                             uint32_t max_threads_per_threadgroup, mfa_plan* plan) {
    mfa_status status = start_plan(problem, family, max_threads_per_threadgroup, plan);
    if (status != MFA_OK) return status;
    uint32_t unused = 0;
    if ((status = plan_tiled_pass(problem, family, max_threads_per_threadgroup,
                                  MFA_PASS_BACKWARD_QUERY, &plan->passes[0], &unused)) != MFA_OK ||
        (status = plan_tiled_pass(problem, family, max_threads_per_threadgroup,
                                  MFA_PASS_BACKWARD_KEY_VALUE, &plan->passes[1], &unused)) !=
            MFA_OK)
        return status;
    plan->num_passes = 2;
    /* The sinks' gradient needs every row's delta: after backward-query has written them. */
    if (mfa_view_present(&problem->dsinks)) {
        if ((status = plan_row_pass(problem, MFA_PASS_SINK_GRADIENT, 0, NULL, &plan->passes[2])) !=
            MFA_OK)
            return status;
        plan->num_passes = 3;
    }
    return total_scratch(plan);
}
