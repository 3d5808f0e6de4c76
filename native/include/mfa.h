/*
 * mfa.h - exact attention (FlashAttention) for Apple GPUs and CPUs, behind a plain C ABI.
 *
 * libmfa computes softmax(scale * Q K^T + mask) V and its gradients without ever storing the
 * N x N score matrix: tiled, online softmax, O(N) extra memory. Backends:
 *
 *   cpu        portable C++17, threads over batch x heads x row blocks. Always built.
 *   metal      Apple-silicon GPUs (Apple7 / M1 and later) through Metal. macOS builds only.
 *   metal-sim  the project's own Metal kernels compiled as C++ and executed on the CPU with GPU
 *              semantics. For testing the Metal path where no Apple GPU exists; slow.
 *
 * Conventions used by every function below:
 *   - Functions that can fail return an mfa_status. On failure nothing has been written to any
 *     output, and mfa_last_error() returns a message for the calling thread naming what was
 *     wrong (which argument, which dimension, expected vs got). This holds for running out of
 *     memory too: what a call needs is reserved before it writes. One exception: when a GPU
 *     fails while running the work (MFA_ERROR_DEVICE or MFA_ERROR_OUT_OF_MEMORY from the metal
 *     backend, or MFA_ERROR_DEVICE from metal-sim, which reports a fault of a kernel: a bug),
 *     outputs it writes in place may hold partial results.
 *   - Sizes and strides are int64_t and counted in elements, not bytes.
 *   - Structs that may grow carry their own size in `struct_size`; fill them with the matching
 *     *_init function, which sets struct_size and every default. Fields are only ever appended,
 *     each at or beyond the previous release's sizeof. The input structs (mfa_attention_params,
 *     mfa_context_options, mfa_attention_args) are accepted with any struct_size from their
 *     size in the release that introduced them (0.1.0; mfa_attention_args 0.2.0) up to the
 *     library's own sizeof; fields beyond struct_size take their defaults, so a program built
 *     against an older mfa.h runs unchanged on a newer libmfa.
 *     A larger struct_size (a program built against a newer mfa.h than the library) or a
 *     smaller one fails with MFA_ERROR_INVALID_ARGUMENT and a message naming the struct. An
 *     *_init function keeps filling the layout of the release that introduced it (a struct that
 *     grows comes with a new one), so it never writes past an older program's struct;
 *     mfa_attention_args_init takes the caller's struct_size instead.
 *     mfa_capabilities, an output, is written only up to the caller's struct_size.
 *   - A context may be used by many threads at once. All per-call state lives in the call.
 *   - fork(): a process may fork while other threads are inside calls. The child may use the
 *     cpu and metal-sim contexts it inherited (their worker threads are started again on its
 *     first call) and create new ones; calls in flight on other threads do not exist in the
 *     child. metal contexts must not be used in a forked child (Apple's frameworks do not
 *     support fork() without exec()).
 *
 * This header is parsed by the Python bindings (cffi, ABI mode): keep it plain C declarations,
 * with integer-literal #defines only and no macros inside declarations.
 */
#ifndef MFA_H
#define MFA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------------------------------- */
/* Version                                                                                   */
/* ----------------------------------------------------------------------------------------- */

#define MFA_VERSION_MAJOR 0
#define MFA_VERSION_MINOR 2
#define MFA_VERSION_PATCH 0
/* MFA_VERSION_MAJOR * 10000 + MFA_VERSION_MINOR * 100 + MFA_VERSION_PATCH */
#define MFA_VERSION_NUMBER 200

/* mfa_version_number(): the MFA_VERSION_NUMBER the library was built with. Compare it with the
 * header's to detect a mismatched shared library. */
unsigned mfa_version_number(void);

/* mfa_version_string(): "MAJOR.MINOR.PATCH" of the library. Static storage; never NULL. */
const char* mfa_version_string(void);

/* ----------------------------------------------------------------------------------------- */
/* Status codes and errors                                                                   */
/* ----------------------------------------------------------------------------------------- */

/* Values below 100 are stable; new codes are appended. */
typedef enum mfa_status {
    MFA_OK = 0,
    MFA_ERROR_INVALID_ARGUMENT = 1,    /* a null pointer, bad shape, stride, dtype or value */
    MFA_ERROR_UNSUPPORTED = 2,         /* a valid request this backend cannot run (see caps) */
    MFA_ERROR_BACKEND_UNAVAILABLE = 3, /* backend not built into this library, or no device */
    MFA_ERROR_OUT_OF_MEMORY = 4,       /* host or device allocation failed */
    MFA_ERROR_SIZE_OVERFLOW = 5,       /* an element or byte count does not fit in 64 bits */
    MFA_ERROR_DEVICE = 6,              /* the device or simulator failed while running work */
    MFA_ERROR_INTERNAL = 7             /* a bug in libmfa; please report the message */
} mfa_status;

