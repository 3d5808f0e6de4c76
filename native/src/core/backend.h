/*
 * The contract between libmfa's core (validation, errors, dispatch) and its backends.
 *
 * The core validates every argument of a public call and turns it into an mfa_problem: a
 * normalized, already-checked description in which defaults are resolved and the alignment,
 * causal mask and window are one visibility band. A backend therefore never re-validates and
 * never sees an mfa_attention_params, an mfa_attention_args, an mfa_tensor or an mfa_array.
 * Every feature a problem uses has been checked against the backend's capabilities, so a
 * backend only ever receives problems it declared it can run. Plain C so the Objective-C host
 * can include it.
 */
#ifndef MFA_CORE_BACKEND_H
#define MFA_CORE_BACKEND_H

#include "mfa.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A validated strided view, in the memory its problem says (mfa_problem.memory). Element
 * (b, h, s, d) is at
 *   host memory:    data + elem_size * (b*stride[0] + h*stride[1] + s*stride[2] + d*stride[3])
 *   device memory:  byte (byte_offset + elem_size * (the same sum)) of buffer
 * A view that is absent has data == NULL and buffer == NULL (mfa_view_present). Strides of
 * size-1 dimensions are 0, so a view indexed over its problem's full shape broadcasts where the
 * caller's array had size 1 or stride 0. In host memory buffer is NULL and byte_offset 0; in
 * device memory data is NULL. Every byte any index reaches was checked to lie inside the
 * caller's memory (device: inside the buffer's length). */
typedef struct mfa_view {
    char* data;
    int64_t stride[4];
    void* buffer;
    int64_t byte_offset;
} mfa_view;

static inline int mfa_view_present(const mfa_view* view) {
    return view->data != NULL || view->buffer != NULL;
}

/* Which memory every view of a problem is in (one call never mixes them). */
typedef enum mfa_memory {
    MFA_MEMORY_HOST = 0,  /* data pointers */
    MFA_MEMORY_DEVICE = 1 /* buffer + byte_offset; only for backends with DEVICE_BUFFERS */
} mfa_memory;

/* How the rows of q, k and v are laid out (mfa.h, mfa_attention_args). */
typedef enum mfa_layout {
    MFA_LAYOUT_DENSE = 0,  /* [B, H, N, D]: every sequence has seq_q queries and seq_k keys */
    MFA_LAYOUT_VARLEN = 1, /* packed sequences: mfa_problem.varlen */
    MFA_LAYOUT_PAGED = 2   /* paged KV cache: mfa_problem.paged */
} mfa_layout;

/* Packed sequences. Every operand view of the problem (q, k, v, out, lse, dout, dq, dk, dv) is
 * packed: its batch stride is 0 and sequence b's rows start at row cu_seqlens_q[b] (query-side
 * operands) or cu_seqlens_k[b] (key-side operands) of the view, i.e. at
 * data + elem_size * (h*stride[1] + (cu[b] + s)*stride[2] + d*stride[3]). Sequence b has
 * cu_q[b + 1] - cu_q[b] queries and cu_k[b + 1] - cu_k[b] keys, either possibly 0. The offsets
 * were checked (on the host, while validating): cu[0] = 0, nondecreasing, every length at most
 * the problem's seq_q / seq_k (the caller's max_seqlen_q / _k), cu[B] = total. */
typedef struct mfa_varlen {
    mfa_view cu_seqlens_q; /* I32; entry b at stride[3] * b (the other strides are 0) */
    mfa_view cu_seqlens_k;
    int64_t total_q;   /* packed query rows (q.shape[2]) */
    int64_t total_k;   /* packed key rows (k.shape[2]) */
    int64_t longest_q; /* the longest sequence's query count, <= seq_q (may be 0) */
    int64_t longest_k; /* likewise for keys, <= seq_k */
} mfa_varlen;

/* A paged KV cache. The problem's k and v views are the caches: element (blk, h, r, d) is row
 * r of block blk for kv head h. Sequence b (q, out, lse dense over b) has
 * Nk_b = cache_seqlens[b] + new_len keys; its key j is row j % block_size of block
 * block_table[b, j / block_size]. With new_len > 0, key cache_seqlens[b] + n (n < new_len) is
 * row n of k_new / v_new, which the backend also writes into that cache row (the caches are
 * outputs then) before or while attending. The core checked, reading the integer arrays on the
 * host: every block id a sequence reaches is in [0, num_blocks), Nk_b <= max_blocks *
 * block_size, no cache row is written twice, and no written block is reached by another
 * (sequence, block position). Entries of block_table past a sequence's reach were not read and
 * may hold anything: a backend must not read them either. */
