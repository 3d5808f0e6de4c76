/* The checks every public array goes through, before a backend runs, so that a bad call never
 * writes anything: memory, dtype, shape, strides, overlap. Messages name the argument, the
 * dimension, and expected versus got. problem.c, merge.c and mask_summary.c build their problems
 * on top of these.
 *
 * Written in C on purpose: callers may pass any integer where the header says enum, and only C
 * gives such values defined behaviour until they are checked. */
#include "core/validate.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char* const default_dim_names[4] = {"batch", "heads", "seq", "head dim"};

/* Fields are only ever appended: every field of the first release keeps its offset and size, and
 * no first-release layout ends in padding, so a field appended later starts at or beyond the
 * first release's struct_size and an older caller's struct never covers part of it. */
#define SAME_FIELD(type, first, field)                                                             \
    (offsetof(type, field) == offsetof(first, field) &&                                            \
     sizeof(((type*)0)->field) == sizeof(((first*)0)->field))
/* The first release's layout `first` ends with field `last`, at its struct_size: no padding. */
#define ENDS_AT(first, last, first_size)                                                           \
    ((first_size) == offsetof(first, last) + sizeof(((first*)0)->last))
#define SAME_PARAMS_FIELD(field) SAME_FIELD(mfa_attention_params, mfa_attention_params_0_1_0, field)
_Static_assert(SAME_PARAMS_FIELD(struct_size) && SAME_PARAMS_FIELD(scale) &&
                   SAME_PARAMS_FIELD(causal) && SAME_PARAMS_FIELD(alignment) &&
                   SAME_PARAMS_FIELD(window_left) && SAME_PARAMS_FIELD(window_right),
               "mfa_attention_params must start with the fields of its first release");
_Static_assert(ENDS_AT(mfa_attention_params_0_1_0, window_right, MFA_ATTENTION_PARAMS_FIRST_SIZE),
               "the first mfa_attention_params layout ends in no padding");
#define SAME_OPTIONS_FIELD(field) SAME_FIELD(mfa_context_options, mfa_context_options_0_1_0, field)
_Static_assert(SAME_OPTIONS_FIELD(struct_size) && SAME_OPTIONS_FIELD(num_threads) &&
                   SAME_OPTIONS_FIELD(gpu_family) && SAME_OPTIONS_FIELD(sim_schedule_seed),
               "mfa_context_options must start with the fields of its first release");
_Static_assert(ENDS_AT(mfa_context_options_0_1_0, sim_schedule_seed,
                       MFA_CONTEXT_OPTIONS_FIRST_SIZE),
               "the first mfa_context_options layout ends in no padding");
#define SAME_ARGS_FIELD(field) SAME_FIELD(mfa_attention_args, mfa_attention_args_0_2_0, field)
_Static_assert(SAME_ARGS_FIELD(struct_size) && SAME_ARGS_FIELD(softcap) &&
                   SAME_ARGS_FIELD(initial_state) && SAME_ARGS_FIELD(max_seqlen_q) &&
                   SAME_ARGS_FIELD(max_seqlen_k) && SAME_ARGS_FIELD(q) && SAME_ARGS_FIELD(k) &&
                   SAME_ARGS_FIELD(v) && SAME_ARGS_FIELD(out) && SAME_ARGS_FIELD(lse) &&
                   SAME_ARGS_FIELD(dout) && SAME_ARGS_FIELD(dq) && SAME_ARGS_FIELD(dk) &&
                   SAME_ARGS_FIELD(dv) && SAME_ARGS_FIELD(mask) && SAME_ARGS_FIELD(block_mask) &&
                   SAME_ARGS_FIELD(alibi_slopes) && SAME_ARGS_FIELD(sinks) &&
                   SAME_ARGS_FIELD(dsinks) && SAME_ARGS_FIELD(cu_seqlens_q) &&
                   SAME_ARGS_FIELD(cu_seqlens_k) && SAME_ARGS_FIELD(block_table) &&
                   SAME_ARGS_FIELD(cache_seqlens) && SAME_ARGS_FIELD(k_new) &&
                   SAME_ARGS_FIELD(v_new),
               "mfa_attention_args must start with the fields of its first release");
