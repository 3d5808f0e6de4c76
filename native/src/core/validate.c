/* Every public argument is checked here, before a backend runs, so that a bad call never writes
 * anything. Messages name the argument, the dimension, and expected versus got.
 *
 * Written in C on purpose: callers may pass any integer where the header says enum, and only C
 * gives such values defined behaviour until they are checked. */
#include "core/validate.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char* const dim_names[4] = {"batch", "heads", "seq", "head dim"};

#define ANY_SIZE (-1)

/* What a tensor's shape must be: a size per dimension (or ANY_SIZE) and, for messages, where
 * that size comes from ("q.shape[0]"; NULL for a fixed size). */
typedef struct expected_shape {
    int64_t size[4];
    const char* from[4];
} expected_shape;

/* A checked tensor: its role and the bytes [lo, hi) it may touch, for the overlap checks. */
typedef struct checked_tensor {
    const char* name;
    uintptr_t lo;
    uintptr_t hi;
    bool output;
} checked_tensor;

static bool valid_dtype(int dtype) {
    return dtype == MFA_DTYPE_F32 || dtype == MFA_DTYPE_F16 || dtype == MFA_DTYPE_BF16;
}

static mfa_status overflow_error(const char* name, const mfa_tensor* t) {
    return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                         "%s: element offsets of shape [%lld, %lld, %lld, %lld] with strides "
                         "[%lld, %lld, %lld, %lld] overflow 64 bits",
                         name, (long long)t->shape[0], (long long)t->shape[1],
                         (long long)t->shape[2], (long long)t->shape[3], (long long)t->strides[0],
                         (long long)t->strides[1], (long long)t->strides[2],
                         (long long)t->strides[3]);
}

/* An output must not write any element twice. Sufficient condition (numpy uses the same): in
 * order of |stride|, each stride exceeds the extent spanned by the smaller ones. The extents
 * cannot overflow: the caller has bounded every (shape - 1) * stride and their sum. */
static mfa_status check_no_self_overlap(const char* name, const mfa_tensor* t) {
    /* Only dimensions that are stepped matter; their |stride| fits in int64 because
     * (shape - 1) * stride was bounded by the caller. */
    int order[4], stepped = 0;
    for (int d = 0; d < 4; ++d) {
        if (t->shape[d] > 1) order[stepped++] = d;
    }
    for (int i = 1; i < stepped; ++i) {
        for (int j = i; j > 0 && llabs(t->strides[order[j]]) < llabs(t->strides[order[j - 1]]);
             --j) {
            int swap = order[j];
            order[j] = order[j - 1];
            order[j - 1] = swap;
        }
    }
    int64_t extent = 0;
    for (int i = 0; i < stepped; ++i) {
        const int d = order[i];
        const int64_t stride = llabs(t->strides[d]);
        if (stride <= extent) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s: stride %lld of dim %d (%s) makes elements overlap; an "
                                 "output needs each element at its own address",
                                 name, (long long)t->strides[d], d, dim_names[d]);
        }
        extent += stride * (t->shape[d] - 1);
    }
    return MFA_OK;
}

/* Pointer, dtype, shape (positive, then as expected), then strides: the byte range with every
 * product checked for overflow, alignment, and for outputs no self-overlap. */
static mfa_status check_tensor(const char* name, const mfa_tensor* t, int expected_dtype,
                               const char* dtype_rule, const expected_shape* shape, bool output,
                               checked_tensor* checked) {
    if (t == NULL) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
    if (t->data == NULL) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s.data is NULL", name);
    const int dtype = (int)t->dtype;
    if (!valid_dtype(dtype)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s.dtype = %d is not an mfa_dtype", name,
                             dtype);
    }
    if (dtype != expected_dtype) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s.dtype must be %s (%s), got %s", name,
                             mfa_dtype_name((mfa_dtype)expected_dtype), dtype_rule,
                             mfa_dtype_name((mfa_dtype)dtype));
    }
    /* A dimension of fixed size (lse's last) is not a head dimension: the next loop names its
     * size instead. */
    for (int d = 0; d < 4; ++d) {
        const bool fixed = shape->size[d] != ANY_SIZE && shape->from[d] == NULL;
        if (t->shape[d] < 1 && !fixed) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s.shape[%d] (%s) must be >= 1, got %lld", name, d, dim_names[d],
                                 (long long)t->shape[d]);
        }
    }
    for (int d = 0; d < 4; ++d) {
        if (shape->size[d] != ANY_SIZE && t->shape[d] != shape->size[d]) {
            if (shape->from[d] == NULL) {
                return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                     "%s.shape[%d] must be %lld, got %lld", name, d,
                                     (long long)shape->size[d], (long long)t->shape[d]);
            }
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s.shape[%d] (%s) must equal %s = %lld, got %lld", name, d,
                                 dim_names[d], shape->from[d], (long long)shape->size[d],
                                 (long long)t->shape[d]);
        }
    }

    int64_t count = 1, lo = 0, hi = 0; /* element offsets span [lo, hi] */
    for (int d = 0; d < 4; ++d) {
        int64_t term;
        if (__builtin_mul_overflow(count, t->shape[d], &count) ||
            __builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &term) ||
            (term < 0 ? __builtin_add_overflow(lo, term, &lo)
                      : __builtin_add_overflow(hi, term, &hi))) {
            return overflow_error(name, t);
        }
    }
    const int64_t elem = (int64_t)mfa_dtype_size((mfa_dtype)dtype);
    const uintptr_t base = (uintptr_t)t->data;
    int64_t lo_bytes, end, hi_bytes; /* the bytes touched are [lo_bytes, hi_bytes) */
    if (__builtin_mul_overflow(lo, elem, &lo_bytes) || __builtin_add_overflow(hi, 1, &end) ||
        __builtin_mul_overflow(end, elem, &hi_bytes) || (uintptr_t)0 - (uintptr_t)lo_bytes > base ||
        (uintptr_t)hi_bytes > UINTPTR_MAX - base) {
        return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                             "%s: the byte range of the tensor (element offsets %lld to %lld) "
                             "does not fit in the address space",
                             name, (long long)lo, (long long)hi);
    }
    if (base % (uintptr_t)elem != 0) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "%s.data is not aligned to its element size (%lld bytes)", name,
                             (long long)elem);
    }
    if (output) {
        mfa_status status = check_no_self_overlap(name, t);
        if (status != MFA_OK) return status;
    }
    checked->name = name;
    checked->lo = base + (uintptr_t)lo_bytes;
    checked->hi = base + (uintptr_t)hi_bytes;
    checked->output = output;
    return MFA_OK;
}

