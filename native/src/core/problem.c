/* An attention call's arguments into one checked mfa_problem (backend.h): the dense operands,
 * then the layout (packed sequences or a paged KV cache, whose integer arrays are read and
 * checked on the host), then the score modifiers, then overlap, then the features the call uses
 * against the backend's capabilities for its direction. Every check comes before anything is
 * written, and INVALID_ARGUMENT before UNSUPPORTED: a bad argument is named as such on every
 * backend, whether or not the backend implements the feature. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/validate.h"

#define FLOAT_DTYPES    (1u << MFA_DTYPE_F32 | 1u << MFA_DTYPE_F16 | 1u << MFA_DTYPE_BF16)
#define F32_ONLY        (1u << MFA_DTYPE_F32)
#define I32_ONLY        (1u << MFA_DTYPE_I32)
#define MAX_ARRAYS      24
#define MAX_BLOCK_SIZE  256
#define MAX_SEQUENCE_32 INT32_MAX /* longest sequence of a packed or paged problem */

static const char* const mask_dims[4] = {"batch", "heads", "query", "key"};
static const char* const offsets_dims[4] = {"-", "-", "-", "offsets"};
static const char* const table_dims[4] = {"batch", "-", "-", "blocks"};
static const char* const cache_dims[4] = {"blocks", "heads", "block size", "head dim"};
static const char* const io_rule = "q, k, v, out, dout, dq, dk and dv share q's dtype";

/* The feature bits of 0.2 a call can use, and how messages name them. */
static const struct {
    uint32_t bit;
    const char* what;
} feature_names[] = {
    {MFA_FEATURE_MASK, "masks (args.mask; MFA_FEATURE_MASK)"},
    {MFA_FEATURE_BLOCK_MASK, "block masks (args.block_mask; MFA_FEATURE_BLOCK_MASK)"},
    {MFA_FEATURE_SOFTCAP, "softcap (args.softcap; MFA_FEATURE_SOFTCAP)"},
    {MFA_FEATURE_ALIBI, "ALiBi (args.alibi_slopes; MFA_FEATURE_ALIBI)"},
    {MFA_FEATURE_SINKS, "attention sinks (args.sinks; MFA_FEATURE_SINKS)"},
    {MFA_FEATURE_VARLEN, "packed sequences (args.cu_seqlens_q, _k; MFA_FEATURE_VARLEN)"},
    {MFA_FEATURE_PAGED_KV, "paged KV caches (args.block_table; MFA_FEATURE_PAGED_KV)"},
    {MFA_FEATURE_INITIAL_STATE, "an initial state (args.initial_state; MFA_FEATURE_INITIAL_STATE)"},
};

static mfa_status invalid(const char* message) {
    return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s", message);
}

static int32_t read_i32(const char* origin, const mfa_view* view, int64_t b, int64_t e) {
    int32_t value;
    memcpy(&value, origin + 4 * (b * view->stride[0] + e * view->stride[3]), sizeof value);
    return value;
}

/* The causal/window options, resolved into problem (scale needs head_dim set). */
static mfa_status resolve_params(const mfa_attention_params* given, mfa_problem* problem) {
    mfa_attention_params params;
    mfa_attention_params_init(&params);
    if (given != NULL) {
        mfa_status status =
            mfa_read_input_struct(given, &params, MFA_ATTENTION_PARAMS_FIRST_SIZE, sizeof params,
                                  "0.1.0", "params", "mfa_attention_params");
        if (status != MFA_OK) return status;
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
    problem->alignment = (mfa_alignment)alignment;
    problem->window_left = params.window_left;
    problem->window_right = params.causal ? 0 : params.window_right;
    return MFA_OK;
}

typedef struct named_array {
    const mfa_array* array;
    const char* name;
} named_array;

/* The name of the first of `count` arrays that is given (not NULL), or NULL. */
static const char* first_given(const named_array* arrays, size_t count) {
    for (size_t i = 0; i < count; ++i)
        if (arrays[i].array != NULL) return arrays[i].name;
    return NULL;
}

/* Arrays a direction does not take must be NULL: a call never ignores an argument. */
static mfa_status check_direction(const mfa_attention_args* args, bool backward) {
    if (!backward) {
        const named_array backward_only[] = {{args->dout, "dout"},
                                             {args->dq, "dq"},
                                             {args->dk, "dk"},
                                             {args->dv, "dv"},
                                             {args->dsinks, "args.dsinks"}};
        const char* given =
            first_given(backward_only, sizeof backward_only / sizeof *backward_only);
        if (given != NULL) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s is given to a forward call; dout, dq, dk, dv and "
                                 "args.dsinks belong to MFA_BACKWARD",
                                 given);
        }
        return MFA_OK;
    }
    if (args->initial_state != 0) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "args.initial_state = %d is given to a backward call; an initial "
                             "state is for MFA_FORWARD only",
                             (int)args->initial_state);
    }
    const named_array forward_only[] = {{args->block_table, "args.block_table"},
                                        {args->cache_seqlens, "args.cache_seqlens"},
                                        {args->k_new, "args.k_new"},
                                        {args->v_new, "args.v_new"}};
    const char* given = first_given(forward_only, sizeof forward_only / sizeof *forward_only);
    if (given != NULL) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "%s is given to a backward call; paged KV caches are for "
                             "MFA_FORWARD only",
                             given);
    }
    return MFA_OK;
}

