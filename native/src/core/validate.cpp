// Every public argument is checked here, before a backend runs, so that a bad call never
// writes anything. Messages name the argument, the dimension, and expected versus got.
#include "core/validate.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mfa {
namespace {

const char* const kDimNames[4] = {"batch", "heads", "seq", "head dim"};

bool mul_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool add_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

bool valid_dtype(mfa_dtype dtype) {
    return dtype == MFA_DTYPE_F32 || dtype == MFA_DTYPE_F16 || dtype == MFA_DTYPE_BF16;
}

// Memory a tensor may touch: bytes [lo, hi) relative to address 0.
struct ByteRange {
    uintptr_t lo;
    uintptr_t hi;
};

// A checked tensor: its role name and byte range, for the overlap checks.
struct Checked {
    const char* name;
    const mfa_tensor* tensor;
    ByteRange range;
    bool output;
};

mfa_status check_shape_against(const char* name, const mfa_tensor& t, int dim, int64_t expected,
                               const char* expected_from) {
    if (t.shape[dim] == expected) return MFA_OK;
    return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                         "%s.shape[%d] (%s) must equal %s = %lld, got %lld", name, dim,
                         kDimNames[dim], expected_from, (long long)expected,
                         (long long)t.shape[dim]);
}

// Checks pointer, dtype, positive shape and strides of one tensor; computes its byte range
// with every product checked for overflow.
mfa_status check_tensor(const char* name, const mfa_tensor* t, mfa_dtype expected_dtype,
                        const char* dtype_rule, bool output, Checked* checked) {
    if (t == nullptr) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
    }
    if (t->data == nullptr) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s.data is NULL", name);
    }
    if (!valid_dtype(t->dtype)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s.dtype = %d is not an mfa_dtype",
                             name, (int)t->dtype);
    }
    if (t->dtype != expected_dtype) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s.dtype must be %s (%s), got %s",
                             name, mfa_dtype_name(expected_dtype), dtype_rule,
                             mfa_dtype_name(t->dtype));
    }
    for (int d = 0; d < 4; ++d) {
        if (t->shape[d] < 1) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s.shape[%d] (%s) must be >= 1, got %lld", name, d, kDimNames[d],
                                 (long long)t->shape[d]);
        }
    }

    // Element offsets span [lo, hi]; each term (shape - 1) * stride is checked.
    int64_t count = 1;
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < 4; ++d) {
        int64_t term;
        if (mul_overflows(count, t->shape[d], &count) ||
            mul_overflows(t->shape[d] - 1, t->strides[d], &term) ||
            add_overflows(term < 0 ? lo : hi, term, term < 0 ? &lo : &hi)) {
            return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                                 "%s: element offsets of shape [%lld, %lld, %lld, %lld] with "
                                 "strides [%lld, %lld, %lld, %lld] overflow 64 bits",
                                 name, (long long)t->shape[0], (long long)t->shape[1],
                                 (long long)t->shape[2], (long long)t->shape[3],
                                 (long long)t->strides[0], (long long)t->strides[1],
                                 (long long)t->strides[2], (long long)t->strides[3]);
        }
    }
    const int64_t elem = (int64_t)mfa_dtype_size(t->dtype);
    int64_t lo_bytes, hi_bytes;
    const uintptr_t base = (uintptr_t)t->data;
    if (mul_overflows(lo, elem, &lo_bytes) || mul_overflows(hi + 1, elem, &hi_bytes) ||
        (uintptr_t)0 - (uintptr_t)lo_bytes > base || (uintptr_t)hi_bytes > UINTPTR_MAX - base) {
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
        // An output must not write any element twice. Sufficient condition (as numpy uses):
        // ordered by |stride|, each stride exceeds the extent spanned by the smaller ones.
        int order[4] = {0, 1, 2, 3};
        std::sort(order, order + 4, [&](int a, int b) {
            return std::llabs(t->strides[a]) < std::llabs(t->strides[b]);
        });
        int64_t extent = 0;  // largest offset reachable by the dims seen so far
        for (int i = 0; i < 4; ++i) {
            const int d = order[i];
            if (t->shape[d] == 1) continue;
            const int64_t stride = std::llabs(t->strides[d]);
            if (stride <= extent) {
                return mfa_set_error(
                    MFA_ERROR_INVALID_ARGUMENT,
                    "%s: stride %lld of dim %d (%s) makes elements overlap; an output needs "
                    "each element at its own address",
                    name, (long long)t->strides[d], d, kDimNames[d]);
            }
            extent += stride * (t->shape[d] - 1);  // cannot overflow: checked above
        }
    }

    checked->name = name;
    checked->tensor = t;
    checked->range = ByteRange{base + (uintptr_t)lo_bytes, base + (uintptr_t)hi_bytes};
    checked->output = output;
    return MFA_OK;
}