/* Outputs must not alias inputs or each other; inputs may alias each other. */
static mfa_status check_no_overlap(const checked_tensor* all, int count) {
    for (int i = 0; i < count; ++i) {
        if (!all[i].output) continue;
        for (int j = 0; j < count; ++j) {
            if (i == j || (all[j].output && j < i)) continue;
            if (all[i].lo < all[j].hi && all[j].lo < all[i].hi) {
                return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                     "%s overlaps %s in memory; outputs must not alias inputs or "
                                     "each other",
                                     all[i].name, all[j].name);
            }
        }
    }
    return MFA_OK;
}

static mfa_status resolve_params(const mfa_attention_params* given, mfa_problem* problem) {
    mfa_attention_params params;
    mfa_attention_params_init(&params);
    if (given != NULL) {
        if (given->struct_size != sizeof(mfa_attention_params)) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "params.struct_size = %zu, expected %zu: initialise params with "
                                 "mfa_attention_params_init() from the mfa.h this library was "
                                 "built with",
                                 given->struct_size, sizeof(mfa_attention_params));
        }
        params = *given;
    }
    const int alignment = (int)params.alignment;
    if (!isfinite(params.scale)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "params.scale must be finite, got %g (0 selects 1/sqrt(D))",
                             (double)params.scale);
    }
    if (params.causal != 0 && params.causal != 1) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "params.causal must be 0 or 1, got %d",
                             (int)params.causal);
    }
    if (alignment != MFA_ALIGN_BOTTOM_RIGHT && alignment != MFA_ALIGN_TOP_LEFT) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "params.alignment = %d is not an mfa_alignment", alignment);
    }
    if (params.window_left < -1 || params.window_right < -1) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "params.window_left and window_right must be >= 0, or -1 for "
                             "unbounded; got (%lld, %lld)",
                             (long long)params.window_left, (long long)params.window_right);
    }
    problem->scale =
        params.scale != 0.0f ? params.scale : (float)(1.0 / sqrt((double)problem->head_dim));
    problem->diag_offset =
        alignment == MFA_ALIGN_BOTTOM_RIGHT ? problem->seq_k - problem->seq_q : 0;
    problem->window_left = params.window_left;
    problem->window_right = params.causal ? 0 : params.window_right;
    return MFA_OK;
}

static mfa_view view_of(const mfa_tensor* t) {
    mfa_view view;
    memset(&view, 0, sizeof view);
    if (t != NULL) {
        view.data = (char*)t->data;
        /* A size-1 dimension is never stepped; stride 0 keeps backends' index arithmetic
         * within the bounds checked above whatever stride the caller gave it. */
        for (int d = 0; d < 4; ++d) view.stride[d] = t->shape[d] == 1 ? 0 : t->strides[d];
    }
    return view;
}

static expected_shape shape_of(int64_t b, const char* b_from, int64_t h, const char* h_from,
                               int64_t s, const char* s_from, int64_t d, const char* d_from) {
    expected_shape shape = {{b, h, s, d}, {b_from, h_from, s_from, d_from}};
    return shape;
}