/* mfa_status_string(): a short constant description of a status ("invalid argument", ...).
 * Unknown values give "unknown status". Static storage; never NULL. */
const char* mfa_status_string(mfa_status status);

/* mfa_last_error(): the message of the most recent failed call made by this thread, or "" if
 * none has failed yet. Valid until this thread's next libmfa call. Never NULL. */
const char* mfa_last_error(void);

/* ----------------------------------------------------------------------------------------- */
/* Data types and tensors                                                                    */
/* ----------------------------------------------------------------------------------------- */

/* The attention operands (q, k, v, out, dout, dq, dk, dv) are f32, f16 or bf16; lse is f32.
 * BOOL and I32 are for the arguments of mfa_attention_args that hold masks and integers. */
typedef enum mfa_dtype {
    MFA_DTYPE_F32 = 0,  /* IEEE binary32 */
    MFA_DTYPE_F16 = 1,  /* IEEE binary16 */
    MFA_DTYPE_BF16 = 2, /* bfloat16; stores round to nearest even */
    MFA_DTYPE_BOOL = 3, /* one byte; 0 is false, any other value true (masks, mask summaries) */
    MFA_DTYPE_I32 = 4   /* int32_t (sequence offsets and lengths, block tables) */
} mfa_dtype;

/* mfa_dtype_size(): bytes per element of dtype, or 0 for an unknown value. */
size_t mfa_dtype_size(mfa_dtype dtype);

/* mfa_dtype_name(): "f32", "f16", "bf16", "bool" or "i32"; "unknown" otherwise. Static
 * storage. */
const char* mfa_dtype_name(mfa_dtype dtype);

/* A strided view of a rank-4 tensor. The element at index (b, h, s, d) lives at
 *   (char*)data + mfa_dtype_size(dtype) * (b*strides[0] + h*strides[1] + s*strides[2] + d*strides[3]).
 *
 * Shapes, by role (B batch, Hq query heads, Hkv key/value heads, Nq / Nk sequence lengths,
 * D query/key head dimension, Dv value head dimension):
 *   q, out-grad-of-q (dq):   [B, Hq,  Nq, D ]      k, dk:  [B, Hkv, Nk, D ]
 *   out, dout:               [B, Hq,  Nq, Dv]      v, dv:  [B, Hkv, Nk, Dv]
 *   lse (log-sum-exp, f32):  [B, Hq,  Nq, 1 ]
 * [B, H, N, D] memory ("bhsd") and [B, N, H, D] memory ("bshd") are both expressed by strides,
 * as are sliced views. Strides may be negative or (for inputs) zero. Outputs must not overlap
 * themselves, each other, or any input. */
typedef struct mfa_tensor {
    void* data; /* first element; inputs are only read through it */
    mfa_dtype dtype;
    int64_t shape[4];
    int64_t strides[4]; /* in elements */
} mfa_tensor;

/* An mfa_tensor that may also live in a device buffer (DLPack's DLTensor has the same pair of
 * fields), for mfa_attention_compute, mfa_attention_encode and the functions after them. The
 * view's origin, element (0, 0, 0, 0), is
 *   host memory:    (char*)data + byte_offset, with buffer = NULL;
 *   device memory:  byte_offset bytes into buffer, with data = NULL. On metal, buffer is an
 *                   id<MTLBuffer> cast with __bridge (not retained: libmfa uses it during the
 *                   call, and mfa_attention_encode until the command buffer completes, so the
 *                   caller keeps it alive that long); on metal-sim, a buffer of
 *                   mfa_buffer_create.
 * Element (b, h, s, d) lies at the origin + mfa_dtype_size(dtype) * (b*strides[0] +
 * h*strides[1] + s*strides[2] + d*strides[3]), and the origin is aligned to the element size.
 * A device view must lie inside its buffer: byte_offset plus the offset of its lowest element
 * (below the origin when a stride is negative) is >= 0, and byte_offset plus the end of its
 * highest element is <= the buffer's length (mfa_buffer_length, metal: MTLBuffer.length).
 * Overlap rules are those of mfa_tensor, applied within each buffer; arrays in different
 * buffers are taken not to overlap. All arrays of one call are in the same kind of memory. */
typedef struct mfa_array {
    void* data;          /* host memory, or NULL */
    void* buffer;        /* a device buffer, or NULL */
    int64_t byte_offset; /* bytes from data or from the buffer's start to the origin */
    mfa_dtype dtype;
    int64_t shape[4];
    int64_t strides[4]; /* in elements */
} mfa_array;

/* ----------------------------------------------------------------------------------------- */
/* Attention parameters                                                                      */
/* ----------------------------------------------------------------------------------------- */

