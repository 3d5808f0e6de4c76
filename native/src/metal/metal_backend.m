// The Metal backend's C entry points (mfa_backend_ops): a call is the plan runner's
// (planner/runner.h) on the context's device. Each drains its own autorelease pool: callers are
// plain C threads (Python's among them) that have none.
#import "metal_host.h"

static int metal_available(void) {
    @autoreleasepool {
        return mfa_metal_select_device() != nil;
    }
}

// The options (worker threads, simulated family, schedule seed) concern the CPU and metal-sim
// backends; the core rejects those that do not apply to metal.
static mfa_status metal_create(const mfa_context_options* options, void** state) {
    (void)options;
    @autoreleasepool {
        LibMFAMetalContext* context = nil;
        const mfa_status status = mfa_metal_context_create(&context);
        if (status != MFA_OK) return status;
        *state = (__bridge_retained void*)context;
        return MFA_OK;
    }
}

static void metal_destroy(void* state) {
    if (state == NULL) return;
    @autoreleasepool {
        // Takes back the reference metal_create handed out; ARC releases it right here.
        (void)(__bridge_transfer LibMFAMetalContext*)state;
    }
}

static const char* metal_device_name(void* state) {
    return ((__bridge LibMFAMetalContext*)state).deviceName;
}

static void metal_capabilities(void* state, mfa_capabilities* caps) {
    LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)state;
    caps->dtypes = (1u << MFA_DTYPE_F32) | (1u << MFA_DTYPE_F16) | (1u << MFA_DTYPE_BF16);
    caps->features = MFA_PLAN_FEATURES | MFA_FEATURE_DEVICE_BUFFERS | MFA_FEATURE_ENCODE;
    caps->backward_features = MFA_PLAN_BACKWARD_FEATURES;
    caps->max_head_dim = MFA_PLAN_MAX_HEAD_DIM;
    caps->gpu_family = context.family;
    caps->num_threads = 0;
}

static mfa_status metal_forward(void* state, const mfa_problem* problem) {
    @autoreleasepool {
        return mfa_gpu_run(((__bridge LibMFAMetalContext*)state).gpuDevice, problem, false);
    }
}

static mfa_status metal_backward(void* state, const mfa_problem* problem) {
    @autoreleasepool {
        return mfa_gpu_run(((__bridge LibMFAMetalContext*)state).gpuDevice, problem, true);
    }
}

static mfa_status metal_last_gpu_time(void* state, double* seconds) {
    @autoreleasepool {
        if (![(__bridge LibMFAMetalContext*)state lastGPUTime:seconds]) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "metal: no attention call has completed on this context yet");
        }
        return MFA_OK;
    }
}

// ---- Device buffers and command buffers (mfa.h) ----
// Buffers and command buffers handed to callers are retained for them (__bridge_retained) and
// released by the matching destroy; those callers bring of their own are never retained.

static mfa_status metal_buffer_create(void* state, size_t length, void** buffer) {
    @autoreleasepool {
        LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)state;
        if (length > context.maxBufferLength) {
            return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                                 "metal: mfa_buffer_create: %zu bytes exceed %s's largest buffer "
                                 "(%lu bytes)",
                                 length, context.deviceName,
                                 (unsigned long)context.maxBufferLength);
        }
        id<MTLBuffer> created = [context.device newBufferWithLength:length
                                                            options:MTLResourceStorageModeShared];
        if (created == nil) {
            return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                                 "metal: cannot allocate a buffer of %zu bytes", length);
        }
        *buffer = (__bridge_retained void*)created;
        return MFA_OK;
    }
}

// NULL for a buffer in private storage, whose contents the CPU cannot see.
static void* metal_buffer_contents(void* state, void* buffer) {
    (void)state;
    return [(__bridge id<MTLBuffer>)buffer contents];
}

static size_t metal_buffer_length(void* state, void* buffer) {
    (void)state;
    return (size_t)((__bridge id<MTLBuffer>)buffer).length;
}

static void metal_buffer_destroy(void* state, void* buffer) {
    (void)state;
    @autoreleasepool {
        // Takes back the reference metal_buffer_create handed out; ARC releases it here.
        (void)(__bridge_transfer id<MTLBuffer>)buffer;
    }
}

static mfa_status metal_encode_into(void* state, void* command_buffer, mfa_direction direction,
                                    const mfa_problem* problem) {
    @autoreleasepool {
        return mfa_gpu_encode(((__bridge LibMFAMetalContext*)state).gpuDevice, command_buffer,
                              problem, direction == MFA_BACKWARD);
    }
}

static mfa_status metal_command_buffer_create(void* state, void** command_buffer) {
    @autoreleasepool {
        LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)state;
        id<MTLCommandBuffer> created = [context.queue commandBuffer];
        if (created == nil) {
            return mfa_set_error(MFA_ERROR_DEVICE, "metal: %s gave no command buffer",
                                 context.deviceName);
        }
        *command_buffer = (__bridge_retained void*)created;
        return MFA_OK;
    }
}

static mfa_status metal_command_buffer_commit(void* state, void* command_buffer) {
    (void)state;
    @autoreleasepool {
        id<MTLCommandBuffer> buffer = (__bridge id<MTLCommandBuffer>)command_buffer;
        const mfa_status status =
            mfa_metal_require_not_enqueued(buffer, "mfa_command_buffer_commit", "");
        if (status != MFA_OK) return status;
        [buffer commit];
        return MFA_OK;
    }
}

static mfa_status metal_command_buffer_wait(void* state, void* command_buffer) {
    (void)state;
    @autoreleasepool {
        id<MTLCommandBuffer> buffer = (__bridge id<MTLCommandBuffer>)command_buffer;
        if (buffer.status == MTLCommandBufferStatusNotEnqueued) {
            return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                                 "metal: mfa_command_buffer_wait: the command buffer was never "
                                 "committed (mfa_command_buffer_commit)");
        }
        [buffer waitUntilCompleted];
        if (buffer.status == MTLCommandBufferStatusCompleted) return MFA_OK;
        NSError* error = buffer.error;
        const BOOL out_of_memory = error != nil && error.code == MTLCommandBufferErrorOutOfMemory;
        return mfa_metal_error(out_of_memory ? MFA_ERROR_OUT_OF_MEMORY : MFA_ERROR_DEVICE, error,
                               "metal: the command buffer failed (status %lu)",
                               (unsigned long)buffer.status);
    }
}

// A committed command buffer is waited for first, as mfa.h promises.
static void metal_command_buffer_destroy(void* state, void* command_buffer) {
    (void)state;
    @autoreleasepool {
        id<MTLCommandBuffer> buffer = (__bridge_transfer id<MTLCommandBuffer>)command_buffer;
        if (buffer.status != MTLCommandBufferStatusNotEnqueued) [buffer waitUntilCompleted];
    }
}

static const mfa_device_ops metal_device_memory_ops = {
    metal_buffer_create,
    metal_buffer_contents,
    metal_buffer_length,
    metal_buffer_destroy,
    metal_encode_into,
    metal_command_buffer_create,
    metal_command_buffer_commit,
    metal_command_buffer_wait,
    metal_command_buffer_destroy,
    NULL,
    NULL,
};

static const mfa_backend_ops metal_ops = {
    MFA_BACKEND_METAL,   metal_available,          metal_create,  metal_destroy,
    metal_device_name,   metal_capabilities,       metal_forward, metal_backward,
    metal_last_gpu_time, &metal_device_memory_ops,
};

const mfa_backend_ops* mfa_metal_backend_ops(void) { return &metal_ops; }