/* Which layout the arguments ask for, with every array it needs. */
static mfa_status choose_layout(const mfa_attention_args* args, mfa_layout* layout) {
    const bool varlen = args->cu_seqlens_q || args->cu_seqlens_k || args->max_seqlen_q != 0 ||
                        args->max_seqlen_k != 0;
    const bool paged = args->block_table || args->cache_seqlens || args->k_new || args->v_new;
    *layout = MFA_LAYOUT_DENSE;
    if (varlen && paged) {
        return invalid("args.cu_seqlens_q / _k and a paged KV cache (args.block_table) are given "
                       "together; a paged call takes dense q [B, Hq, Nq, D]");
    }
    if (varlen) {
        if (args->cu_seqlens_q == NULL || args->cu_seqlens_k == NULL) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s is NULL; packed sequences need args.cu_seqlens_q, "
                                 "args.cu_seqlens_k, args.max_seqlen_q and args.max_seqlen_k",
                                 args->cu_seqlens_q ? "args.cu_seqlens_k" : "args.cu_seqlens_q");
        }
        const int64_t most = MAX_SEQUENCE_32;
        if (args->max_seqlen_q < 1 || args->max_seqlen_k < 1 || args->max_seqlen_q > most ||
            args->max_seqlen_k > most) {
            const bool is_q = args->max_seqlen_q < 1 || args->max_seqlen_q > most;
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "args.%s must be in [1, 2^31 - 1] with packed sequences (a bound "
                                 "on every sequence's length), got %lld",
                                 is_q ? "max_seqlen_q" : "max_seqlen_k",
                                 (long long)(is_q ? args->max_seqlen_q : args->max_seqlen_k));
        }
        *layout = MFA_LAYOUT_VARLEN;
    } else if (paged) {
        if (args->block_table == NULL || args->cache_seqlens == NULL) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s is NULL; a paged KV cache needs args.block_table and "
                                 "args.cache_seqlens",
                                 args->block_table ? "args.cache_seqlens" : "args.block_table");
        }
        if ((args->k_new == NULL) != (args->v_new == NULL)) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s is NULL while %s is given; new keys and values come together",
                                 args->k_new ? "args.v_new" : "args.k_new",
                                 args->k_new ? "args.k_new" : "args.v_new");
        }
        *layout = MFA_LAYOUT_PAGED;
    }
    return MFA_OK;
}

/* The rule of an int32 array [rows, 1, 1, n] (sequence offsets, block tables, cache lengths):
 * rows from `from` (NULL: a fixed number). */
static mfa_array_rule int32_rows_rule(const char* dtype_rule, const char* const* dim_names,
                                      int64_t rows, const char* from) {
    mfa_array_rule rule = mfa_rule(I32_ONLY, dtype_rule, false);
    rule.dim_names = dim_names;
    mfa_rule_size(&rule, 0, rows, from, false);
    mfa_rule_size(&rule, 1, 1, NULL, false);
    mfa_rule_size(&rule, 2, 1, NULL, false);
    return rule;
}