typedef struct mfa_paged {
    int64_t block_size;   /* k.shape[2]: a multiple of 8 in [8, 256] */
    int64_t num_blocks;   /* k.shape[0] */
    int64_t max_blocks;   /* block_table.shape[3] */
    mfa_view block_table; /* I32 [B, 1, 1, max_blocks]: entry (b, i) at stride[0]*b + stride[3]*i */
    mfa_view cache_seqlens; /* I32 [B, 1, 1, 1]: entry b at stride[0] * b */
    mfa_view k_new;         /* [B, Hkv, new_len, D]; absent when new_len is 0 */
    mfa_view v_new;         /* [B, Hkv, new_len, Dv] */
    int64_t new_len;        /* N_new, or 0 */
    int64_t longest_k;      /* max over b of Nk_b (may be 0) */
} mfa_paged;

/* Visibility of key j from query i, for every backend, is one band of diagonals:
 *   visible(i, j) = band_lo <= j - i <= band_hi        (0 <= i < seq_q, 0 <= j < seq_k)
 * The core derives it from mfa.h's rule (alignment, causal, window) and clamps both ends to
 * [-seq_q, seq_k]. Clamping changes no visibility, since every j - i lies strictly inside that
 * range; it makes "unbounded" an ordinary value, keeps i + band_lo and j - band_hi from
 * overflowing, and lets the kernels take the band as 32-bit integers. Backends use it as is.
 *
 * band_lo / band_hi are the band of a dense problem. For packed and paged problems every
 * sequence has its own lengths and so its own band: mfa_problem_band() gives it, from the
 * problem's resolved alignment and window (the one place the rule is turned into a band).
 *
 * The modifiers (mfa.h, mfa_attention_args, gives the exact semantics): a view is absent where
 * the call has none. Each is indexed over its full logical shape, broadcast through zero
 * strides (mfa_view): mask (b, h, i, j) over [batch, heads_q, seq_q, seq_k] with local i, j
 * (packed and paged problems too; for paged, seq_k is the cache capacity max_blocks *
 * block_size), block_mask (b, h, i / MFA_MASK_BLOCK, j / MFA_MASK_BLOCK), alibi_slopes (b, h, 0,
 * 0), sinks and dsinks (0, h, 0, 0). */
typedef struct mfa_problem {
    mfa_dtype dtype; /* q, k, v, out, dout, dq, dk, dv, k_new, v_new */
    int64_t batch;   /* B; for packed problems cu_seqlens_q.shape[3] - 1 */
    int64_t heads_q;
    int64_t heads_kv;   /* divides heads_q; query head h reads kv head h / group */
    int64_t group;      /* heads_q / heads_kv */
    int64_t seq_q;      /* Nq; packed: max_seqlen_q */
    int64_t seq_k;      /* Nk; packed: max_seqlen_k; paged: max_blocks * block_size */
    int64_t head_dim;   /* D */
    int64_t head_dim_v; /* Dv */
    float scale;        /* resolved: never 0, always finite */
    int64_t band_lo;    /* lowest visible j - i; in [-seq_q, seq_k] */
    int64_t band_hi;    /* highest visible j - i; in [-seq_q, seq_k] */
    mfa_view q, k, v, out;
    mfa_view lse;              /* f32, stride[3] unused; absent when not requested (forward) */
    mfa_view dout, dq, dk, dv; /* backward only */

    /* What the call uses: the bits of MFA_FEATURE_MASK to MFA_FEATURE_INITIAL_STATE, all of
     * them in the backend's capabilities for this direction. */
    uint32_t features;
    mfa_memory memory;
    mfa_layout layout;
    /* The visibility rule, resolved, for per-sequence bands (mfa_problem_band): the causal
     * mask is folded into window_right (0); -1 = unbounded. */
    mfa_alignment alignment;
    int64_t window_left;
    int64_t window_right;
    float softcap; /* 0: none; else > 0 and finite */
    int32_t
        initial_state;    /* forward: out and lse hold a state to merge into (read, then written) */
    mfa_view mask;        /* absent, or mask_dtype over [batch, heads_q, seq_q, seq_k] */
    mfa_dtype mask_dtype; /* MFA_DTYPE_BOOL (visible where nonzero), F32 or dtype (additive) */
    mfa_view block_mask;  /* BOOL summary (mfa.h, mfa_mask_summarize) of mask; only with mask */
    mfa_view alibi_slopes; /* f32 */
    mfa_view sinks;        /* f32 */
    mfa_view dsinks;       /* f32, backward output: written, not accumulated */
    mfa_varlen varlen;     /* MFA_LAYOUT_VARLEN */
    mfa_paged paged;       /* MFA_LAYOUT_PAGED */
} mfa_problem;

