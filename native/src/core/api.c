/* The public entry points: versions, dtypes, backends, contexts and the attention calls.
 * Everything here validates and then hands a checked mfa_problem to the context's backend.
 * Plain C, like validate.c, so that out-of-range enum values from callers are well defined. */
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/export.h"
#include "core/validate.h"
#if MFA_HAVE_METAL
#include "metal/metal_backend.h"
#endif

_Static_assert(MFA_VERSION_NUMBER ==
                   MFA_VERSION_MAJOR * 10000 + MFA_VERSION_MINOR * 100 + MFA_VERSION_PATCH,
               "MFA_VERSION_NUMBER must match the MAJOR, MINOR and PATCH macros");

#define MFA_STRINGIFY_(x) #x
#define MFA_STRINGIFY(x)  MFA_STRINGIFY_(x)

struct mfa_context {
    const mfa_backend_ops* ops;
    void* state;
    mfa_capabilities caps; /* queried once; backends' capabilities do not change */
};

/* The backends compiled into this library, or NULL. */
static const mfa_backend_ops* backend_ops(int backend) {
    switch (backend) {
        case MFA_BACKEND_CPU: return mfa_cpu_backend_ops();
#if MFA_HAVE_METAL
        case MFA_BACKEND_METAL: return mfa_metal_backend_ops();
#endif
#if MFA_HAVE_METAL_SIM
        case MFA_BACKEND_METAL_SIM: return mfa_metal_sim_backend_ops();
#endif
        default: return NULL;
    }
}

static const char* why_not_built(int backend) {
    switch (backend) {
        case MFA_BACKEND_METAL: return "the metal backend is built only on Apple platforms";
        case MFA_BACKEND_METAL_SIM:
            return "the metal-sim backend was not built into this library: it needs clang >= 16 "
                   "as the C++ compiler at build time (e.g. CC=clang-16 CXX=clang++-16)";
        default: return "this backend was not built into this library";
    }
}

static int valid_backend(int backend) {
    return backend == MFA_BACKEND_AUTO || backend == MFA_BACKEND_CPU ||
           backend == MFA_BACKEND_METAL || backend == MFA_BACKEND_METAL_SIM;
}

static int valid_family(int family) {
    return family == MFA_GPU_FAMILY_NONE || family == MFA_GPU_FAMILY_APPLE7 ||
           family == MFA_GPU_FAMILY_APPLE8 || family == MFA_GPU_FAMILY_APPLE9;
}

static mfa_status check_context(const mfa_context* ctx) {
    if (ctx == NULL) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    return MFA_OK;
}

MFA_EXPORT unsigned mfa_version_number(void) { return MFA_VERSION_NUMBER; }

MFA_EXPORT const char* mfa_version_string(void) {
    return MFA_STRINGIFY(MFA_VERSION_MAJOR) "." MFA_STRINGIFY(MFA_VERSION_MINOR) "." MFA_STRINGIFY(
        MFA_VERSION_PATCH);
}

MFA_EXPORT size_t mfa_dtype_size(mfa_dtype dtype) {
    switch ((int)dtype) {
        case MFA_DTYPE_F32: return 4;
        case MFA_DTYPE_F16: return 2;
        case MFA_DTYPE_BF16: return 2;
    }
    return 0;
}

MFA_EXPORT const char* mfa_dtype_name(mfa_dtype dtype) {
    switch ((int)dtype) {
        case MFA_DTYPE_F32: return "f32";
        case MFA_DTYPE_F16: return "f16";
        case MFA_DTYPE_BF16: return "bf16";
    }
    return "unknown";
}

MFA_EXPORT void mfa_attention_params_init(mfa_attention_params* params) {
    if (params == NULL) return;
    memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->scale = 0.0f;
    params->causal = 0;
    params->alignment = MFA_ALIGN_BOTTOM_RIGHT;
    params->window_left = -1;
    params->window_right = -1;
}

MFA_EXPORT const char* mfa_backend_name(mfa_backend backend) {
    switch ((int)backend) {
        case MFA_BACKEND_AUTO: return "auto";
        case MFA_BACKEND_CPU: return "cpu";
        case MFA_BACKEND_METAL: return "metal";
        case MFA_BACKEND_METAL_SIM: return "metal-sim";
    }
    return "unknown";
}

MFA_EXPORT int mfa_backend_available(mfa_backend backend) {
    if ((int)backend == MFA_BACKEND_AUTO) return 1;
    const mfa_backend_ops* ops = backend_ops((int)backend);
    return ops != NULL && ops->available() ? 1 : 0;
}

MFA_EXPORT void mfa_context_options_init(mfa_context_options* options) {
    if (options == NULL) return;
    memset(options, 0, sizeof *options);
    options->struct_size = sizeof *options;
    options->num_threads = 0;
    options->gpu_family = MFA_GPU_FAMILY_NONE;
    options->sim_schedule_seed = 0;
}