_Static_assert(ENDS_AT(mfa_attention_args_0_2_0, v_new, MFA_ATTENTION_ARGS_FIRST_SIZE),
               "the first mfa_attention_args layout ends in no padding");
#undef SAME_ARGS_FIELD
#undef SAME_OPTIONS_FIELD
#undef SAME_PARAMS_FIELD
#undef ENDS_AT
#undef SAME_FIELD

mfa_status mfa_read_input_struct(const void* given, void* resolved, size_t first_size,
                                 size_t current_size, const char* first_release, const char* name,
                                 const char* type) {
    size_t size;
    memcpy(&size, given, sizeof size); /* struct_size, the first field of every input struct */
    if (size > current_size) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "%s.struct_size = %zu is larger than this library's %s (%zu bytes, "
                             "libmfa %s): the caller was built against a newer mfa.h",
                             name, size, type, current_size, mfa_version_string());
    }
    if (size < first_size) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "%s.struct_size = %zu is smaller than %s has ever been (%zu bytes in "
                             "libmfa %s): initialise %s with %s_init()",
                             name, size, type, first_size, first_release, name, type);
    }
    memcpy(resolved, given, size);
    memcpy(resolved, &current_size, sizeof current_size);
    return MFA_OK;
}

mfa_array_rule mfa_rule(uint32_t dtypes, const char* dtype_rule, bool output) {
    mfa_array_rule rule;
    memset(&rule, 0, sizeof rule);
    rule.dtypes = dtypes;
    rule.dtype_rule = dtype_rule;
    for (int d = 0; d < 4; ++d) rule.size[d] = MFA_ANY_SIZE;
    rule.output = output;
    return rule;
}

void mfa_rule_size(mfa_array_rule* rule, int d, int64_t size, const char* from, bool or_one) {
    rule->size[d] = size;
    rule->from[d] = from;
    rule->or_one[d] = or_one;
}

void mfa_checks_init(mfa_checks* checks, const mfa_target* target, mfa_checked* storage,
                     int capacity) {
    checks->target = target;
    checks->memory = -1;
    checks->memory_of = NULL;
    checks->count = 0;
    checks->capacity = capacity;
    checks->items = storage;
}

static bool known_dtype(int dtype) { return dtype >= MFA_DTYPE_F32 && dtype <= MFA_DTYPE_I32; }

/* "f32", "f32 or f16", "bool, f32 or f16": the dtypes of a rule, for messages. */
static void dtype_list(uint32_t dtypes, char* text, size_t size) {
    int total = 0, written = 0;
    for (int d = MFA_DTYPE_F32; d <= MFA_DTYPE_I32; ++d) total += (dtypes >> d) & 1;
    text[0] = '\0';
    for (int d = MFA_DTYPE_F32; d <= MFA_DTYPE_I32; ++d) {
        if (!((dtypes >> d) & 1)) continue;
        const size_t used = strlen(text);
        const char* separator = written == 0 ? "" : written == total - 1 ? " or " : ", ";
        snprintf(text + used, size - used, "%s%s", separator, mfa_dtype_name((mfa_dtype)d));
        ++written;
    }
}

static mfa_status overflow_error(const char* name, const mfa_array* t) {
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
static mfa_status check_no_self_overlap(const char* name, const mfa_array* t,
                                        const char* const* dim_names) {
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

/* Which memory an array is in, and that it is the call's. */
static mfa_status check_memory(mfa_checks* checks, const char* name, const mfa_array* t) {
    const mfa_target* target = checks->target;
    if (t->data != NULL && t->buffer != NULL) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "%s.data and %s.buffer are both set; an array is in host memory "
                             "(data) or in a device buffer (buffer)",
                             name, name);
    }
    if (t->data == NULL && t->buffer == NULL) {
        if (target->tensors)
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s.data is NULL", name);
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "%s.data is NULL and so is %s.buffer; give host memory or a device "
                             "buffer",
                             name, name);
    }
    const int memory = t->buffer != NULL ? MFA_MEMORY_DEVICE : MFA_MEMORY_HOST;
    if (memory == MFA_MEMORY_DEVICE &&
        (!(target->caps->features & MFA_FEATURE_DEVICE_BUFFERS) || target->device == NULL ||
         target->device->buffer_length == NULL)) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "%s is in a device buffer: the %s backend takes host memory only "
                             "(it lacks MFA_FEATURE_DEVICE_BUFFERS)",
                             name, target->backend);
    }
    if (checks->memory < 0) {
        checks->memory = memory;
        checks->memory_of = name;
    } else if (memory != checks->memory) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "%s is in %s but %s is in %s; the arrays of one call are all in host "
                             "memory or all in device buffers",
                             name, memory == MFA_MEMORY_DEVICE ? "a device buffer" : "host memory",
                             checks->memory_of,
                             memory == MFA_MEMORY_DEVICE ? "host memory" : "a device buffer");
    }
    return MFA_OK;
}