/* Where the causal diagonal and the sliding window are anchored when Nq != Nk.
 * Query row i (0-based) is given the aligned position
 *   p(i) = i + (Nk - Nq)   for MFA_ALIGN_BOTTOM_RIGHT (FlashAttention >= 2.1, MLX: the last
 *                          query sees the last key), the default;
 *   p(i) = i               for MFA_ALIGN_TOP_LEFT (PyTorch's is_causal). */
typedef enum mfa_alignment { MFA_ALIGN_BOTTOM_RIGHT = 0, MFA_ALIGN_TOP_LEFT = 1 } mfa_alignment;

/* Options of one attention call. Key j is visible from query i when all of these hold:
 *   causal == 0       or  j <= p(i)
 *   window_left < 0   or  j >= p(i) - window_left
 *   window_right < 0  or  j <= p(i) + window_right
 * (FlashAttention's window_size convention; -1 means unbounded on that side.)
 * A query row that sees no key gets out = 0, lse = -inf and zero gradients. */
typedef struct mfa_attention_params {
    size_t struct_size;      /* sizeof(mfa_attention_params), set by mfa_attention_params_init */
    float scale;             /* multiplies Q K^T; 0 selects 1/sqrt(D). Must be finite. Applied
                                to each dot product, so only the logits need to fit in f32 (not
                                q * scale or scale * log2(e)). */
    int32_t causal;          /* 0 or 1 */
    mfa_alignment alignment; /* anchors causal and the window; default bottom-right */
    int64_t window_left;     /* keys before p(i) that stay visible; -1 = unbounded (default) */
    int64_t window_right;    /* keys after p(i) that stay visible;  -1 = unbounded (default) */
} mfa_attention_params;

/* mfa_attention_params_init(): set struct_size and the defaults: scale 1/sqrt(D), no causal
 * mask, bottom-right alignment, unbounded window. params must not be NULL. */
void mfa_attention_params_init(mfa_attention_params* params);

/* ----------------------------------------------------------------------------------------- */
/* Backends and contexts                                                                     */
/* ----------------------------------------------------------------------------------------- */

typedef enum mfa_backend {
    MFA_BACKEND_AUTO = 0, /* metal where an Apple GPU is usable, otherwise cpu */
    MFA_BACKEND_CPU = 1,
    MFA_BACKEND_METAL = 2,
    MFA_BACKEND_METAL_SIM = 3
} mfa_backend;

/* GPU families the Metal planner distinguishes. For metal-sim this picks the family whose
 * block-size tables are simulated; for metal it is read from the device. */
typedef enum mfa_gpu_family {
    MFA_GPU_FAMILY_NONE = 0,   /* CPU backend */
    MFA_GPU_FAMILY_APPLE7 = 7, /* M1, A14 */
    MFA_GPU_FAMILY_APPLE8 = 8, /* M2, A15, A16 */
    MFA_GPU_FAMILY_APPLE9 = 9  /* M3, M4, A17 Pro, A18 and later */
} mfa_gpu_family;

/* mfa_backend_name(): "auto", "cpu", "metal" or "metal-sim"; "unknown" otherwise. */
const char* mfa_backend_name(mfa_backend backend);

/* mfa_backend_available(): 1 if a context for backend can be created on this machine (built
 * into this library and, for metal, an Apple7+ GPU present), else 0. AUTO is always 1. */
int mfa_backend_available(mfa_backend backend);

typedef struct mfa_context_options {
    size_t struct_size;         /* sizeof(mfa_context_options), set by mfa_context_options_init */
    int32_t num_threads;        /* cpu, metal-sim: worker threads; 0 = one per core (default) */
    mfa_gpu_family gpu_family;  /* metal-sim: family to simulate; NONE = APPLE9 (default) */
    uint64_t sim_schedule_seed; /* metal-sim: 0 runs threads in a fixed order (default); any
                                    other value shuffles the order threads run between barriers */
} mfa_context_options;

/* mfa_context_options_init(): set struct_size and the defaults listed above. */
void mfa_context_options_init(mfa_context_options* options);

/* An opaque handle owning a backend's device, queues, caches and worker threads. */
typedef struct mfa_context mfa_context;

/* mfa_context_create(): create a context for backend. options may be NULL for the defaults.
 * Asking for a backend that is not available is an error (MFA_ERROR_BACKEND_UNAVAILABLE),
 * never a silent fallback. On success *out receives the context; on failure *out is NULL. */
mfa_status mfa_context_create(mfa_backend backend, const mfa_context_options* options,
                              mfa_context** out);

/* mfa_context_destroy(): release a context and everything it owns. Accepts NULL. The caller
 * must ensure no other thread is using the context, and that no command buffer holds work
 * encoded on it that has not completed (destroy those, or wait for them, first). */
void mfa_context_destroy(mfa_context* ctx);

/* mfa_context_backend(): the backend the context runs (never AUTO). */
mfa_backend mfa_context_backend(const mfa_context* ctx);