mfa_status check_no_overlap(const Checked* all, int count) {
    for (int i = 0; i < count; ++i) {
        if (!all[i].output) continue;
        for (int j = 0; j < count; ++j) {
            if (i == j || (all[j].output && j < i)) continue;
            const ByteRange a = all[i].range, b = all[j].range;
            if (a.lo < b.hi && b.lo < a.hi) {
                return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                     "%s overlaps %s in memory; outputs must not alias inputs "
                                     "or each other",
                                     all[i].name, all[j].name);
            }
        }
    }
    return MFA_OK;
}

mfa_status resolve_params(const mfa_attention_params* given, int64_t head_dim,
                          mfa_problem* problem) {
    mfa_attention_params params;
    mfa_attention_params_init(&params);
    if (given != nullptr) {
        if (given->struct_size != sizeof(mfa_attention_params)) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "params.struct_size = %zu, expected %zu: initialise params with "
                                 "mfa_attention_params_init() from the mfa.h this library was "
                                 "built with",
                                 given->struct_size, sizeof(mfa_attention_params));
        }
        params = *given;
    }
    if (!std::isfinite(params.scale)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "params.scale must be finite, got %g (0 selects 1/sqrt(D))",
                             (double)params.scale);
    }
    if (params.causal != 0 && params.causal != 1) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "params.causal must be 0 or 1, got %d",
                             (int)params.causal);
    }
    if (params.alignment != MFA_ALIGN_BOTTOM_RIGHT && params.alignment != MFA_ALIGN_TOP_LEFT) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "params.alignment = %d is not an mfa_alignment",
                             (int)params.alignment);
    }
    if (params.window_left < -1 || params.window_right < -1) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "params.window_left and window_right must be >= 0, or -1 for "
                             "unbounded; got (%lld, %lld)",
                             (long long)params.window_left, (long long)params.window_right);
    }
    problem->scale = params.scale != 0.0f ? params.scale : (float)(1.0 / std::sqrt((double)head_dim));
    problem->diag_offset =
        params.alignment == MFA_ALIGN_BOTTOM_RIGHT ? problem->seq_k - problem->seq_q : 0;
    problem->window_left = params.window_left;
    problem->window_right = params.causal ? 0 : params.window_right;
    return MFA_OK;
}

mfa_view view_of(const mfa_tensor* t) {
    mfa_view view;
    view.data = t ? static_cast<char*>(t->data) : nullptr;
    for (int d = 0; d < 4; ++d) view.stride[d] = t ? t->strides[d] : 0;
    return view;
}

}  // namespace

