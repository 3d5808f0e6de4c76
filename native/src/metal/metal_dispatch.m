// One attention call: plan, pipelines, operand buffers, one command buffer, wait, check.
#import "metal_host.h"

_Static_assert(sizeof(mfa_kernel_params) <= 4096, "setBytes carries at most 4 KB");

static BOOL has_work(const mfa_pass_plan* pass) {
    return pass->threadgroups[0] != 0 && pass->threadgroups[1] != 0 && pass->threadgroups[2] != 0;
}

// The plan's counts index fixed arrays: a planner bug must not become an out-of-bounds read.
static mfa_status check_plan_shape(const mfa_plan* plan) {
    if (plan->num_passes > MFA_PLAN_MAX_PASSES) {
        return mfa_set_error(MFA_ERROR_INTERNAL, "metal: the planner returned %u passes",
                             plan->num_passes);
    }
    for (uint32_t i = 0; i < plan->num_passes; i++) {
        const mfa_pass_plan* pass = &plan->passes[i];
        if (pass->num_bindings > MFA_PLAN_MAX_BINDINGS ||
            pass->num_constants > MFA_PLAN_MAX_CONSTANTS) {
            return mfa_set_error(MFA_ERROR_INTERNAL,
                                 "metal: the plan of %s has %u bindings and %u "
                                 "function constants",
                                 pass->kernel_name, pass->num_bindings, pass->num_constants);
        }
        // setThreadgroupMemoryLength:atIndex: takes multiples of 16 bytes only.
        if (pass->threadgroup_memory_length % 16 != 0) {
            return mfa_set_error(MFA_ERROR_INTERNAL,
                                 "metal: the plan of %s asks for %u bytes of "
                                 "threadgroup memory, not a multiple of 16",
                                 pass->kernel_name, pass->threadgroup_memory_length);
        }
    }
    return MFA_OK;
}

// Plans until every pass's pipeline can run the planned threadgroup: a register-heavy pipeline
// may report a maxTotalThreadsPerThreadgroup below the device's, and the planner must then
// pick a configuration for that bound. The bound strictly shrinks, so this terminates.
static mfa_status
plan_with_pipelines(LibMFAMetalContext* context, const mfa_problem* problem,
                    mfa_metal_planner planner, mfa_plan* plan,
                    __strong id<MTLComputePipelineState> _Nullable pipelines[_Nonnull]) {
    uint32_t max_threads = context.maxThreadsPerThreadgroup;
    for (;;) {
        mfa_status status = planner(problem, context.family, max_threads, plan);
        if (status == MFA_OK) status = check_plan_shape(plan);
        if (status != MFA_OK) return status;
        uint32_t lowest = max_threads;
        for (uint32_t i = 0; i < plan->num_passes; i++) {
            const mfa_pass_plan* pass = &plan->passes[i];
            pipelines[i] = nil;
            if (!has_work(pass)) continue;
            if (pass->threads_per_threadgroup == 0 || pass->threads_per_threadgroup > max_threads) {
                return mfa_set_error(MFA_ERROR_INTERNAL,
                                     "metal: the planner gave %s %u threads per threadgroup for a "
                                     "bound of %u",
                                     pass->kernel_name, pass->threads_per_threadgroup, max_threads);
            }
            pipelines[i] = [context.pipelines pipelineForPass:pass status:&status];
            if (pipelines[i] == nil) return status;
            const NSUInteger pipeline_max = pipelines[i].maxTotalThreadsPerThreadgroup;
            if (pipeline_max < pass->threads_per_threadgroup && pipeline_max < lowest) {
                lowest = (uint32_t)pipeline_max;
            }
            const NSUInteger memory =
                pipelines[i].staticThreadgroupMemoryLength + pass->threadgroup_memory_length;
            if (memory > context.maxThreadgroupMemoryLength) {
                return mfa_set_error(MFA_ERROR_INTERNAL,
                                     "metal: %s needs %lu bytes of threadgroup memory; %s has %lu",
                                     pass->kernel_name, (unsigned long)memory, context.deviceName,
                                     (unsigned long)context.maxThreadgroupMemoryLength);
            }
        }
        if (lowest == max_threads) return MFA_OK;
        max_threads = lowest;
    }
}

// The buffer of every operand the plan binds, one per operand for the whole call, so a later
// pass reads what an earlier one wrote (delta) and a staged output has a single copy.
static mfa_status bind_operands(LibMFAMetalContext* context, const mfa_problem* problem,
                                const mfa_plan* plan, id<MTLBuffer> _Nullable scratch,
                                __strong LibMFAOperandBuffer* _Nullable operands[_Nonnull]) {
    const mfa_buffer_binding* first_binding[MFA_OPERAND_COUNT] = {NULL};
    for (uint32_t i = 0; i < plan->num_passes; i++) {
        const mfa_pass_plan* pass = &plan->passes[i];
        if (!has_work(pass)) continue;
        for (uint32_t j = 0; j < pass->num_bindings; j++) {
            const mfa_buffer_binding* binding = &pass->bindings[j];
            if ((unsigned)binding->operand >= MFA_OPERAND_COUNT) {
                return mfa_set_error(MFA_ERROR_INTERNAL, "metal: %s binds unknown operand %d",
                                     pass->kernel_name, (int)binding->operand);
            }
            const mfa_buffer_binding* earlier = first_binding[binding->operand];
            if (earlier != NULL) {
                if (earlier->byte_offset != binding->byte_offset ||
                    earlier->byte_length != binding->byte_length) {
                    return mfa_set_error(MFA_ERROR_INTERNAL,
                                         "metal: passes bind different extents of operand %s",
                                         mfa_operand_name(binding->operand));
                }
                continue;
            }
            first_binding[binding->operand] = binding;
            mfa_status status = MFA_OK;
            operands[binding->operand] =
                mfa_metal_bind_operand(context, problem, binding, scratch, &status);
            if (operands[binding->operand] == nil) return status;
        }
    }
    return MFA_OK;
}

