// The runner's command operations on Metal: a call's passes encoded into one compute encoder of
// a command buffer, either one from the context's queue that is committed, waited for and
// checked here (the synchronous calls), or the caller's (mfa_attention_encode), which the caller
// commits; the call is then finished by the command buffer's completed handler. And caller
// MTLBuffers bound in place.
#import "metal_host.h"

_Static_assert(sizeof(mfa_kernel_params) <= 4096, "setBytes carries at most 4 KB");

// A call's commands: one command buffer and one serial compute encoder, in which Metal orders
// dependent passes (delta written, then read) by itself.
@interface LibMFACommands : NSObject
@property (nonatomic, readonly) id<MTLCommandBuffer> buffer;
@property (nonatomic, readonly) id<MTLComputeCommandEncoder> encoder;
- (instancetype)initWithBuffer:(id<MTLCommandBuffer>)buffer
                       encoder:(id<MTLComputeCommandEncoder>)encoder;
@end

@implementation LibMFACommands
- (instancetype)initWithBuffer:(id<MTLCommandBuffer>)buffer
                       encoder:(id<MTLComputeCommandEncoder>)encoder {
    self = [super init];
    if (self != nil) {
        _buffer = buffer;
        _encoder = encoder;
    }
    return self;
}
@end

static mfa_status metal_begin(void* device, const char* label, void** commands) {
    LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)device;
    id<MTLCommandBuffer> buffer = [context.queue commandBuffer];
    id<MTLComputeCommandEncoder> encoder = [buffer computeCommandEncoder];
    if (buffer == nil || encoder == nil) {
        return mfa_set_error(MFA_ERROR_DEVICE,
                             "metal: %s gave no command buffer or encoder for attention %s",
                             context.deviceName, label);
    }
    buffer.label = [NSString stringWithCString:label encoding:NSUTF8StringEncoding];
    LibMFACommands* list = [[LibMFACommands alloc] initWithBuffer:buffer encoder:encoder];
    if (list == nil) {
        [encoder endEncoding];
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal: cannot allocate a command list");
    }
    *commands = (__bridge_retained void*)list;
    return MFA_OK;
}

static void metal_encode(void* device, void* commands, const mfa_gpu_dispatch* dispatch) {
    (void)device;
    id<MTLComputeCommandEncoder> encoder = ((__bridge LibMFACommands*)commands).encoder;
    const mfa_pass_plan* pass = dispatch->pass;
    [encoder setComputePipelineState:(__bridge id<MTLComputePipelineState>)dispatch->pipeline];
    for (uint32_t i = 0; i < dispatch->num_buffers; i++) {
        const mfa_gpu_memory* memory = dispatch->buffers[i].memory;
        [encoder setBuffer:(__bridge id<MTLBuffer>)memory->buffer
                    offset:(NSUInteger)memory->offset
                   atIndex:dispatch->buffers[i].index];
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

static mfa_status metal_commit_and_wait(void* device, void* commands, const char* what) {
    LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)device;
    // Takes back the reference metal_begin handed out; ARC releases it at the end of the scope.
    LibMFACommands* list = (__bridge_transfer LibMFACommands*)commands;
    id<MTLCommandBuffer> buffer = list.buffer;
    [list.encoder endEncoding];
    [buffer commit];
    [buffer waitUntilCompleted];
    if (buffer.status != MTLCommandBufferStatusCompleted) {
        // A command buffer reports its failures in MTLCommandBufferErrorDomain.
        NSError* error = buffer.error;
        const BOOL out_of_memory = error != nil && error.code == MTLCommandBufferErrorOutOfMemory;
        return mfa_metal_error(
            out_of_memory ? MFA_ERROR_OUT_OF_MEMORY : MFA_ERROR_DEVICE, error,
            "metal: the GPU failed running attention %s (command buffer status %lu)", what,
            (unsigned long)buffer.status);
    }
    [context recordGPUStart:buffer.GPUStartTime end:buffer.GPUEndTime];
    return MFA_OK;
}

// A caller's MTLBuffer is bound as it is: the runner checks the bytes each binding reaches
// against its length. Not retained: the caller keeps it alive until the work completes.
static mfa_status metal_device_buffer(void* device, void* buffer, mfa_gpu_memory* out) {
    (void)device;
    id<MTLBuffer> mtl_buffer = (__bridge id<MTLBuffer>)buffer;
    out->buffer = buffer;
    out->offset = 0;
    out->length = mtl_buffer.length;
    out->owner = NULL;
    return MFA_OK;
}

// A compute encoder of the caller's command buffer. Metal gives none (nil) for a command buffer
// that was already committed or has another encoder open.
static mfa_status metal_begin_encode(void* device, void* command_buffer, const char* label,
                                     void** commands) {
    LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)device;
    id<MTLCommandBuffer> buffer = (__bridge id<MTLCommandBuffer>)command_buffer;
    const mfa_status status =
        mfa_metal_require_not_enqueued(buffer, "mfa_attention_encode", "; encode into a new one");
    if (status != MFA_OK) return status;
    id<MTLComputeCommandEncoder> encoder = [buffer computeCommandEncoder];
    if (encoder == nil) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal: %s gave no compute encoder for attention %s: the command "
                             "buffer may have another encoder open",
                             context.deviceName, label);
    }
    LibMFACommands* list = [[LibMFACommands alloc] initWithBuffer:buffer encoder:encoder];
    if (list == nil) {
        [encoder endEncoding];
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal: cannot allocate a command list");
    }
    *commands = (__bridge_retained void*)list;
    return MFA_OK;
}

// Ends the call's encoder and finishes the call once the caller's command buffer has completed
// (completed or failed: Metal calls completed handlers either way). A command buffer released
// without being committed never calls it: mfa.h asks callers to commit what they encoded into.
static mfa_status metal_end_encode(void* device, void* commands,
                                   void (*completed)(void* arg, bool ran), void* arg) {
    LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)device;
    LibMFACommands* list = (__bridge_transfer LibMFACommands*)commands;
    [list.encoder endEncoding];
    [list.buffer addCompletedHandler:^(id<MTLCommandBuffer> done) {
        const bool ran = done.status == MTLCommandBufferStatusCompleted;
        if (ran) [context recordGPUStart:done.GPUStartTime end:done.GPUEndTime];
        completed(arg, ran);
    }];
    return MFA_OK;
}

const mfa_gpu_device_ops mfa_metal_device_ops = {
    mfa_metal_pipeline, mfa_metal_wrap_host, mfa_metal_scratch,     mfa_metal_release,
    metal_encode,       metal_begin,         metal_commit_and_wait, metal_device_buffer,
    metal_begin_encode, metal_end_encode,
};
