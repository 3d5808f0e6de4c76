/* The public entry points: versions, dtypes, backends, contexts, the attention calls, merges,
 * mask summaries, device and command buffers. Everything here validates and then hands a checked
 * problem to the context's backend (or, for merges and mask summaries in host memory, to the
 * core's own implementations).
 * Plain C, like validate.c, so that out-of-range enum values from callers are well defined. */
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/export.h"
#include "core/validate.h"

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

/* A backend's capabilities must say what its ops implement, or the core's checks would let
 * through calls the backend cannot run (or reject ones it can). */
static mfa_status check_backend_contract(const mfa_backend_ops* ops, const mfa_capabilities* caps) {
    const mfa_device_ops* d = ops->device;
    const bool buffers = d != NULL && d->buffer_create && d->buffer_contents && d->buffer_length &&
                         d->buffer_destroy;
    const bool encode = d != NULL && d->encode && d->command_buffer_create &&
                        d->command_buffer_commit && d->command_buffer_wait &&
                        d->command_buffer_destroy;
    const char* name = mfa_backend_name(ops->backend);
    if (!(caps->features & MFA_FEATURE_DEVICE_BUFFERS) != !buffers ||
        !(caps->features & MFA_FEATURE_ENCODE) != !encode ||
        ((caps->features & MFA_FEATURE_ENCODE) && !(caps->features & MFA_FEATURE_DEVICE_BUFFERS))) {
        return mfa_set_error(MFA_ERROR_INTERNAL,
                             "the %s backend's capabilities (features 0x%x) do not match the "
                             "device operations it implements (buffers %d, encoding %d)",
                             name, (unsigned)caps->features, (int)buffers, (int)encode);
    }
    if (caps->backward_features & ~caps->features ||
        (caps->backward_features && !(caps->features & MFA_FEATURE_BACKWARD))) {
        return mfa_set_error(MFA_ERROR_INTERNAL,
                             "the %s backend declares backward features 0x%x beyond its forward "
                             "features 0x%x",
                             name, (unsigned)caps->backward_features, (unsigned)caps->features);
    }
    return MFA_OK;
}

static mfa_target target_of(const mfa_context* ctx, bool tensors) {
    const mfa_target target = {&ctx->caps, mfa_backend_name(ctx->ops->backend), ctx->ops->device,
                               ctx->state, tensors};
    return target;
}

/* The feature a device entry point needs, or an UNSUPPORTED error naming it. */
static mfa_status require(const mfa_context* ctx, uint32_t feature, const char* what) {
    if (ctx->caps.features & feature) return MFA_OK;
    return mfa_set_error(
        MFA_ERROR_UNSUPPORTED, "%s: the %s backend has no %s (it lacks %s)", what,
        mfa_backend_name(ctx->ops->backend),
        feature == MFA_FEATURE_ENCODE ? "command buffers or encoding" : "device buffers",
        feature == MFA_FEATURE_ENCODE ? "MFA_FEATURE_ENCODE" : "MFA_FEATURE_DEVICE_BUFFERS");
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
        mfa_status status =
            mfa_read_input_struct(options, &resolved, MFA_CONTEXT_OPTIONS_FIRST_SIZE,
                                  sizeof resolved, "0.1.0", "options", "mfa_context_options");
        if (status != MFA_OK) return status;
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
    if ((status = check_backend_contract(ops, &ctx->caps)) != MFA_OK) {
        ops->destroy(ctx->state);
        free(ctx);
        return status;
    }
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
    if (ctx->ops->last_gpu_time == NULL) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "GPU timing is recorded by the metal backend only, not %s",
                             mfa_backend_name(ctx->ops->backend));
    }
    if (seconds == NULL) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "seconds is NULL");
    return ctx->ops->last_gpu_time(ctx->state, seconds);
}

/* The one path of every synchronous attention call. */
static mfa_status compute(mfa_context* ctx, mfa_direction direction,
                          const mfa_attention_params* params, const mfa_attention_args* args,
                          bool tensors) {
    const mfa_target target = target_of(ctx, tensors);
    mfa_problem problem;
    mfa_status status = mfa_build_problem(&target, direction, params, args, false, &problem);
    if (status != MFA_OK) return status;
    return direction == MFA_BACKWARD ? ctx->ops->backward(ctx->state, &problem)
                                     : ctx->ops->forward(ctx->state, &problem);
}

MFA_EXPORT mfa_status mfa_attention_compute(mfa_context* ctx, mfa_direction direction,
                                            const mfa_attention_params* params,
                                            const mfa_attention_args* args) {
    mfa_status status = check_context(ctx);
    if (status) return status;
    return compute(ctx, direction, params, args, false);
}