mfa_status mfa_check_array(mfa_checks* checks, const char* name, const mfa_array* t,
                           const mfa_array_rule* rule, const mfa_checked** out) {
    const char* const* dim_names = rule->dim_names ? rule->dim_names : default_dim_names;
    if (t == NULL) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
    mfa_status status = check_memory(checks, name, t);
    if (status != MFA_OK) return status;
    const int dtype = (int)t->dtype;
    if (!known_dtype(dtype)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s.dtype = %d is not an mfa_dtype", name,
                             dtype);
    }
    if (!((rule->dtypes >> dtype) & 1)) {
        char allowed[64];
        dtype_list(rule->dtypes, allowed, sizeof allowed);
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s.dtype must be %s (%s), got %s", name,
                             allowed, rule->dtype_rule, mfa_dtype_name((mfa_dtype)dtype));
    }
    /* A dimension of fixed size (lse's last) is not a head dimension: the next loop names its
     * size instead. */
    for (int d = 0; d < 4; ++d) {
        const bool fixed = rule->size[d] != MFA_ANY_SIZE && rule->from[d] == NULL;
        if (t->shape[d] < 1 && !fixed) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s.shape[%d] (%s) must be >= 1, got %lld", name, d, dim_names[d],
                                 (long long)t->shape[d]);
        }
    }
    for (int d = 0; d < 4; ++d) {
        const int64_t want = rule->size[d];
        if (want == MFA_ANY_SIZE || t->shape[d] == want || (rule->or_one[d] && t->shape[d] == 1))
            continue;
        const char* or_one = rule->or_one[d] ? " or be 1" : "";
        if (rule->from[d] == NULL) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s.shape[%d] must be %lld%s, got %lld", name, d, (long long)want,
                                 or_one, (long long)t->shape[d]);
        }
        return mfa_set_error(
            MFA_ERROR_INVALID_ARGUMENT, "%s.shape[%d] (%s) must equal %s = %lld%s, got %lld", name,
            d, dim_names[d], rule->from[d], (long long)want, or_one, (long long)t->shape[d]);
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
    /* Backends compute byte offsets from the origin in 64 bits: they must fit there. The
     * positions that add the origin are summed in 128 bits, where they cannot overflow. */
    const int64_t elem = (int64_t)mfa_dtype_size((mfa_dtype)dtype);
    int64_t first_offset, end, end_offset; /* the bytes touched are [first, end) of the origin */
    const bool bytes_overflow = __builtin_mul_overflow(lo, elem, &first_offset) ||
                                __builtin_add_overflow(hi, 1, &end) ||
                                __builtin_mul_overflow(end, elem, &end_offset);
    if (bytes_overflow) {
        return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                             "%s: the byte range of the tensor (element offsets %lld to %lld) "
                             "does not fit in the address space",
                             name, (long long)lo, (long long)hi);
    }
    mfa_checked checked;
    memset(&checked, 0, sizeof checked);
    if (t->buffer == NULL) {
        const __int128 origin = (__int128)(uintptr_t)t->data + t->byte_offset;
        const __int128 first = origin + first_offset, end = origin + end_offset;
        if (first < 0 || end > (__int128)UINTPTR_MAX) {
            return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                                 "%s: the byte range of the tensor (element offsets %lld to %lld) "
                                 "does not fit in the address space",
                                 name, (long long)lo, (long long)hi);
        }
        if (origin % elem != 0) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s.data%s is not aligned to its element size (%lld bytes)", name,
                                 t->byte_offset != 0 ? " + byte_offset" : "", (long long)elem);
        }
        checked.view.data = (char*)(uintptr_t)origin;
        checked.lo = (uintptr_t)first;
        checked.hi = (uintptr_t)end;
    } else {
        const mfa_target* target = checks->target;
        const size_t length = target->device->buffer_length(target->state, t->buffer);
        const __int128 first = (__int128)t->byte_offset + first_offset;
        const __int128 end = (__int128)t->byte_offset + end_offset;
        if (t->byte_offset % elem != 0) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s.byte_offset = %lld is not a multiple of its element size "
                                 "(%lld bytes)",
                                 name, (long long)t->byte_offset, (long long)elem);
        }
        if (first < 0 || end > (__int128)length) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s: the view reaches bytes %lld to %lld of its buffer "
                                 "(byte_offset %lld, element offsets %lld to %lld), outside the "
                                 "buffer's %zu bytes",
                                 name, (long long)first, (long long)(end - 1),
                                 (long long)t->byte_offset, (long long)lo, (long long)hi, length);
        }
        checked.space = t->buffer;
        checked.view.buffer = t->buffer;
        checked.view.byte_offset = t->byte_offset;
        checked.lo = (uintptr_t)first;
        checked.hi = (uintptr_t)end;
    }
    if (rule->output) {
        status = check_no_self_overlap(name, t, dim_names);
        if (status != MFA_OK) return status;
    }
    /* A size-1 dimension is never stepped; stride 0 keeps backends' index arithmetic within the
     * bounds checked above whatever stride the caller gave it, and makes broadcasting uniform. */
    for (int d = 0; d < 4; ++d) checked.view.stride[d] = t->shape[d] == 1 ? 0 : t->strides[d];
    checked.name = name;
    checked.array = t;
    checked.output = rule->output;
    checked.in_place_group = rule->in_place_group;
    if (checks->count >= checks->capacity) {
        return mfa_set_error(MFA_ERROR_INTERNAL, "validation: more arrays than the %d expected",
                             checks->capacity);
    }
    checks->items[checks->count] = checked;
    if (out != NULL) *out = &checks->items[checks->count];
    checks->count++;
    return MFA_OK;
}