/* mfa_context_device_name(): the device, e.g. "Apple M3 Max" or the CPU model with its SIMD
 * level. Owned by the context. */
const char* mfa_context_device_name(const mfa_context* ctx);

/* Bits of mfa_capabilities.features and .backward_features. A call that uses a feature its
 * context lacks fails with MFA_ERROR_UNSUPPORTED, naming the feature, before anything is
 * written; no feature is ever ignored or emulated behind the caller's back. */
typedef enum mfa_feature {
    MFA_FEATURE_BACKWARD = 1,           /* mfa_attention_backward */
    MFA_FEATURE_LSE = 2,                /* forward can return the log-sum-exp */
    MFA_FEATURE_CAUSAL = 4,             /* causal masking, both alignments */
    MFA_FEATURE_WINDOW = 8,             /* sliding windows */
    MFA_FEATURE_GQA = 16,               /* Hq a multiple of Hkv (MQA included) */
    MFA_FEATURE_VALUE_HEAD_DIM = 32,    /* Dv != D */
    MFA_FEATURE_STRIDES = 64,           /* arbitrary element strides */
    MFA_FEATURE_MASK = 128,             /* args.mask, boolean and additive */
    MFA_FEATURE_BLOCK_MASK = 256,       /* args.block_mask (mfa_mask_summarize) */
    MFA_FEATURE_SOFTCAP = 512,          /* args.softcap */
    MFA_FEATURE_ALIBI = 1024,           /* args.alibi_slopes */
    MFA_FEATURE_SINKS = 2048,           /* args.sinks; in the backward also args.dsinks */
    MFA_FEATURE_VARLEN = 4096,          /* args.cu_seqlens_q / _k: packed sequences */
    MFA_FEATURE_PAGED_KV = 8192,        /* args.block_table: paged caches, k_new / v_new */
    MFA_FEATURE_INITIAL_STATE = 16384,  /* args.initial_state */
    MFA_FEATURE_DEVICE_BUFFERS = 32768, /* mfa_buffer_*, device arrays in mfa_attention_compute */
    MFA_FEATURE_ENCODE = 65536          /* mfa_attention_encode, mfa_command_buffer_* */
} mfa_feature;

/* What a context can run, so callers can check instead of guessing. */
typedef struct mfa_capabilities {
    size_t struct_size;         /* set by the caller to sizeof(mfa_capabilities) */
    uint32_t dtypes;            /* bit (1u << dtype) for each dtype of q, k and v supported */
    uint32_t features;          /* OR of mfa_feature bits; MASK to INITIAL_STATE: in the forward */
    int64_t max_head_dim;       /* largest D and Dv accepted */
    mfa_gpu_family gpu_family;  /* NONE for cpu */
    int32_t num_threads;        /* cpu, metal-sim: worker threads in use; 0 for metal */
    uint32_t backward_features; /* the bits of CAUSAL to INITIAL_STATE the backward supports
                                   (DEVICE_BUFFERS and ENCODE apply to both directions) */
} mfa_capabilities;

/* mfa_context_capabilities(): fill *caps. caps->struct_size must be set by the caller; fields
 * beyond it are not written. */
mfa_status mfa_context_capabilities(const mfa_context* ctx, mfa_capabilities* caps);

/* mfa_context_last_gpu_time(): seconds the GPU spent on the most recently completed attention
 * call of ctx (GPUEndTime - GPUStartTime of its command buffer; a backward call counts all its
 * passes). Under concurrent use of ctx, whichever call finished last. For benchmarks: planning,
 * pipeline compilation, staging copies and the wait are excluded. metal only: other backends
 * give MFA_ERROR_UNSUPPORTED; MFA_ERROR_INVALID_ARGUMENT when seconds is NULL or no call has
 * completed on ctx yet. */
mfa_status mfa_context_last_gpu_time(const mfa_context* ctx, double* seconds);

/* ----------------------------------------------------------------------------------------- */
/* Attention                                                                                 */
/* ----------------------------------------------------------------------------------------- */

/* mfa_attention_forward(): out = softmax(scale * q k^T + mask) v, per batch and query head;
 * query head h reads key/value head h / (Hq / Hkv).
 *   q, k, v   inputs; one dtype.
 *   out       output, q's dtype, [B, Hq, Nq, Dv].
 *   lse       optional output (NULL to skip): f32 [B, Hq, Nq, 1], natural-log log-sum-exp of
 *             the scaled, masked scores of each row; -inf for rows that see no key.
 *   params    NULL for the defaults.
 * Every argument is validated before anything is written. */
mfa_status mfa_attention_forward(mfa_context* ctx, const mfa_attention_params* params,
                                 const mfa_tensor* q, const mfa_tensor* k, const mfa_tensor* v,
                                 const mfa_tensor* out, const mfa_tensor* lse);