/* The offsets of packed sequences: shapes, then every value (on the host). */
static mfa_status check_varlen(mfa_checks* checks, const mfa_attention_args* args, int64_t total_q,
                               int64_t total_k, mfa_problem* problem) {
    mfa_array_rule rule = int32_rows_rule("sequence offsets are int32", offsets_dims, 1, NULL);
    const mfa_checked *cu_q, *cu_k;
    mfa_status status =
        mfa_check_array(checks, "args.cu_seqlens_q", args->cu_seqlens_q, &rule, &cu_q);
    if (status != MFA_OK) return status;
    const int64_t entries = args->cu_seqlens_q->shape[3];
    if (entries < 2) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "args.cu_seqlens_q.shape[3] (offsets) must be >= 2 (B + 1 offsets "
                             "of B >= 1 sequences), got %lld",
                             (long long)entries);
    }
    mfa_rule_size(&rule, 3, entries, "args.cu_seqlens_q.shape[3]", false);
    status = mfa_check_array(checks, "args.cu_seqlens_k", args->cu_seqlens_k, &rule, &cu_k);
    if (status != MFA_OK) return status;

    const struct {
        const mfa_checked* array;
        const char* name;
        int64_t total, max;
        const char *total_from, *max_name, *what;
        int64_t* longest;
    } sides[2] = {{cu_q, "args.cu_seqlens_q", total_q, args->max_seqlen_q, "q.shape[2]",
                   "args.max_seqlen_q", "queries", &problem->varlen.longest_q},
                  {cu_k, "args.cu_seqlens_k", total_k, args->max_seqlen_k, "k.shape[2]",
                   "args.max_seqlen_k", "keys", &problem->varlen.longest_k}};
    for (int side = 0; side < 2; ++side) {
        const char* origin;
        if ((status = mfa_host_origin(checks, sides[side].array, &origin))) return status;
        const mfa_view* view = &sides[side].array->view;
        const char* name = sides[side].name;
        /* The ends first: a broadcast (stride 0) array fails here without a walk. */
        const int32_t first = read_i32(origin, view, 0, 0);
        const int32_t last = read_i32(origin, view, 0, entries - 1);
        if (first != 0)
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s[0] must be 0, got %d", name,
                                 (int)first);
        if (last != sides[side].total) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "%s[%lld] = %d must equal the packed length %s = %lld", name,
                                 (long long)(entries - 1), (int)last, sides[side].total_from,
                                 (long long)sides[side].total);
        }
        int64_t longest = 0;
        int32_t previous = first;
        for (int64_t e = 1; e < entries; ++e) {
            const int32_t next = read_i32(origin, view, 0, e);
            if (next < previous) {
                return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                     "%s decreases at entry %lld: %d after %d; offsets never "
                                     "decrease",
                                     name, (long long)e, (int)next, (int)previous);
            }
            const int64_t length = (int64_t)next - previous;
            if (length > sides[side].max) {
                return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                     "%s: sequence %lld has %lld %s, more than %s = %lld", name,
                                     (long long)(e - 1), (long long)length, sides[side].what,
                                     sides[side].max_name, (long long)sides[side].max);
            }
            if (length > longest) longest = length;
            previous = next;
        }
        *sides[side].longest = longest;
    }
    problem->batch = entries - 1;
    problem->varlen.cu_seqlens_q = cu_q->view;
    problem->varlen.cu_seqlens_k = cu_k->view;
    problem->varlen.total_q = total_q;
    problem->varlen.total_k = total_k;
    return MFA_OK;
}

/* One block written by appended keys: physical block, and the (sequence, position) writing it. */
typedef struct written_block {
    int64_t block, sequence, position;
} written_block;

static int compare_written(const void* a, const void* b) {
    const written_block *x = (const written_block*)a, *y = (const written_block*)b;
    if (x->block != y->block) return x->block < y->block ? -1 : 1;
    if (x->sequence != y->sequence) return x->sequence < y->sequence ? -1 : 1;
    return (x->position > y->position) - (x->position < y->position);
}