static void encode_pass(id<MTLComputeCommandEncoder> encoder, const mfa_pass_plan* pass,
                        id<MTLComputePipelineState> pipeline,
                        __strong LibMFAOperandBuffer* _Nullable operands[_Nonnull]) {
    [encoder setComputePipelineState:pipeline];
    for (uint32_t j = 0; j < pass->num_bindings; j++) {
        const mfa_buffer_binding* binding = &pass->bindings[j];
        LibMFAOperandBuffer* operand = operands[binding->operand];
        [encoder setBuffer:operand.buffer offset:operand.offset atIndex:binding->index];
    }
    [encoder setBytes:&pass->params length:sizeof pass->params atIndex:pass->params_index];
    if (pass->threadgroup_memory_length > 0) {
        [encoder setThreadgroupMemoryLength:pass->threadgroup_memory_length
                                    atIndex:MFA_THREADGROUP_STAGING];
    }
    [encoder dispatchThreadgroups:MTLSizeMake((NSUInteger)pass->threadgroups[0],
                                              (NSUInteger)pass->threadgroups[1],
                                              (NSUInteger)pass->threadgroups[2])
            threadsPerThreadgroup:MTLSizeMake(pass->threads_per_threadgroup, 1, 1)];
}

static mfa_status command_buffer_status(id<MTLCommandBuffer> commands, const char* what) {
    if (commands.status == MTLCommandBufferStatusCompleted) return MFA_OK;
    // A command buffer reports its failures in MTLCommandBufferErrorDomain.
    NSError* error = commands.error;
    const BOOL out_of_memory = error != nil && error.code == MTLCommandBufferErrorOutOfMemory;
    return mfa_metal_error(out_of_memory ? MFA_ERROR_OUT_OF_MEMORY : MFA_ERROR_DEVICE, error,
                           "metal: the GPU failed running attention %s (command buffer status %lu)",
                           what, (unsigned long)commands.status);
}

mfa_status mfa_metal_run(LibMFAMetalContext* context, const mfa_problem* problem,
                         mfa_metal_planner planner, const char* what) {
    mfa_plan plan;
    __strong id<MTLComputePipelineState> pipelines[MFA_PLAN_MAX_PASSES];
    mfa_status status = plan_with_pipelines(context, problem, planner, &plan, pipelines);
    if (status != MFA_OK) return status;

    BOOL any_work = NO;
    for (uint32_t i = 0; i < plan.num_passes; i++) any_work = any_work || has_work(&plan.passes[i]);
    if (!any_work) return MFA_OK;

    id<MTLBuffer> scratch = nil;
    if (plan.scratch_bytes > 0) {
        // Written and read only by the GPU, within this call.
        scratch = [context.device newBufferWithLength:(NSUInteger)plan.scratch_bytes
                                              options:MTLResourceStorageModePrivate];
        if (scratch == nil) {
            return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                                 "metal: cannot allocate %lld bytes of scratch for attention %s",
                                 (long long)plan.scratch_bytes, what);
        }
    }
    __strong LibMFAOperandBuffer* operands[MFA_OPERAND_COUNT];
    status = bind_operands(context, problem, &plan, scratch, operands);
    if (status != MFA_OK) return status;

    id<MTLCommandBuffer> commands = [context.queue commandBuffer];
    id<MTLComputeCommandEncoder> encoder = [commands computeCommandEncoder];
    if (commands == nil || encoder == nil) {
        return mfa_set_error(MFA_ERROR_DEVICE,
                             "metal: %s gave no command buffer or encoder for "
                             "attention %s",
                             context.deviceName, what);
    }
    commands.label = [NSString stringWithCString:what encoding:NSUTF8StringEncoding];
    // One serial encoder: Metal orders dependent passes (delta written, then read) by itself.
    for (uint32_t i = 0; i < plan.num_passes; i++) {
        if (has_work(&plan.passes[i]))
            encode_pass(encoder, &plan.passes[i], pipelines[i], operands);
    }
    [encoder endEncoding];
    [commands commit];
    [commands waitUntilCompleted];

    status = command_buffer_status(commands, what);
    if (status != MFA_OK) return status;
    [context recordGPUStart:commands.GPUStartTime end:commands.GPUEndTime];
    for (int i = 0; i < MFA_OPERAND_COUNT; i++) [operands[i] copyResultsToCaller];
    return MFA_OK;
}