/* mfa_attention_backward(): gradients of the forward pass with the same params.
 *   q, k, v, out, lse  as given to and returned by mfa_attention_forward (lse is required).
 *                      A row whose lse is -inf is a row that saw no key, whatever its scores:
 *                      its dq is 0 and it adds nothing to dk and dv. The forward gives such
 *                      rows -inf; a caller may set it to leave a row out.
 *   dout               gradient of the loss with respect to out; q's dtype.
 *   dq, dk, dv         outputs, shaped like q, k and v, q's dtype. With GQA, dk and dv sum
 *                      over the query heads that share each key/value head.
 * Runs delta = rowsum(dout * out), then one pass parallel over query rows (dq) and one parallel
 * over key rows (dk, dv): no atomics and no N x N buffer. O(B * Hq * Nq) scratch.
 * Accuracy: P = exp(scores - lse) is recomputed from f32 scores and the f32 lse, so the gradients
 * are accurate only while the logits' f32 rounding is far below 1 (|logits| up to a few
 * thousand). Beyond that the call still succeeds and writes every gradient, but their values
 * may be wrong, and no error says so. */
mfa_status mfa_attention_backward(mfa_context* ctx, const mfa_attention_params* params,
                                  const mfa_tensor* q, const mfa_tensor* k, const mfa_tensor* v,
                                  const mfa_tensor* out, const mfa_tensor* dout,
                                  const mfa_tensor* lse, const mfa_tensor* dq, const mfa_tensor* dk,
                                  const mfa_tensor* dv);

/* ----------------------------------------------------------------------------------------- */
/* Attention with every feature                                                              */
/* ----------------------------------------------------------------------------------------- */

typedef enum mfa_direction { MFA_FORWARD = 0, MFA_BACKWARD = 1 } mfa_direction;

/* The arrays of one mfa_attention_compute or mfa_attention_encode call, and the options added
 * after 0.1 (mfa_attention_params keeps its first layout). Fill it with mfa_attention_args_init,
 * then set what the call uses; unused arrays stay NULL. Shapes below use the names of
 * mfa_tensor (B, Hq, Hkv, Nq, Nk, D, Dv).
 *
 * Which arrays a direction takes (any other array given is an error, never ignored):
 *   MFA_FORWARD   q, k, v, out; lse (optional; required with initial_state); the modifiers;
 *                 a layout (packed or paged); initial_state.
 *   MFA_BACKWARD  q, k, v, out, dout, lse, dq, dk, dv as in mfa_attention_backward; the
 *                 modifiers of the forward, with dsinks (optional) beside sinks; packed layout.
 *
 * Scores. For query row i with aligned position p(i) (mfa_alignment) and a key j that the
 * causal/window rule of mfa_attention_params and the mask leave visible:
 *   1. s_ij = scale * q_i . k_j
 *   2. softcap > 0:    s_ij = softcap * tanh(s_ij / softcap)   (flash-attn's and Gemma's order:
 *                      right after scaling, before any bias)
 *   3. alibi_slopes:   s_ij += -slope(b, h) * |p(i) - j|       (flash-attn's convention)
 *   4. additive mask:  s_ij += mask(b, h, i, j)                 (-inf hides the pair)
 * A boolean mask instead hides the pairs where it is false. Masks intersect the causal/window
 * rule. Then over the visible keys j of the row (t_h = sinks(h), a logit not multiplied by
 * scale; without sinks the exp(t_h) term is absent):
 *   lse_i = log(exp(t_h) + sum_j exp(s_ij)),   p_ij = exp(s_ij - lse_i),   out_i = sum_j p_ij v_j
 * so a sink takes part of the probability and adds no value. A row that sees no key gets
 * out = 0, lse = -inf (with a sink: out = 0, lse = t_h) and zero gradients; PyTorch instead gives
 * NaN for a row that its boolean mask hides entirely.
 *
 * Backward. dq, dk and dv are the exact gradients of the above (through the tanh of softcap;
 * masks, ALiBi slopes and the causal/window rule are constants and are not differentiated).
 * With delta_i = rowsum(dout_i * out_i) and p_sink(i) = exp(t_h - lse_i), dsinks receives
 *   dsinks(h) = -sum over b and i of p_sink(b, h, i) * delta(b, h, i)
 * (written, not accumulated). lse is the forward's; a row whose lse is -inf is taken as a row
 * that saw no key and gets zero gradients.
 *
 * Packed sequences (cu_seqlens_q and cu_seqlens_k, both or neither; flash-attn's varlen
 * layout). Sequence b has the query rows [cu_q[b], cu_q[b + 1]) of q, out, lse, dout and dq,
 * shaped [1, Hq, total_q, .], and the key rows [cu_k[b], cu_k[b + 1]) of k, v, dk and dv, shaped
 * [1, Hkv, total_k, .]. cu_q and cu_k are I32 [1, 1, 1, B + 1]: they start at 0, never decrease
 * and end at total_q and total_k. max_seqlen_q and max_seqlen_k, in [1, 2^31 - 1], bound every
 * sequence's length (the metal backends, which plan sequences of at most 2^30 rows, refuse a
 * larger bound with MFA_ERROR_UNSUPPORTED). Causal, window, alignment and ALiBi apply within
 * each sequence, i and j being its local row and key and p(i) aligned with its own lengths; a
 * mask is indexed (b, h, i, j) the same way, shaped [B or 1, Hq or 1, max_seqlen_q or 1,
 * max_seqlen_k or 1].
 * Sequences may be empty. No padding exists, so none is computed.
 *
 * Paged KV cache (block_table; flash-attn's flash_attn_with_kvcache; forward only). k and v are
 * caches of blocks, [num_blocks, Hkv, block_size, D] and [num_blocks, Hkv, block_size, Dv], in
 * any strides (flash-attn's [num_blocks, block_size, Hkv, D] is a permutation of them);
 * block_size is a multiple of 8 from 8 to 256. q, out and lse are dense [B, Hq, Nq, .].
 * block_table, I32 [B, 1, 1, max_blocks], lists the blocks of each sequence: key j of sequence b
 * is row j % block_size of block block_table(b, j / block_size). cache_seqlens, I32
 * [B, 1, 1, 1] and required, counts the keys already in each sequence's cache. With k_new and
 * v_new ([B, Hkv, N_new, D] and [B, Hkv, N_new, Dv], q's dtype, both or neither) their rows are
 * first written into the caches as keys cache_seqlens(b) to cache_seqlens(b) + N_new - 1, which
 * makes the caches outputs; sequence b then attends over Nk_b = cache_seqlens(b) + N_new keys
 * (without k_new over cache_seqlens(b)), aligned against its Nq = q.shape[2] queries. Each
 * Nk_b <= max_blocks * block_size (and < 2^31), every block a sequence reaches (its first
 * ceil(Nk_b / block_size) entries) is in [0, num_blocks), and entries past those are not read.
 * No cache row may be written twice, and a block receiving new rows must not be reached by
 * another sequence or at another position. A mask is indexed with the local key j: shaped
 * [B or 1, Hq or 1, Nq or 1, max_blocks * block_size or 1]. Packed q is not accepted here.
 *
 * Initial state (initial_state = 1, forward only, lse required). On entry out and lse hold the
 * result of earlier calls for the same queries over other keys; this call merges its keys into
 * them as mfa_attention_merge does, so out and lse are read and written. A row whose entry lse
 * is -inf starts empty: its entry out is not read. Sinks, if given, join this call's
 * denominator: give them to one of the calls that build a state.
 *
 * The integer arrays (cu_seqlens_*, block_table, cache_seqlens) are read on the host while the
 * call is validated (device arrays through their shared contents), and must hold the same
 * values until the work that uses them completes. */