MFA_EXPORT mfa_status mfa_context_create(mfa_backend backend, const mfa_context_options* options,
                                         mfa_context** out) {
    if (out == NULL) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!valid_backend((int)backend)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "backend = %d is not an mfa_backend",
                             (int)backend);
    }
    mfa_context_options resolved;
    mfa_context_options_init(&resolved);
    if (options != NULL) {
        if (options->struct_size != sizeof(mfa_context_options)) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "options.struct_size = %zu, expected %zu: initialise options "
                                 "with mfa_context_options_init()",
                                 options->struct_size, sizeof(mfa_context_options));
        }
        resolved = *options;
    }
    if (backend == MFA_BACKEND_AUTO) {
        backend = mfa_backend_available(MFA_BACKEND_METAL) ? MFA_BACKEND_METAL : MFA_BACKEND_CPU;
    }
    if (resolved.num_threads < 0 || resolved.num_threads > 4096) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "options.num_threads must be in [0, 4096] (0 = one per core), got %d",
                             (int)resolved.num_threads);
    }
    if (!valid_family((int)resolved.gpu_family)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "options.gpu_family = %d is not an mfa_gpu_family",
                             (int)resolved.gpu_family);
    }
    if (backend != MFA_BACKEND_METAL_SIM &&
        (resolved.gpu_family != MFA_GPU_FAMILY_NONE || resolved.sim_schedule_seed != 0)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "options.gpu_family and options.sim_schedule_seed apply to the "
                             "metal-sim backend only, not %s",
                             mfa_backend_name(backend));
    }

    const mfa_backend_ops* ops = backend_ops((int)backend);
    if (ops == NULL) {
        return mfa_set_error(MFA_ERROR_BACKEND_UNAVAILABLE, "%s", why_not_built((int)backend));
    }
    if (!ops->available()) {
        return mfa_set_error(MFA_ERROR_BACKEND_UNAVAILABLE,
                             "the %s backend is built but not usable on this machine%s",
                             mfa_backend_name(backend),
                             backend == MFA_BACKEND_METAL ? " (no Apple7 or later GPU found)" : "");
    }
    mfa_context* ctx = (mfa_context*)calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "cannot allocate a context");
    }
    ctx->ops = ops;
    mfa_status status = ops->create(&resolved, &ctx->state);
    if (status != MFA_OK) {
        free(ctx);
        return status;
    }
    memset(&ctx->caps, 0, sizeof ctx->caps);
    ctx->caps.struct_size = sizeof ctx->caps;
    ops->capabilities(ctx->state, &ctx->caps);
    *out = ctx;
    return MFA_OK;
}

MFA_EXPORT void mfa_context_destroy(mfa_context* ctx) {
    if (ctx == NULL) return;
    ctx->ops->destroy(ctx->state);
    free(ctx);
}

MFA_EXPORT mfa_backend mfa_context_backend(const mfa_context* ctx) {
    return ctx ? ctx->ops->backend : MFA_BACKEND_AUTO;
}

MFA_EXPORT const char* mfa_context_device_name(const mfa_context* ctx) {
    return ctx ? ctx->ops->device_name(ctx->state) : "";
}

MFA_EXPORT mfa_status mfa_context_capabilities(const mfa_context* ctx, mfa_capabilities* caps) {
    mfa_status status = check_context(ctx);
    if (status) return status;
    if (caps == NULL) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "caps is NULL");
    if (caps->struct_size < sizeof(caps->struct_size)) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "caps->struct_size = %zu; set it to sizeof(mfa_capabilities)",
                             caps->struct_size);
    }
    /* A caller built against an older header gets the prefix it knows about. */
    const size_t given = caps->struct_size;
    const size_t n = given < sizeof(mfa_capabilities) ? given : sizeof(mfa_capabilities);
    memcpy(caps, &ctx->caps, n);
    caps->struct_size = given;
    return MFA_OK;
}

MFA_EXPORT mfa_status mfa_context_last_gpu_time(const mfa_context* ctx, double* seconds) {
    mfa_status status = check_context(ctx);
    if (status) return status;
#if MFA_HAVE_METAL
    if (ctx->ops->backend == MFA_BACKEND_METAL) return mfa_metal_last_gpu_time(ctx->state, seconds);
#else
    (void)seconds; /* only the metal backend records GPU time */
#endif
    return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                         "GPU timing is recorded by the metal backend only, not %s",
                         mfa_backend_name(ctx->ops->backend));
}

MFA_EXPORT mfa_status mfa_attention_forward(mfa_context* ctx, const mfa_attention_params* params,
                                            const mfa_tensor* q, const mfa_tensor* k,
                                            const mfa_tensor* v, const mfa_tensor* out,
                                            const mfa_tensor* lse) {
    mfa_status status = check_context(ctx);
    if (status) return status;
    const mfa_call_tensors tensors = {q, k, v, out, lse, NULL, NULL, NULL, NULL};
    mfa_problem problem;
    status = mfa_build_problem(&ctx->caps, mfa_backend_name(ctx->ops->backend), params, &tensors,
                               false, &problem);
    if (status) return status;
    return ctx->ops->forward(ctx->state, &problem);
}

MFA_EXPORT mfa_status mfa_attention_backward(mfa_context* ctx, const mfa_attention_params* params,
                                             const mfa_tensor* q, const mfa_tensor* k,
                                             const mfa_tensor* v, const mfa_tensor* out,
                                             const mfa_tensor* dout, const mfa_tensor* lse,
                                             const mfa_tensor* dq, const mfa_tensor* dk,
                                             const mfa_tensor* dv) {
    mfa_status status = check_context(ctx);
    if (status) return status;
    if (!(ctx->caps.features & MFA_FEATURE_BACKWARD)) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED, "the %s backend has no backward pass",
                             mfa_backend_name(ctx->ops->backend));
    }
    const mfa_call_tensors tensors = {q, k, v, out, lse, dout, dq, dk, dv};
    mfa_problem problem;
    status = mfa_build_problem(&ctx->caps, mfa_backend_name(ctx->ops->backend), params, &tensors,
                               true, &problem);
    if (status) return status;
    return ctx->ops->backward(ctx->state, &problem);
}