MFA_EXPORT mfa_status mfa_attention_encode(mfa_context* ctx, void* command_buffer,
                                           mfa_direction direction,
                                           const mfa_attention_params* params,
                                           const mfa_attention_args* args) {
    mfa_status status = check_context(ctx);
    if (status || (status = require(ctx, MFA_FEATURE_ENCODE, "mfa_attention_encode")))
        return status;
    if (command_buffer == NULL)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "command_buffer is NULL");
    const mfa_target target = target_of(ctx, false);
    mfa_problem problem;
    status = mfa_build_problem(&target, direction, params, args, true, &problem);
    if (status != MFA_OK) return status;
    return ctx->ops->device->encode(ctx->state, command_buffer, direction, &problem);
}

/* A 0.1 tensor as a host array (NULL stays NULL, for validation to name). */
static const mfa_array* array_of(const mfa_tensor* t, mfa_array* storage) {
    if (t == NULL) return NULL;
    memset(storage, 0, sizeof *storage);
    storage->data = t->data;
    storage->dtype = t->dtype;
    memcpy(storage->shape, t->shape, sizeof storage->shape);
    memcpy(storage->strides, t->strides, sizeof storage->strides);
    return storage;
}

/* The 0.1 entry points: their tensors as host arrays of the general call (a forward passes no
 * dout, dq, dk, dv). */
static mfa_status compute_tensors(mfa_context* ctx, mfa_direction direction,
                                  const mfa_attention_params* params,
                                  const mfa_tensor* const* q_to_dv) {
    mfa_status status = check_context(ctx);
    if (status) return status;
    mfa_array arrays[9];
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    const mfa_array** slots[9] = {&args.q,    &args.k,  &args.v,  &args.out, &args.lse,
                                  &args.dout, &args.dq, &args.dk, &args.dv};
    for (int i = 0; i < 9; ++i) *slots[i] = array_of(q_to_dv[i], &arrays[i]);
    return compute(ctx, direction, params, &args, true);
}

MFA_EXPORT mfa_status mfa_attention_forward(mfa_context* ctx, const mfa_attention_params* params,
                                            const mfa_tensor* q, const mfa_tensor* k,
                                            const mfa_tensor* v, const mfa_tensor* out,
                                            const mfa_tensor* lse) {
    const mfa_tensor* tensors[9] = {q, k, v, out, lse, NULL, NULL, NULL, NULL};
    return compute_tensors(ctx, MFA_FORWARD, params, tensors);
}

MFA_EXPORT mfa_status mfa_attention_backward(mfa_context* ctx, const mfa_attention_params* params,
                                             const mfa_tensor* q, const mfa_tensor* k,
                                             const mfa_tensor* v, const mfa_tensor* out,
                                             const mfa_tensor* dout, const mfa_tensor* lse,
                                             const mfa_tensor* dq, const mfa_tensor* dk,
                                             const mfa_tensor* dv) {
    const mfa_tensor* tensors[9] = {q, k, v, out, lse, dout, dq, dk, dv};
    return compute_tensors(ctx, MFA_BACKWARD, params, tensors);
}

MFA_EXPORT mfa_status mfa_attention_merge(mfa_context* ctx, int32_t count,
                                          const mfa_array* const* outs,
                                          const mfa_array* const* lses, const mfa_array* out,
                                          const mfa_array* lse) {
    mfa_status status = check_context(ctx);
    if (status) return status;
    if (count < 1)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "count must be >= 1, got %d", (int)count);
    /* Validation checks every part's out and lse and the result's: 2 * count + 2 arrays, counted
     * in int. */
    if (count > (INT32_MAX - 2) / 2)
        return mfa_set_error(MFA_ERROR_SIZE_OVERFLOW, "count = %d parts: at most %d can be merged",
                             (int)count, (INT32_MAX - 2) / 2);
    if (outs == NULL || lses == NULL)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s is NULL", outs ? "lses" : "outs");
    mfa_merge_part* parts = (mfa_merge_part*)calloc((size_t)count, sizeof *parts);
    if (parts == NULL)
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "cannot allocate %d merge parts", (int)count);
    const mfa_target target = target_of(ctx, false);
    mfa_merge_problem problem;
    status = mfa_build_merge(&target, count, outs, lses, out, lse, parts, &problem);
    if (status == MFA_OK) {
        const mfa_device_ops* device = ctx->ops->device;
        if (device != NULL && device->merge != NULL) {
            status = device->merge(ctx->state, &problem);
        } else if (problem.memory == MFA_MEMORY_HOST) {
            status = mfa_core_merge_host(&problem);
        } else {
            status = mfa_set_error(MFA_ERROR_UNSUPPORTED,
                                   "mfa_attention_merge: the %s backend cannot merge arrays in "
                                   "device buffers (only host arrays)",
                                   mfa_backend_name(ctx->ops->backend));
        }
    }
    free(parts);
    return status;
}