mfa_status build_problem(const mfa_capabilities& caps, const char* backend_name,
                         const mfa_attention_params* params, const CallTensors& tensors,
                         bool backward, mfa_problem* problem) {
    const char* const io_rule = "q, k, v, out, dout, dq, dk and dv share q's dtype";
    Checked checked[9];
    int n = 0;
    mfa_status status;

    // q first: it fixes the dtype and the query-side dimensions.
    if ((status = check_tensor("q", tensors.q, tensors.q ? tensors.q->dtype : MFA_DTYPE_F32,
                               io_rule, false, &checked[n++])))
        return status;
    const mfa_tensor& q = *tensors.q;
    const mfa_dtype dtype = q.dtype;
    if (!(caps.dtypes & (1u << dtype))) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED, "the %s backend does not support dtype %s",
                             backend_name, mfa_dtype_name(dtype));
    }
    if ((status = check_tensor("k", tensors.k, dtype, io_rule, false, &checked[n++])))
        return status;
    if ((status = check_tensor("v", tensors.v, dtype, io_rule, false, &checked[n++])))
        return status;
    const mfa_tensor& k = *tensors.k;
    const mfa_tensor& v = *tensors.v;

    if ((status = check_shape_against("k", k, 0, q.shape[0], "q.shape[0]")) ||
        (status = check_shape_against("k", k, 3, q.shape[3], "q.shape[3]")) ||
        (status = check_shape_against("v", v, 0, q.shape[0], "q.shape[0]")) ||
        (status = check_shape_against("v", v, 1, k.shape[1], "k.shape[1]")) ||
        (status = check_shape_against("v", v, 2, k.shape[2], "k.shape[2]")))
        return status;
    if (q.shape[1] % k.shape[1] != 0) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "q.shape[1] (heads) = %lld must be a multiple of k.shape[1] "
                             "(key/value heads) = %lld",
                             (long long)q.shape[1], (long long)k.shape[1]);
    }
    if (q.shape[3] > caps.max_head_dim || v.shape[3] > caps.max_head_dim) {
        const bool is_q = q.shape[3] > caps.max_head_dim;
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "%s.shape[3] (head dim) = %lld exceeds the %s backend's maximum "
                             "of %lld",
                             is_q ? "q" : "v", (long long)(is_q ? q.shape[3] : v.shape[3]),
                             backend_name, (long long)caps.max_head_dim);
    }

    // out and dout: [B, Hq, Nq, Dv]; lse: [B, Hq, Nq, 1].
    const int64_t out_shape[4] = {q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
    const char* const out_from[4] = {"q.shape[0]", "q.shape[1]", "q.shape[2]", "v.shape[3]"};
    auto check_like = [&](const char* name, const mfa_tensor* t, const mfa_tensor& like,
                          const char* like_name, bool output) -> mfa_status {
        mfa_status s = check_tensor(name, t, dtype, io_rule, output, &checked[n++]);
        if (s) return s;
        char from[32];
        for (int d = 0; d < 4; ++d) {
            std::snprintf(from, sizeof from, "%s.shape[%d]", like_name, d);
            if ((s = check_shape_against(name, *t, d, like.shape[d], from))) return s;
        }
        return MFA_OK;
    };
    auto check_out_shaped = [&](const char* name, const mfa_tensor* t, bool output) {
        mfa_status s = check_tensor(name, t, dtype, io_rule, output, &checked[n++]);
        if (s) return s;
        for (int d = 0; d < 4; ++d) {
            if ((s = check_shape_against(name, *t, d, out_shape[d], out_from[d]))) return s;
        }
        return MFA_OK;
    };

    if ((status = check_out_shaped("out", tensors.out, !backward))) return status;
    if (backward && tensors.lse == nullptr) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "lse is NULL; the backward pass needs the forward's log-sum-exp");
    }
    if (tensors.lse != nullptr) {
        if ((status = check_tensor("lse", tensors.lse, MFA_DTYPE_F32, "lse is always f32",
                                   !backward, &checked[n++])))
            return status;
        for (int d = 0; d < 3; ++d) {
            if ((status = check_shape_against("lse", *tensors.lse, d, out_shape[d], out_from[d])))
                return status;
        }
        if ((status = check_shape_against("lse", *tensors.lse, 3, 1, "1"))) return status;
    }
    if (backward) {
        if ((status = check_out_shaped("dout", tensors.dout, false)) ||
            (status = check_like("dq", tensors.dq, q, "q", true)) ||
            (status = check_like("dk", tensors.dk, k, "k", true)) ||
            (status = check_like("dv", tensors.dv, v, "v", true)))
            return status;
    }
    if ((status = check_no_overlap(checked, n))) return status;

    std::memset(problem, 0, sizeof *problem);
    problem->dtype = dtype;
    problem->batch = q.shape[0];
    problem->heads_q = q.shape[1];
    problem->heads_kv = k.shape[1];
    problem->group = q.shape[1] / k.shape[1];
    problem->seq_q = q.shape[2];
    problem->seq_k = k.shape[2];
    problem->head_dim = q.shape[3];
    problem->head_dim_v = v.shape[3];
    if ((status = resolve_params(params, problem->head_dim, problem))) return status;
    problem->q = view_of(tensors.q);
    problem->k = view_of(tensors.k);
    problem->v = view_of(tensors.v);
    problem->out = view_of(tensors.out);
    problem->lse = view_of(tensors.lse);
    problem->dout = view_of(tensors.dout);
    problem->dq = view_of(tensors.dq);
    problem->dk = view_of(tensors.dk);
    problem->dv = view_of(tensors.dv);
    return MFA_OK;
}

}  // namespace mfa
