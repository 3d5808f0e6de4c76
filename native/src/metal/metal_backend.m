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
    caps->features = MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE | MFA_FEATURE_CAUSAL |
                     MFA_FEATURE_WINDOW | MFA_FEATURE_GQA | MFA_FEATURE_VALUE_HEAD_DIM |
                     MFA_FEATURE_STRIDES;
    caps->backward_features = MFA_FEATURE_CAUSAL | MFA_FEATURE_WINDOW | MFA_FEATURE_GQA |
                              MFA_FEATURE_VALUE_HEAD_DIM | MFA_FEATURE_STRIDES;
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

static const mfa_backend_ops metal_ops = {
    MFA_BACKEND_METAL,  metal_available, metal_create,   metal_destroy,       metal_device_name,
    metal_capabilities, metal_forward,   metal_backward, metal_last_gpu_time, NULL,
};

const mfa_backend_ops* mfa_metal_backend_ops(void) { return &metal_ops; }