MFA_EXPORT mfa_status mfa_mask_summarize(mfa_context* ctx, const mfa_array* mask, int64_t seq_q,
                                         int64_t seq_k, const mfa_array* summary) {
    mfa_status status = check_context(ctx);
    if (status) return status;
    const mfa_target target = target_of(ctx, false);
    mfa_summary_problem problem;
    status = mfa_build_summary(&target, mask, seq_q, seq_k, summary, &problem);
    if (status != MFA_OK) return status;
    const mfa_device_ops* device = ctx->ops->device;
    if (device != NULL && device->mask_summarize != NULL)
        return device->mask_summarize(ctx->state, &problem);
    if (problem.memory == MFA_MEMORY_HOST) return mfa_core_mask_summarize_host(&problem);
    return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                         "mfa_mask_summarize: the %s backend cannot summarize masks in device "
                         "buffers (only host arrays)",
                         mfa_backend_name(ctx->ops->backend));
}

MFA_EXPORT mfa_status mfa_buffer_create(mfa_context* ctx, size_t length, void** buffer) {
    if (buffer == NULL) return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "buffer is NULL");
    *buffer = NULL;
    mfa_status status = check_context(ctx);
    if (status || (status = require(ctx, MFA_FEATURE_DEVICE_BUFFERS, "mfa_buffer_create")))
        return status;
    if (length == 0)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "length must be >= 1 byte, got 0");
    status = ctx->ops->device->buffer_create(ctx->state, length, buffer);
    if (status != MFA_OK) *buffer = NULL;
    return status;
}

static bool has_buffers(const mfa_context* ctx) {
    return ctx != NULL && (ctx->caps.features & MFA_FEATURE_DEVICE_BUFFERS);
}

MFA_EXPORT void* mfa_buffer_contents(mfa_context* ctx, void* buffer) {
    if (!has_buffers(ctx) || buffer == NULL) return NULL;
    return ctx->ops->device->buffer_contents(ctx->state, buffer);
}

MFA_EXPORT size_t mfa_buffer_length(mfa_context* ctx, void* buffer) {
    if (!has_buffers(ctx) || buffer == NULL) return 0;
    return ctx->ops->device->buffer_length(ctx->state, buffer);
}

MFA_EXPORT void mfa_buffer_destroy(mfa_context* ctx, void* buffer) {
    if (!has_buffers(ctx) || buffer == NULL) return;
    ctx->ops->device->buffer_destroy(ctx->state, buffer);
}

MFA_EXPORT mfa_status mfa_command_buffer_create(mfa_context* ctx, void** command_buffer) {
    if (command_buffer == NULL)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "command_buffer is NULL");
    *command_buffer = NULL;
    mfa_status status = check_context(ctx);
    if (status || (status = require(ctx, MFA_FEATURE_ENCODE, "mfa_command_buffer_create")))
        return status;
    status = ctx->ops->device->command_buffer_create(ctx->state, command_buffer);
    if (status != MFA_OK) *command_buffer = NULL;
    return status;
}

/* The checks of commit and wait: a context that encodes, and a command buffer. */
static mfa_status check_command_buffer(const mfa_context* ctx, const void* command_buffer,
                                       const char* what) {
    mfa_status status = check_context(ctx);
    if (status || (status = require(ctx, MFA_FEATURE_ENCODE, what))) return status;
    if (command_buffer == NULL)
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT, "%s: command_buffer is NULL", what);
    return MFA_OK;
}

MFA_EXPORT mfa_status mfa_command_buffer_commit(mfa_context* ctx, void* command_buffer) {
    mfa_status status = check_command_buffer(ctx, command_buffer, "mfa_command_buffer_commit");
    if (status != MFA_OK) return status;
    return ctx->ops->device->command_buffer_commit(ctx->state, command_buffer);
}

MFA_EXPORT mfa_status mfa_command_buffer_wait(mfa_context* ctx, void* command_buffer) {
    mfa_status status = check_command_buffer(ctx, command_buffer, "mfa_command_buffer_wait");
    if (status != MFA_OK) return status;
    return ctx->ops->device->command_buffer_wait(ctx->state, command_buffer);
}

MFA_EXPORT void mfa_command_buffer_destroy(mfa_context* ctx, void* command_buffer) {
    if (ctx == NULL || !(ctx->caps.features & MFA_FEATURE_ENCODE) || command_buffer == NULL) return;
    ctx->ops->device->command_buffer_destroy(ctx->state, command_buffer);
}