typedef struct mfa_attention_args {
    size_t struct_size;    /* set by mfa_attention_args_init(args, sizeof *args) */
    float softcap;         /* 0 (default): none; > 0 and finite: the softcap of the scores;
                              negative, NaN or infinite: MFA_ERROR_INVALID_ARGUMENT */
    int32_t initial_state; /* 0 (default) or 1: see above */
    int64_t max_seqlen_q;  /* packed sequences: >= every query length; else 0 (default) */
    int64_t max_seqlen_k;  /* packed sequences: >= every key length; else 0 (default) */
    /* The operands of mfa_attention_forward / mfa_attention_backward. */
    const mfa_array* q;
    const mfa_array* k;
    const mfa_array* v;
    const mfa_array* out;
    const mfa_array* lse;
    const mfa_array* dout;
    const mfa_array* dq;
    const mfa_array* dk;
    const mfa_array* dv;
    /* Score modifiers. */
    const mfa_array* mask;         /* BOOL, f32 or q's dtype (additive); [B or 1, Hq or 1, Nq or 1,
                                      Nk or 1]: size 1 or stride 0 broadcasts */
    const mfa_array* block_mask;   /* with mask only: its summary from mfa_mask_summarize, trusted
                                      to match it; tiles it marks fully hidden are skipped */
    const mfa_array* alibi_slopes; /* f32 [B or 1, Hq, 1, 1] */
    const mfa_array* sinks;        /* f32 [1, Hq, 1, 1]: the logits t_h */
    const mfa_array* dsinks;       /* backward output, with sinks: f32 [1, Hq, 1, 1] */
    /* Packed sequences. */
    const mfa_array* cu_seqlens_q; /* I32 [1, 1, 1, B + 1] */
    const mfa_array* cu_seqlens_k; /* I32 [1, 1, 1, B + 1] */
    /* Paged KV cache: k and v are the caches. */
    const mfa_array* block_table;   /* I32 [B, 1, 1, max_blocks] */
    const mfa_array* cache_seqlens; /* I32 [B, 1, 1, 1] */
    const mfa_array* k_new;         /* [B, Hkv, N_new, D], appended before attending */
    const mfa_array* v_new;         /* [B, Hkv, N_new, Dv] */
} mfa_attention_args;