bool mfa_same_view(const mfa_checked* a, const mfa_checked* b) {
    if (a->space != b->space || a->view.data != b->view.data ||
        a->view.byte_offset != b->view.byte_offset || a->array->dtype != b->array->dtype)
        return false;
    for (int d = 0; d < 4; ++d)
        if (a->array->shape[d] != b->array->shape[d] || a->view.stride[d] != b->view.stride[d])
            return false;
    return true;
}

/* Outputs must not alias inputs or each other; inputs may alias each other. Arrays of one
 * in-place group may be exactly the same view (merge's out and one part's out). */
mfa_status mfa_check_no_overlap(const mfa_checks* checks) {
    const mfa_checked* all = checks->items;
    for (int i = 0; i < checks->count; ++i) {
        if (!all[i].output) continue;
        for (int j = 0; j < checks->count; ++j) {
            if (i == j || (all[j].output && j < i) || all[i].space != all[j].space) continue;
            if (all[i].in_place_group != 0 && all[i].in_place_group == all[j].in_place_group &&
                mfa_same_view(&all[i], &all[j]))
                continue;
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

mfa_status mfa_host_origin(const mfa_checks* checks, const mfa_checked* array,
                           const char** origin) {
    if (array->view.buffer == NULL) {
        *origin = array->view.data;
        return MFA_OK;
    }
    const mfa_target* target = checks->target;
    char* contents = target->device->buffer_contents
                         ? (char*)target->device->buffer_contents(target->state, array->view.buffer)
                         : NULL;
    if (contents == NULL) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "%s is in a buffer whose contents the CPU cannot read; libmfa reads "
                             "it while validating, so it must be in shared memory",
                             array->name);
    }
    *origin = contents + array->view.byte_offset;
    return MFA_OK;
}