mfa_status mfa_build_problem(const mfa_capabilities* caps, const char* backend_name,
                             const mfa_attention_params* params, const mfa_call_tensors* tensors,
                             bool backward, mfa_problem* problem) {
    static const char io_rule[] = "q, k, v, out, dout, dq, dk and dv share q's dtype";
    checked_tensor checked[9];
    int n = 0;
    mfa_status status;

    /* q fixes the dtype and the query-side sizes; k and v the key-side ones. */
    const expected_shape any = shape_of(ANY_SIZE, "", ANY_SIZE, "", ANY_SIZE, "", ANY_SIZE, "");
    const int dtype = tensors->q != NULL ? (int)tensors->q->dtype : MFA_DTYPE_F32;
    if ((status = check_tensor("q", tensors->q, dtype, io_rule, &any, false, &checked[n++])))
        return status;
    const mfa_tensor* q = tensors->q;
    if (!(caps->dtypes & (1u << dtype))) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED, "the %s backend does not support dtype %s",
                             backend_name, mfa_dtype_name((mfa_dtype)dtype));
    }
    const int64_t batch = q->shape[0], heads_q = q->shape[1], seq_q = q->shape[2];
    const int64_t head_dim = q->shape[3];
    const expected_shape k_shape =
        shape_of(batch, "q.shape[0]", ANY_SIZE, "", ANY_SIZE, "", head_dim, "q.shape[3]");
    if ((status = check_tensor("k", tensors->k, dtype, io_rule, &k_shape, false, &checked[n++])))
        return status;
    const int64_t heads_kv = tensors->k->shape[1], seq_k = tensors->k->shape[2];
    const expected_shape v_shape =
        shape_of(batch, "q.shape[0]", heads_kv, "k.shape[1]", seq_k, "k.shape[2]", ANY_SIZE, "");
    if ((status = check_tensor("v", tensors->v, dtype, io_rule, &v_shape, false, &checked[n++])))
        return status;
    const int64_t head_dim_v = tensors->v->shape[3];

    if (heads_q % heads_kv != 0) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "q.shape[1] (heads) = %lld must be a multiple of k.shape[1] "
                             "(key/value heads) = %lld",
                             (long long)heads_q, (long long)heads_kv);
    }
    if (head_dim > caps->max_head_dim || head_dim_v > caps->max_head_dim) {
        const bool is_q = head_dim > caps->max_head_dim;
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "%s.shape[3] (head dim) = %lld exceeds the %s backend's maximum of "
                             "%lld",
                             is_q ? "q" : "v", (long long)(is_q ? head_dim : head_dim_v),
                             backend_name, (long long)caps->max_head_dim);
    }

    const expected_shape out_shape = shape_of(batch, "q.shape[0]", heads_q, "q.shape[1]", seq_q,
                                              "q.shape[2]", head_dim_v, "v.shape[3]");
    const expected_shape lse_shape =
        shape_of(batch, "q.shape[0]", heads_q, "q.shape[1]", seq_q, "q.shape[2]", 1, NULL);
    if ((status = check_tensor("out", tensors->out, dtype, io_rule, &out_shape, !backward,
                               &checked[n++])))
        return status;
    if (backward && tensors->lse == NULL) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "lse is NULL; the backward pass needs the forward's log-sum-exp");
    }
    if (tensors->lse != NULL &&
        (status = check_tensor("lse", tensors->lse, MFA_DTYPE_F32, "lse is always f32", &lse_shape,
                               !backward, &checked[n++])))
        return status;
    if (backward) {
        const expected_shape dq_shape = shape_of(batch, "q.shape[0]", heads_q, "q.shape[1]", seq_q,
                                                 "q.shape[2]", head_dim, "q.shape[3]");
        const expected_shape dk_shape = shape_of(batch, "k.shape[0]", heads_kv, "k.shape[1]", seq_k,
                                                 "k.shape[2]", head_dim, "k.shape[3]");
        const expected_shape dv_shape = shape_of(batch, "v.shape[0]", heads_kv, "v.shape[1]", seq_k,
                                                 "v.shape[2]", head_dim_v, "v.shape[3]");
        if ((status = check_tensor("dout", tensors->dout, dtype, io_rule, &out_shape, false,
                                   &checked[n++])) ||
            (status =
                 check_tensor("dq", tensors->dq, dtype, io_rule, &dq_shape, true, &checked[n++])) ||
            (status =
                 check_tensor("dk", tensors->dk, dtype, io_rule, &dk_shape, true, &checked[n++])) ||
            (status =
                 check_tensor("dv", tensors->dv, dtype, io_rule, &dv_shape, true, &checked[n++])))
            return status;
    }
    if ((status = check_no_overlap(checked, n))) return status;

    memset(problem, 0, sizeof *problem);
    problem->dtype = (mfa_dtype)dtype;
    problem->batch = batch;
    problem->heads_q = heads_q;
    problem->heads_kv = heads_kv;
    problem->group = heads_q / heads_kv;
    problem->seq_q = seq_q;
    problem->seq_k = seq_k;
    problem->head_dim = head_dim;
    problem->head_dim_v = head_dim_v;
    if ((status = resolve_params(params, problem))) return status;
    problem->q = view_of(tensors->q);
    problem->k = view_of(tensors->k);
    problem->v = view_of(tensors->v);
    problem->out = view_of(tensors->out);
    problem->lse = view_of(tensors->lse);
    problem->dout = view_of(tensors->dout);
    problem->dq = view_of(tensors->dq);
    problem->dk = view_of(tensors->dk);
    problem->dv = view_of(tensors->dv);
    return MFA_OK;
}