/* The block table, lengths and new rows of a paged cache: shapes, then every value in use. */
static mfa_status check_paged(mfa_checks* checks, const mfa_attention_args* args, mfa_dtype dtype,
                              mfa_problem* problem) {
    const int64_t batch = args->q->shape[0], num_blocks = args->k->shape[0];
    const int64_t block_size = args->k->shape[2];
    mfa_paged* paged = &problem->paged;
    mfa_array_rule rule =
        int32_rows_rule("block tables are int32", table_dims, batch, "q.shape[0]");
    const mfa_checked *table, *lengths;
    mfa_status status =
        mfa_check_array(checks, "args.block_table", args->block_table, &rule, &table);
    if (status != MFA_OK) return status;
    rule.dtype_rule = "cache lengths are int32";
    mfa_rule_size(&rule, 3, 1, NULL, false);
    status = mfa_check_array(checks, "args.cache_seqlens", args->cache_seqlens, &rule, &lengths);
    if (status != MFA_OK) return status;
    const int64_t max_blocks = args->block_table->shape[3];
    int64_t capacity;
    if (__builtin_mul_overflow(max_blocks, block_size, &capacity)) {
        return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                             "args.block_table.shape[3] (blocks) = %lld times the block size %lld "
                             "overflows 64 bits",
                             (long long)max_blocks, (long long)block_size);
    }
    int64_t new_len = 0;
    if (args->k_new != NULL) {
        mfa_array_rule k_rule = mfa_rule(1u << dtype, io_rule, false);
        mfa_rule_size(&k_rule, 0, batch, "q.shape[0]", false);
        mfa_rule_size(&k_rule, 1, args->k->shape[1], "k.shape[1]", false);
        mfa_rule_size(&k_rule, 3, args->q->shape[3], "q.shape[3]", false);
        const mfa_checked *k_new, *v_new;
        if ((status = mfa_check_array(checks, "args.k_new", args->k_new, &k_rule, &k_new)))
            return status;
        new_len = args->k_new->shape[2];
        mfa_array_rule v_rule = mfa_rule(1u << dtype, io_rule, false);
        mfa_rule_size(&v_rule, 0, batch, "q.shape[0]", false);
        mfa_rule_size(&v_rule, 1, args->k->shape[1], "k.shape[1]", false);
        mfa_rule_size(&v_rule, 2, new_len, "args.k_new.shape[2]", false);
        mfa_rule_size(&v_rule, 3, args->v->shape[3], "v.shape[3]", false);
        if ((status = mfa_check_array(checks, "args.v_new", args->v_new, &v_rule, &v_new)))
            return status;
        paged->k_new = k_new->view;
        paged->v_new = v_new->view;
    }

    const char *table_origin, *lengths_origin;
    if ((status = mfa_host_origin(checks, table, &table_origin)) ||
        (status = mfa_host_origin(checks, lengths, &lengths_origin)))
        return status;
    /* Each sequence's length and every block it reaches; the written blocks collected. */
    size_t written_count = 0, written_capacity = 0;
    written_block* written = NULL;
    int64_t longest = 0;
    for (int64_t b = 0; b < batch && status == MFA_OK; ++b) {
        const int32_t cached = read_i32(lengths_origin, &lengths->view, b, 0);
        int64_t keys;
        if (cached < 0) {
            status = mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                   "args.cache_seqlens[%lld] = %d must be >= 0", (long long)b,
                                   (int)cached);
            break;
        }
        if (__builtin_add_overflow((int64_t)cached, new_len, &keys) || keys > capacity ||
            keys > MAX_SEQUENCE_32) {
            status =
                mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                              "args.cache_seqlens[%lld] = %d plus %lld new keys exceeds the "
                              "capacity of a sequence, args.block_table.shape[3] * "
                              "block_size = %lld * %lld = %lld (and at most 2^31 - 1)",
                              (long long)b, (int)cached, (long long)new_len, (long long)max_blocks,
                              (long long)block_size, (long long)capacity);
            break;
        }
        if (keys > longest) longest = keys;
        const int64_t reached = (keys + block_size - 1) / block_size;
        for (int64_t i = 0; i < reached; ++i) {
            const int32_t block = read_i32(table_origin, &table->view, b, i);
            if (block < 0 || block >= num_blocks) {
                status =
                    mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                  "args.block_table[%lld, %lld] = %d is not a block of the "
                                  "cache: k.shape[0] = %lld blocks",
                                  (long long)b, (long long)i, (int)block, (long long)num_blocks);
                break;
            }
            const bool writes = new_len > 0 && (i + 1) * block_size > cached;
            if (!writes) continue;
            if (written_count == written_capacity) {
                const size_t grown = written_capacity ? 2 * written_capacity : 64;
                written_block* more = (written_block*)realloc(written, grown * sizeof *written);
                if (more == NULL) {
                    status = mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                                           "cannot allocate the list of cache blocks that "
                                           "args.k_new writes");
                    break;
                }
                written = more;
                written_capacity = grown;
            }
            written[written_count++] = (written_block){block, b, i};
        }
    }
    /* A block receiving new rows is reached by its writer alone: no row is written twice, and
     * no sequence reads a block that another one writes during the call. */
    if (status == MFA_OK && written_count > 0) {
        qsort(written, written_count, sizeof *written, compare_written);
        for (size_t w = 1; w < written_count && status == MFA_OK; ++w) {
            if (written[w].block == written[w - 1].block) {
                status =
                    mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                  "args.block_table: block %lld receives new keys at "
                                  "[%lld, %lld] and at [%lld, %lld]; a written block must "
                                  "belong to one (sequence, position)",
                                  (long long)written[w].block, (long long)written[w - 1].sequence,
                                  (long long)written[w - 1].position,
                                  (long long)written[w].sequence, (long long)written[w].position);
            }
        }
        for (int64_t b = 0; b < batch && status == MFA_OK; ++b) {
            const int64_t keys = (int64_t)read_i32(lengths_origin, &lengths->view, b, 0) + new_len;
            const int64_t reached = (keys + block_size - 1) / block_size;
            for (int64_t i = 0; i < reached; ++i) {
                const written_block key = {read_i32(table_origin, &table->view, b, i), 0, 0};
                size_t lo = 0, hi = written_count; /* first entry with block >= key.block */
                while (lo < hi) {
                    const size_t mid = lo + (hi - lo) / 2;
                    if (written[mid].block < key.block)
                        lo = mid + 1;
                    else
                        hi = mid;
                }
                if (lo < written_count && written[lo].block == key.block &&
                    (written[lo].sequence != b || written[lo].position != i)) {
                    status = mfa_set_error(
                        MFA_ERROR_INVALID_ARGUMENT,
                        "args.block_table[%lld, %lld] = %lld is a block that args.k_new writes "
                        "at [%lld, %lld]; a written block must not be reached elsewhere",
                        (long long)b, (long long)i, (long long)key.block,
                        (long long)written[lo].sequence, (long long)written[lo].position);
                    break;
                }
            }
        }
    }
    free(written);
    if (status != MFA_OK) return status;
    paged->block_size = block_size;
    paged->num_blocks = num_blocks;
    paged->max_blocks = max_blocks;
    paged->block_table = table->view;
    paged->cache_seqlens = lengths->view;
    paged->new_len = new_len;
    paged->longest_k = longest;
    problem->seq_k = capacity;
    return MFA_OK;
}

