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
 *     *_init function, which sets struct_size and every default. Fields are only ever appended.
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
#define MFA_VERSION_MINOR 1
#define MFA_VERSION_PATCH 0
/* MFA_VERSION_MAJOR * 10000 + MFA_VERSION_MINOR * 100 + MFA_VERSION_PATCH */
#define MFA_VERSION_NUMBER 100

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

typedef enum mfa_dtype {
    MFA_DTYPE_F32 = 0, /* IEEE binary32 */
    MFA_DTYPE_F16 = 1, /* IEEE binary16 */
    MFA_DTYPE_BF16 = 2 /* bfloat16; stores round to nearest even */
} mfa_dtype;

/* mfa_dtype_size(): bytes per element of dtype, or 0 for an unknown value. */
size_t mfa_dtype_size(mfa_dtype dtype);

/* mfa_dtype_name(): "f32", "f16" or "bf16"; "unknown" otherwise. Static storage. */
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
 * must ensure no other thread is using the context. */
void mfa_context_destroy(mfa_context* ctx);

/* mfa_context_backend(): the backend the context runs (never AUTO). */
mfa_backend mfa_context_backend(const mfa_context* ctx);

/* mfa_context_device_name(): the device, e.g. "Apple M3 Max" or the CPU model with its SIMD
 * level. Owned by the context. */
const char* mfa_context_device_name(const mfa_context* ctx);

/* Bits of mfa_capabilities.features. */
typedef enum mfa_feature {
    MFA_FEATURE_BACKWARD = 1,        /* mfa_attention_backward */
    MFA_FEATURE_LSE = 2,             /* forward can return the log-sum-exp */
    MFA_FEATURE_CAUSAL = 4,          /* causal masking, both alignments */
    MFA_FEATURE_WINDOW = 8,          /* sliding windows */
    MFA_FEATURE_GQA = 16,            /* Hq a multiple of Hkv (MQA included) */
    MFA_FEATURE_VALUE_HEAD_DIM = 32, /* Dv != D */
    MFA_FEATURE_STRIDES = 64         /* arbitrary element strides */
} mfa_feature;

/* What a context can run, so callers can check instead of guessing. */
typedef struct mfa_capabilities {
    size_t struct_size;        /* set by the caller to sizeof(mfa_capabilities) */
    uint32_t dtypes;           /* bit (1u << dtype) set for each mfa_dtype supported */
    uint32_t features;         /* OR of mfa_feature bits */
    int64_t max_head_dim;      /* largest D and Dv accepted */
    mfa_gpu_family gpu_family; /* NONE for cpu */
    int32_t num_threads;       /* cpu, metal-sim: worker threads in use; 0 for metal */
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
 * Runs D = rowsum(dout * out), then one pass parallel over query rows (dq) and one parallel
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