/* The visibility band of backend.h for a query row aligned at p(i) = i + diag_offset and a
 * window of (window_left, window_right) keys around it, -1 meaning unbounded (causal masking
 * is window_right = 0): lo = diag_offset - window_left and hi = diag_offset + window_right,
 * each clamped to [-seq_q, seq_k] (an unbounded side is the clamp's end). seq_q, seq_k >= 0,
 * windows >= -1. */
static inline void mfa_visibility_band(int64_t seq_q, int64_t seq_k, int64_t diag_offset,
                                       int64_t window_left, int64_t window_right, int64_t* band_lo,
                                       int64_t* band_hi) {
    int64_t lo, hi;
    /* diag_offset - window_left can only overflow downwards, + window_right only upwards. */
    if (window_left < 0 || __builtin_sub_overflow(diag_offset, window_left, &lo) || lo < -seq_q)
        lo = -seq_q;
    if (lo > seq_k) lo = seq_k;
    if (window_right < 0 || __builtin_add_overflow(diag_offset, window_right, &hi) || hi > seq_k)
        hi = seq_k;
    if (hi < -seq_q) hi = -seq_q;
    *band_lo = lo;
    *band_hi = hi;
}

/* The band of one sequence of problem with seq_q queries and seq_k keys (a dense problem's own
 * lengths give its band_lo / band_hi). */
static inline void mfa_problem_band(const mfa_problem* problem, int64_t seq_q, int64_t seq_k,
                                    int64_t* band_lo, int64_t* band_hi) {
    const int64_t diag_offset = problem->alignment == MFA_ALIGN_BOTTOM_RIGHT ? seq_k - seq_q : 0;
    mfa_visibility_band(seq_q, seq_k, diag_offset, problem->window_left, problem->window_right,
                        band_lo, band_hi);
}

/* One part of a merge, and the merge itself (mfa.h, mfa_attention_merge), validated: every
 * view spans [batch, heads, rows, head_dim_v] (lse views [.., 1]); an out or lse output that is
 * exactly one part's view is that view. */
typedef struct mfa_merge_part {
    mfa_view out;
    mfa_dtype out_dtype; /* f32, f16 or bf16 */
    mfa_view lse;        /* f32 */
} mfa_merge_part;

typedef struct mfa_merge_problem {
    mfa_memory memory;
    int64_t batch, heads, rows, head_dim_v;
    int32_t count;
    const mfa_merge_part* parts; /* count of them */
    mfa_view out;
    mfa_dtype out_dtype;
    mfa_view lse; /* absent when not wanted */
} mfa_merge_problem;

/* A mask summary (mfa.h, mfa_mask_summarize), validated: the mask is indexed over
 * [batch, heads, seq_q, seq_k] with zero strides where it broadcasts, the summary over
 * [batch, heads, ceil(seq_q / MFA_MASK_BLOCK), ceil(seq_k / MFA_MASK_BLOCK)]. */
typedef struct mfa_summary_problem {
    mfa_memory memory;
    int64_t batch, heads, seq_q, seq_k;
    mfa_view mask;
    mfa_dtype mask_dtype; /* BOOL, F32, F16 or BF16 */
    mfa_view summary;     /* BOOL */
} mfa_summary_problem;