/* mfa_attention_args_init(): the defaults (every array NULL, every option 0: all bytes zero) in
 * the first struct_size bytes of *args, then args->struct_size = struct_size. Pass
 * sizeof(mfa_attention_args): unlike the other *_init functions this one takes the caller's
 * size, so it never writes past an older program's struct. Calls accept the sizes the input
 * structs accept (from this struct's first release, 0.2.0, to the library's own); a larger size
 * is zero-filled here and rejected by the calls. Nothing happens when args is NULL or
 * struct_size < sizeof(size_t). */
void mfa_attention_args_init(mfa_attention_args* args, size_t struct_size);

/* mfa_attention_compute(): one forward or backward call with every feature, synchronously: the
 * outputs are written when it returns. Host arrays on every backend; device arrays on backends
 * with MFA_FEATURE_DEVICE_BUFFERS (metal binds them in place), where the caller has finished the
 * GPU work that writes the inputs or reads the outputs (PyTorch-MPS: torch.mps.synchronize()).
 * mfa_attention_forward and mfa_attention_backward are this call on their tensors as host
 * arrays: one validation, one set of messages. params NULL for the defaults. Every argument is
 * validated, and every feature checked against the context's capabilities, before anything is
 * written. */
mfa_status mfa_attention_compute(mfa_context* ctx, mfa_direction direction,
                                 const mfa_attention_params* params,
                                 const mfa_attention_args* args);

/* mfa_attention_encode(): validate, plan and encode the passes of one call into command_buffer
 * (metal: an id<MTLCommandBuffer> cast with __bridge; metal-sim: from mfa_command_buffer_create)
 * without committing or waiting. Needs MFA_FEATURE_ENCODE and device arrays only. The passes run
 * after the work encoded into command_buffer before them. Every error that can be found before
 * running is returned here, and then nothing was encoded. Errors while running are reported by
 * the command buffer: metal, its status and error; metal-sim, mfa_command_buffer_wait. The
 * integer arrays are read now, on the host: they must already hold their values (not be written
 * by earlier work in the same command buffer) and keep them until it completes; so must every
 * array's buffer stay alive (libmfa retains none). Scratch (the backward's delta, split-key
 * partial results) is the context's, not the caller's, and goes back when the command buffer
 * completes: its size depends on the plan the device's tables give, which a caller cannot know
 * in advance (metal-sim: from a pool of the context that reuses memory between calls as the
 * frameworks' allocators do; metal: a private MTLBuffer per call, released by the command
 * buffer's completed handler). Commit every command buffer encoded into: on metal one released
 * without being committed never completes, and its calls' scratch is never released (metal-sim
 * drops the work and returns the scratch). Encodes on one context into different command
 * buffers may run concurrently; one command buffer takes one encode at a time, and none after
 * it was committed (MFA_ERROR_INVALID_ARGUMENT). */
mfa_status mfa_attention_encode(mfa_context* ctx, void* command_buffer, mfa_direction direction,
                                const mfa_attention_params* params, const mfa_attention_args* args);

/* mfa_attention_merge(): combine count >= 1 partial states (outs[i], lses[i]) of the same
 * queries over disjoint sets of keys into (out, lse). Per row, with m = max_i lses[i]:
 *   w_i = exp(lses[i] - m),   out = sum_i w_i outs[i] / sum_i w_i,   lse = m + log(sum_i w_i).
 * The lses are natural-log log-sum-exps with the scale included, as every call here returns
 * them. A part whose lse is -inf saw no key: it contributes nothing and its out is not read;
 * when every part's lse is -inf the row gets out = 0 and lse = -inf. A NaN or +inf in a part's
 * lse makes the row's out and lse NaN; a NaN in a part's out propagates.
 *   outs[i], out  [B, H, N, Dv], each f32, f16 or bf16 (they may differ)
 *   lses[i], lse  f32 [B, H, N, 1]; lse may be NULL (not wanted)
 * Parts may alias each other. out may be exactly one part's out (same memory, origin, dtype,
 * shape and strides) and lse exactly one part's lse, to merge in place; otherwise the outputs
 * overlap no part and not each other. Host arrays on every backend (accumulated in double);
 * device arrays only on a backend with a merge of its own (none yet: MFA_ERROR_UNSUPPORTED). */
mfa_status mfa_attention_merge(mfa_context* ctx, int32_t count, const mfa_array* const* outs,
                               const mfa_array* const* lses, const mfa_array* out,
                               const mfa_array* lse);

/* Queries and keys per side of one block of a mask summary. */
#define MFA_MASK_BLOCK 64