/* Mask blocks covering n queries or keys: ceil(n / MFA_MASK_BLOCK), for any n >= 0. */
static int64_t blocks_of(int64_t n) { return n / MFA_MASK_BLOCK + (n % MFA_MASK_BLOCK != 0); }

/* Every value of a block summary is one of its three codes. */
static mfa_status check_block_mask_values(const mfa_checks* checks, const mfa_checked* summary) {
    const char* origin;
    mfa_status status = mfa_host_origin(checks, summary, &origin);
    if (status != MFA_OK) return status;
    const int64_t* shape = summary->array->shape;
    const int64_t* stride = summary->view.stride;
    for (int64_t b = 0; b < shape[0]; ++b)
        for (int64_t h = 0; h < shape[1]; ++h)
            for (int64_t r = 0; r < shape[2]; ++r)
                for (int64_t c = 0; c < shape[3]; ++c) {
                    const uint8_t code = (uint8_t)
                        origin[b * stride[0] + h * stride[1] + r * stride[2] + c * stride[3]];
                    if (code > 2) {
                        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                             "args.block_mask[%lld, %lld, %lld, %lld] = %u is not "
                                             "a summary code (0, 1 or 2): give the output of "
                                             "mfa_mask_summarize",
                                             (long long)b, (long long)h, (long long)r, (long long)c,
                                             (unsigned)code);
                    }
                }
    return MFA_OK;
}