/* What a backend does beyond host memory: device buffers, command buffers and encoding, and its
 * own merge / mask summary (device kernels). Every member may be NULL where the backend lacks
 * it; the core checks at context creation that the capabilities and these members agree
 * (MFA_FEATURE_DEVICE_BUFFERS: the buffer members; MFA_FEATURE_ENCODE: encode and the command
 * buffer members). buffer and command_buffer arguments are never NULL, lengths never 0. */
typedef struct mfa_device_ops {
    /* MFA_FEATURE_DEVICE_BUFFERS (mfa.h, Device buffers and command buffers). buffer_length
     * must answer for any buffer a caller can pass (metal: any id<MTLBuffer>): validation bounds
     * device views with it, and reads integer arrays through buffer_contents. */
    mfa_status (*buffer_create)(void* state, size_t length, void** buffer);
    void* (*buffer_contents)(void* state, void* buffer);
    size_t (*buffer_length)(void* state, void* buffer);
    void (*buffer_destroy)(void* state, void* buffer);
    /* MFA_FEATURE_ENCODE: mfa_attention_encode. problem->memory is MFA_MEMORY_DEVICE, and the
     * problem lives only for this call (runner.h: prepare reads it; encode and finish need not).
     * Either fails with nothing encoded or encodes the whole call. */
    mfa_status (*encode)(void* state, void* command_buffer, mfa_direction direction,
                         const mfa_problem* problem);
    mfa_status (*command_buffer_create)(void* state, void** command_buffer);
    mfa_status (*command_buffer_commit)(void* state, void* command_buffer);
    mfa_status (*command_buffer_wait)(void* state, void* command_buffer);
    void (*command_buffer_destroy)(void* state, void* command_buffer);
    /* Optional overrides of the core's portable host implementations (mfa_core_merge_host,
     * mfa_core_mask_summarize_host): when set, called for every merge / summary of the
     * context, in host or device memory; a backend may hand host problems back to the core's
     * functions. When NULL, the core runs host problems and rejects device ones. */
    mfa_status (*merge)(void* state, const mfa_merge_problem* problem);
    mfa_status (*mask_summarize)(void* state, const mfa_summary_problem* problem);
} mfa_device_ops;

/* What a backend implements. `state` is the backend's per-context object. Entry points are
 * called concurrently from many threads with the same state; they must be thread-safe.
 * Errors are reported with mfa_set_error() and returned as a status.
 *
 * forward and backward run a problem synchronously (mfa_attention_compute and the 0.1 calls);
 * its memory is host memory, or device memory when the backend declares
 * MFA_FEATURE_DEVICE_BUFFERS. Members are only ever appended. */
typedef struct mfa_backend_ops {
    mfa_backend backend;
    int (*available)(void); /* usable on this machine */
    mfa_status (*create)(const mfa_context_options* options, void** state);
    void (*destroy)(void* state);
    const char* (*device_name)(void* state);
    void (*capabilities)(void* state, mfa_capabilities* caps); /* full struct, core copies */
    mfa_status (*forward)(void* state, const mfa_problem* problem);
    mfa_status (*backward)(void* state, const mfa_problem* problem);
    /* Optional; NULL where the backend records no GPU time. Seconds the GPU spent on the most
     * recently completed call (mfa_context_last_gpu_time); seconds is never NULL. Fails with
     * MFA_ERROR_INVALID_ARGUMENT while no call has completed. */
    mfa_status (*last_gpu_time)(void* state, double* seconds);
    /* Optional; NULL for a backend of host memory only. */
    const mfa_device_ops* device;
} mfa_backend_ops;

/* The backends compiled into this library; NULL where a backend was not built. */
const mfa_backend_ops* mfa_cpu_backend_ops(void);
const mfa_backend_ops* mfa_metal_backend_ops(void);
const mfa_backend_ops* mfa_metal_sim_backend_ops(void);

/* The core's portable implementations, for problems in host memory (core/merge.c). */
mfa_status mfa_core_merge_host(const mfa_merge_problem* problem);
mfa_status mfa_core_mask_summarize_host(const mfa_summary_problem* problem);

/* Record an error for the calling thread (printf-style) and return status, so a backend can
 * write `return mfa_set_error(MFA_ERROR_DEVICE, "...", ...);`. */
mfa_status mfa_set_error(mfa_status status, const char* format, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* MFA_CORE_BACKEND_H */