/* mfa_mask_summarize(): the block summary of a mask, for args.block_mask, so that calls reusing
 * the mask skip its fully hidden tiles without reading them. Reads the mask once.
 *   mask     as args.mask, for seq_q queries and seq_k keys: [M0, M1, seq_q or 1, seq_k or 1]
 *   summary  output, BOOL [S0, S1, ceil(seq_q / MFA_MASK_BLOCK), ceil(seq_k / MFA_MASK_BLOCK)],
 *            where S0 = M0, or 1 when the mask is the same for every batch (M0 = 1 or stride 0),
 *            and S1 likewise for the heads
 * Entry (b, h, r, c) covers queries [64 r, 64 r + 64) and keys [64 c, 64 c + 64), cut at seq_q
 * and seq_k:
 *   0  every pair hidden (false, or an additive -inf)
 *   2  every pair visible with nothing added (true, or an additive 0)
 *   1  anything else (NaN included)
 * The same S0, S1 and seq_q, seq_k rules tie args.block_mask to args.mask in a call. Host arrays
 * on every backend; device arrays only on a backend with its own (none yet). */
mfa_status mfa_mask_summarize(mfa_context* ctx, const mfa_array* mask, int64_t seq_q, int64_t seq_k,
                              const mfa_array* summary);

/* ----------------------------------------------------------------------------------------- */
/* Device buffers and command buffers                                                        */
/* ----------------------------------------------------------------------------------------- */

/* For callers without GPU objects of their own (C programs, tests; on metal-sim these are the
 * only device memory). Backends with MFA_FEATURE_DEVICE_BUFFERS (buffers) and
 * MFA_FEATURE_ENCODE (command buffers); elsewhere the mfa_status functions return
 * MFA_ERROR_UNSUPPORTED, mfa_buffer_contents NULL and mfa_buffer_length 0.
 *
 * mfa_buffer_create(): a device buffer of length >= 1 bytes that the CPU can read and write too
 * (metal: MTLResourceStorageModeShared, an id<MTLBuffer> retained for the caller). *buffer is
 * NULL on failure.
 * mfa_buffer_contents(): the buffer's CPU address; NULL for NULL or a buffer the CPU cannot see.
 * mfa_buffer_length(): its length in bytes (metal: of any id<MTLBuffer>); 0 for NULL.
 * mfa_buffer_destroy(): release a buffer of mfa_buffer_create once no work uses it; accepts
 * NULL. */
mfa_status mfa_buffer_create(mfa_context* ctx, size_t length, void** buffer);
void* mfa_buffer_contents(mfa_context* ctx, void* buffer);
size_t mfa_buffer_length(mfa_context* ctx, void* buffer);
void mfa_buffer_destroy(mfa_context* ctx, void* buffer);

/* mfa_command_buffer_create(): a command buffer on the context's queue (metal: an
 * id<MTLCommandBuffer> retained for the caller). *command_buffer is NULL on failure.
 * mfa_command_buffer_commit(): submit what was encoded into it, once (a second commit is
 * MFA_ERROR_INVALID_ARGUMENT). metal returns at once; metal-sim runs the work here, in encoding
 * order, stopping at the first failure, and returns MFA_OK whatever the work did.
 * mfa_command_buffer_wait(): block until a committed command buffer has completed; MFA_OK, or
 * the status of its failure (MFA_ERROR_DEVICE, MFA_ERROR_OUT_OF_MEMORY) with its message, as
 * often as it is asked; MFA_ERROR_INVALID_ARGUMENT for one never committed.
 * mfa_command_buffer_destroy(): release it; accepts NULL. A committed command buffer is waited
 * for first. Work encoded but never committed is dropped (metal-sim: its scratch returned;
 * metal: see mfa_attention_encode). */
mfa_status mfa_command_buffer_create(mfa_context* ctx, void** command_buffer);
mfa_status mfa_command_buffer_commit(mfa_context* ctx, void* command_buffer);
mfa_status mfa_command_buffer_wait(mfa_context* ctx, void* command_buffer);
void mfa_command_buffer_destroy(mfa_context* ctx, void* command_buffer);

/* ----------------------------------------------------------------------------------------- */
/* Memory                                                                                    */
/* ----------------------------------------------------------------------------------------- */

/* mfa_page_size(): the virtual-memory page size (16384 on Apple silicon macOS, often 4096
 * elsewhere), queried at run time. */
size_t mfa_page_size(void);

/* mfa_alloc(): bytes of page-aligned memory (length rounded up to whole pages), or NULL with
 * mfa_last_error() set. The Metal backend wraps such memory without copying it. */
void* mfa_alloc(size_t bytes);

/* mfa_free(): release memory from mfa_alloc. Accepts NULL. */
void mfa_free(void* ptr);

#ifdef __cplusplus
}
#endif

#endif /* MFA_H */