/* The score modifiers, for a problem whose batch, heads and lengths are known. */
static mfa_status check_modifiers(mfa_checks* checks, const mfa_attention_args* args, bool backward,
                                  const char* batch_from, const char* seq_q_from,
                                  const char* seq_k_from, mfa_problem* problem) {
    mfa_status status;
    if (!isfinite(args->softcap) || args->softcap < 0.0f) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "args.softcap must be finite and >= 0 (0 = none), got %g",
                             (double)args->softcap);
    }
    problem->softcap = args->softcap;
    if (args->mask != NULL) {
        mfa_array_rule rule = mfa_rule(1u << MFA_DTYPE_BOOL | F32_ONLY | 1u << problem->dtype,
                                       "boolean, or additive in f32 or q's dtype", false);
        rule.dim_names = mask_dims;
        mfa_rule_size(&rule, 0, problem->batch, batch_from, true);
        mfa_rule_size(&rule, 1, problem->heads_q, "q.shape[1]", true);
        mfa_rule_size(&rule, 2, problem->seq_q, seq_q_from, true);
        mfa_rule_size(&rule, 3, problem->seq_k, seq_k_from, true);
        const mfa_checked* mask;
        if ((status = mfa_check_array(checks, "args.mask", args->mask, &rule, &mask)))
            return status;
        problem->mask = mask->view;
        problem->mask_dtype = args->mask->dtype;
    }
    if (args->block_mask != NULL) {
        if (args->mask == NULL) {
            return invalid("args.block_mask is given without args.mask; a block mask summarizes "
                           "the call's mask");
        }
        mfa_array_rule rule = mfa_rule(1u << MFA_DTYPE_BOOL, "summary codes are bytes", false);
        rule.dim_names = mask_dims;
        mfa_rule_size(&rule, 0, args->mask->shape[0], "args.mask.shape[0]",
                      problem->mask.stride[0] == 0);
        mfa_rule_size(&rule, 1, args->mask->shape[1], "args.mask.shape[1]",
                      problem->mask.stride[1] == 0);
        mfa_rule_size(&rule, 2, blocks_of(problem->seq_q), "ceil(Nq / MFA_MASK_BLOCK)", false);
        mfa_rule_size(&rule, 3, blocks_of(problem->seq_k), "ceil(Nk / MFA_MASK_BLOCK)", false);
        const mfa_checked* summary;
        if ((status =
                 mfa_check_array(checks, "args.block_mask", args->block_mask, &rule, &summary)) ||
            (status = check_block_mask_values(checks, summary)))
            return status;
        problem->block_mask = summary->view;
    }
    if (args->alibi_slopes != NULL) {
        mfa_array_rule rule = mfa_rule(F32_ONLY, "ALiBi slopes are f32", false);
        mfa_rule_size(&rule, 0, problem->batch, batch_from, true);
        mfa_rule_size(&rule, 1, problem->heads_q, "q.shape[1]", false);
        mfa_rule_size(&rule, 2, 1, NULL, false);
        mfa_rule_size(&rule, 3, 1, NULL, false);
        const mfa_checked* slopes;
        if ((status =
                 mfa_check_array(checks, "args.alibi_slopes", args->alibi_slopes, &rule, &slopes)))
            return status;
        problem->alibi_slopes = slopes->view;
    }
    mfa_array_rule head_rule = mfa_rule(F32_ONLY, "sinks are f32", false);
    mfa_rule_size(&head_rule, 0, 1, NULL, false);
    mfa_rule_size(&head_rule, 1, problem->heads_q, "q.shape[1]", false);
    mfa_rule_size(&head_rule, 2, 1, NULL, false);
    mfa_rule_size(&head_rule, 3, 1, NULL, false);
    if (args->sinks != NULL) {
        const mfa_checked* sinks;
        if ((status = mfa_check_array(checks, "args.sinks", args->sinks, &head_rule, &sinks)))
            return status;
        problem->sinks = sinks->view;
    }
    if (backward && args->dsinks != NULL) {
        if (args->sinks == NULL) {
            return invalid("args.dsinks is given without args.sinks; it is the gradient of the "
                           "sinks");
        }
        head_rule.output = true;
        const mfa_checked* dsinks;
        if ((status = mfa_check_array(checks, "args.dsinks", args->dsinks, &head_rule, &dsinks)))
            return status;
        problem->dsinks = dsinks->view;
    }
    return MFA_OK;
}

static uint32_t features_of(const mfa_attention_args* args, mfa_layout layout) {
    uint32_t features = 0;
    if (args->mask) features |= MFA_FEATURE_MASK;
    if (args->block_mask) features |= MFA_FEATURE_BLOCK_MASK;
    if (args->softcap > 0.0f) features |= MFA_FEATURE_SOFTCAP;
    if (args->alibi_slopes) features |= MFA_FEATURE_ALIBI;
    if (args->sinks) features |= MFA_FEATURE_SINKS;
    if (layout == MFA_LAYOUT_VARLEN) features |= MFA_FEATURE_VARLEN;
    if (layout == MFA_LAYOUT_PAGED) features |= MFA_FEATURE_PAGED_KV;
    if (args->initial_state) features |= MFA_FEATURE_INITIAL_STATE;
    return features;
}

mfa_status mfa_build_problem(const mfa_target* target, mfa_direction direction,
                             const mfa_attention_params* params, const mfa_attention_args* given,
                             bool encode, mfa_problem* problem) {
    const mfa_capabilities* caps = target->caps;
    const int dir = (int)direction;
    mfa_status status;
    if (dir != MFA_FORWARD && dir != MFA_BACKWARD) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "direction = %d is not an mfa_direction",
                             dir);
    }
    const bool backward = dir == MFA_BACKWARD;
    if (backward && !(caps->features & MFA_FEATURE_BACKWARD)) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED, "the %s backend has no backward pass",
                             target->backend);
    }
    if (given == NULL) return invalid("args is NULL; fill it with mfa_attention_args_init()");
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    if ((status = mfa_read_input_struct(given, &args, MFA_ATTENTION_ARGS_FIRST_SIZE, sizeof args,
                                        "0.2.0", "args", "mfa_attention_args")))
        return status;
    if (args.initial_state != 0 && args.initial_state != 1 && !backward) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "args.initial_state must be 0 or 1, got %d", (int)args.initial_state);
    }
    mfa_layout layout;
    if ((status = check_direction(&args, backward)) || (status = choose_layout(&args, &layout)))
        return status;

    memset(problem, 0, sizeof *problem);
    mfa_checked storage[MAX_ARRAYS];
    mfa_checks checks;
    mfa_checks_init(&checks, target, storage, MAX_ARRAYS);

    /* q fixes the dtype, the memory and the query-side sizes; k and v the key-side ones. */
    mfa_array_rule rule = mfa_rule(FLOAT_DTYPES, "attention operands are floating point", false);
    const mfa_checked* checked;
    if ((status = mfa_check_array(&checks, "q", args.q, &rule, &checked))) return status;
    const mfa_array* q = args.q;
    const int dtype = (int)q->dtype;
    if (!(caps->dtypes & (1u << dtype))) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED, "the %s backend does not support dtype %s",
                             target->backend, mfa_dtype_name((mfa_dtype)dtype));
    }
    if (encode && checks.memory != MFA_MEMORY_DEVICE) {
        return invalid("q is in host memory; mfa_attention_encode takes device arrays only");
    }
    problem->q = checked->view;
    const int64_t batch = q->shape[0], heads_q = q->shape[1], rows_q = q->shape[2];
    const int64_t head_dim = q->shape[3];
    if (layout == MFA_LAYOUT_VARLEN && batch != 1) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "q.shape[0] (batch) must be 1 with packed sequences "
                             "(args.cu_seqlens_q), got %lld",
                             (long long)batch);
    }

    const bool writes_cache = layout == MFA_LAYOUT_PAGED && args.k_new != NULL;
    rule = mfa_rule(1u << dtype, io_rule, writes_cache);
    if (layout == MFA_LAYOUT_PAGED) {
        rule.dim_names = cache_dims;
    } else {
        mfa_rule_size(&rule, 0, batch, "q.shape[0]", false);
    }
    mfa_rule_size(&rule, 3, head_dim, "q.shape[3]", false);
    if ((status = mfa_check_array(&checks, "k", args.k, &rule, &checked))) return status;
    problem->k = checked->view;
    const int64_t heads_kv = args.k->shape[1], rows_k = args.k->shape[2];
    rule = mfa_rule(1u << dtype, io_rule, writes_cache);
    if (layout == MFA_LAYOUT_PAGED) {
        rule.dim_names = cache_dims;
        mfa_rule_size(&rule, 0, args.k->shape[0], "k.shape[0]", false);
    } else {
        mfa_rule_size(&rule, 0, batch, "q.shape[0]", false);
    }
    mfa_rule_size(&rule, 1, heads_kv, "k.shape[1]", false);
    mfa_rule_size(&rule, 2, rows_k, "k.shape[2]", false);
    if ((status = mfa_check_array(&checks, "v", args.v, &rule, &checked))) return status;
    problem->v = checked->view;
    const int64_t head_dim_v = args.v->shape[3];
    if (layout == MFA_LAYOUT_PAGED && (rows_k % 8 != 0 || rows_k > MAX_BLOCK_SIZE)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "k.shape[2] (block size) must be a multiple of 8 from 8 to %d with a "
                             "paged KV cache, got %lld",
                             MAX_BLOCK_SIZE, (long long)rows_k);
    }

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
                             target->backend, (long long)caps->max_head_dim);
    }

    /* The query-side outputs, and the backward's operands. */
    rule = mfa_rule(1u << dtype, io_rule, !backward);
    mfa_rule_size(&rule, 0, batch, "q.shape[0]", false);
    mfa_rule_size(&rule, 1, heads_q, "q.shape[1]", false);
    mfa_rule_size(&rule, 2, rows_q, "q.shape[2]", false);
    mfa_rule_size(&rule, 3, head_dim_v, "v.shape[3]", false);
    if ((status = mfa_check_array(&checks, "out", args.out, &rule, &checked))) return status;
    problem->out = checked->view;
    if (backward && args.lse == NULL)
        return invalid("lse is NULL; the backward pass needs the forward's log-sum-exp");
    if (args.initial_state && args.lse == NULL)
        return invalid("lse is NULL; args.initial_state needs the state's log-sum-exp");
    const mfa_array_rule out_rule = rule;
    if (args.lse != NULL) {
        rule = mfa_rule(F32_ONLY, "lse is always f32", !backward);
        mfa_rule_size(&rule, 0, batch, "q.shape[0]", false);
        mfa_rule_size(&rule, 1, heads_q, "q.shape[1]", false);
        mfa_rule_size(&rule, 2, rows_q, "q.shape[2]", false);
        mfa_rule_size(&rule, 3, 1, NULL, false);
        if ((status = mfa_check_array(&checks, "lse", args.lse, &rule, &checked))) return status;
        problem->lse = checked->view;
    }
    if (backward) {
        rule = out_rule;
        rule.output = false;
        if ((status = mfa_check_array(&checks, "dout", args.dout, &rule, &checked))) return status;
        problem->dout = checked->view;
        const struct {
            const char* name;
            const mfa_array* array;
            const mfa_array* like;
            const char* like_name;
            mfa_view* view;
        } grads[3] = {{"dq", args.dq, q, "q", &problem->dq},
                      {"dk", args.dk, args.k, "k", &problem->dk},
                      {"dv", args.dv, args.v, "v", &problem->dv}};
        static const char* const from[3][4] = {
            {"q.shape[0]", "q.shape[1]", "q.shape[2]", "q.shape[3]"},
            {"k.shape[0]", "k.shape[1]", "k.shape[2]", "k.shape[3]"},
            {"v.shape[0]", "v.shape[1]", "v.shape[2]", "v.shape[3]"}};
        for (int g = 0; g < 3; ++g) {
            rule = mfa_rule(1u << dtype, io_rule, true);
            for (int d = 0; d < 4; ++d)
                mfa_rule_size(&rule, d, grads[g].like->shape[d], from[g][d], false);
            if ((status = mfa_check_array(&checks, grads[g].name, grads[g].array, &rule, &checked)))
                return status;
            *grads[g].view = checked->view;
        }
    }

    problem->dtype = (mfa_dtype)dtype;
    problem->memory = (mfa_memory)checks.memory;
    problem->layout = layout;
    problem->batch = batch;
    problem->heads_q = heads_q;
    problem->heads_kv = heads_kv;
    problem->group = heads_q / heads_kv;
    problem->seq_q = rows_q;
    problem->seq_k = rows_k;
    problem->head_dim = head_dim;
    problem->head_dim_v = head_dim_v;
    const char *batch_from = "q.shape[0]", *seq_q_from = "q.shape[2]", *seq_k_from = "k.shape[2]";
    if (layout == MFA_LAYOUT_VARLEN) {
        if ((status = check_varlen(&checks, &args, rows_q, rows_k, problem))) return status;
        problem->seq_q = args.max_seqlen_q;
        problem->seq_k = args.max_seqlen_k;
        batch_from = "B (args.cu_seqlens_q.shape[3] - 1)";
        seq_q_from = "args.max_seqlen_q";
        seq_k_from = "args.max_seqlen_k";
    } else if (layout == MFA_LAYOUT_PAGED) {
        if ((status = check_paged(&checks, &args, (mfa_dtype)dtype, problem))) return status;
        seq_k_from = "args.block_table.shape[3] * block_size";
    }
    if ((status = check_modifiers(&checks, &args, backward, batch_from, seq_q_from, seq_k_from,
                                  problem)) ||
        (status = mfa_check_no_overlap(&checks)) || (status = resolve_params(params, problem)))
        return status;
    problem->initial_state = args.initial_state;
    mfa_problem_band(problem, problem->seq_q, problem->seq_k, &problem->band_lo, &problem->band_hi);

    /* Every argument is valid: now whether this backend runs what the call asks for. */
    problem->features = features_of(&args, layout);
    const uint32_t supported = backward ? caps->backward_features : caps->features;
    const uint32_t missing = problem->features & ~supported;
    for (size_t i = 0; missing && i < sizeof feature_names / sizeof feature_names[0]; ++i) {
        if (missing & feature_names[i].bit) {
            return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                                 "the %s backend does not support %s in the %s", target->backend,
                                 feature_names[i].what, backward ? "backward" : "forward");
        }
    }
    return MFA_OK;
}
