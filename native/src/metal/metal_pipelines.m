// The pipeline cache: one MTLComputePipelineState per kernel and function-constant values, and
// the runner's pipeline operation over it.
#import "metal_host.h"

#include <stdio.h>
#include <string.h>

#include "metal/metal_portable.h"

// Long enough for a kernel name and MFA_PLAN_MAX_CONSTANTS entries of "|index:type=value".
#define PIPELINE_KEY_CAPACITY 640

static MTLFunctionConstantValues* _Nullable constant_values(const mfa_pass_plan* pass,
                                                            mfa_status* status) {
    MTLFunctionConstantValues* values = [[MTLFunctionConstantValues alloc] init];
    for (uint32_t i = 0; i < pass->num_constants; i++) {
        const mfa_function_constant* constant = &pass->constants[i];
        switch (constant->type) {
            case MFA_CONSTANT_TYPE_BOOL: {
                const BOOL value = constant->value != 0; // MSL bool is one byte
                [values setConstantValue:&value type:MTLDataTypeBool atIndex:constant->index];
                break;
            }
            case MFA_CONSTANT_TYPE_UINT: {
                const uint32_t value = constant->value;
                [values setConstantValue:&value type:MTLDataTypeUInt atIndex:constant->index];
                break;
            }
            default:
                *status = mfa_set_error(MFA_ERROR_INTERNAL,
                                        "metal: %s: function constant %u has unknown type %u",
                                        pass->kernel_name, constant->index, constant->type);
                return nil;
        }
    }
    return values;
}

// One cached pipeline; the cache is a list of these, newest first, never shortened.
@interface LibMFAPipelineEntry : NSObject
@property (nonatomic, readonly) id<MTLComputePipelineState> pipeline;
@property (nonatomic, readonly, nullable) LibMFAPipelineEntry* next;
- (instancetype)initWithKey:(const char*)key
                   pipeline:(id<MTLComputePipelineState>)pipeline
                       next:(nullable LibMFAPipelineEntry*)next;
- (BOOL)hasKey:(const char*)key;
@end

@implementation LibMFAPipelineEntry {
    char _key[PIPELINE_KEY_CAPACITY];
}

- (instancetype)initWithKey:(const char*)key
                   pipeline:(id<MTLComputePipelineState>)pipeline
                       next:(LibMFAPipelineEntry*)next {
    self = [super init];
    if (self != nil) {
        snprintf(_key, sizeof _key, "%s", key);
        _pipeline = pipeline;
        _next = next;
    }
    return self;
}

- (BOOL)hasKey:(const char*)key {
    return strcmp(_key, key) == 0;
}

@end

@implementation LibMFAPipelineCache {
    id<MTLDevice> _device;
    LibMFAKernelLibrary* _kernels;
    NSLock* _lock; // guards _head
    LibMFAPipelineEntry* _head;
}

- (instancetype)initWithDevice:(id<MTLDevice>)device kernels:(LibMFAKernelLibrary*)kernels {
    self = [super init];
    if (self != nil) {
        _device = device;
        _kernels = kernels;
        _lock = [[NSLock alloc] init];
    }
    return self;
}

// Caller holds _lock.
- (nullable id<MTLComputePipelineState>)findLocked:(const char*)key {
    for (LibMFAPipelineEntry* entry = _head; entry != nil; entry = entry.next) {
        if ([entry hasKey:key]) return entry.pipeline;
    }
    return nil;
}

- (id<MTLComputePipelineState>)pipelineForPass:(const mfa_pass_plan*)pass
                                        status:(mfa_status*)status {
    char key[PIPELINE_KEY_CAPACITY];
    if (!mfa_metal_pipeline_key(pass, key, sizeof key)) {
        *status =
            mfa_set_error(MFA_ERROR_INTERNAL, "metal: the pipeline key of %s exceeds %d bytes",
                          pass->kernel_name, PIPELINE_KEY_CAPACITY);
        return nil;
    }
    [_lock lock];
    id<MTLComputePipelineState> cached = [self findLocked:key];
    [_lock unlock];
    if (cached != nil) return cached;

    // Compile without the lock: a first compile takes milliseconds to seconds, and other
    // threads should keep using the pipelines already cached meanwhile.
    id<MTLComputePipelineState> compiled = [self compilePass:pass status:status];
    if (compiled == nil) return nil;

    [_lock lock];
    // A thread that raced us to the same key has already inserted it: keep that one, so that
    // every caller shares a single pipeline per key.
    id<MTLComputePipelineState> winner = [self findLocked:key];
    if (winner == nil) {
        _head = [[LibMFAPipelineEntry alloc] initWithKey:key pipeline:compiled next:_head];
        winner = compiled;
    }
    [_lock unlock];
    return winner;
}

- (nullable id<MTLComputePipelineState>)compilePass:(const mfa_pass_plan*)pass
                                             status:(mfa_status*)status {
    MTLFunctionConstantValues* values = constant_values(pass, status);
    if (values == nil) return nil;
    id<MTLFunction> function = [_kernels newFunctionNamed:pass->kernel_name
                                                constants:values
                                                   status:status];
    if (function == nil) return nil;
    NSError* error = nil;
    id<MTLComputePipelineState> pipeline = [_device newComputePipelineStateWithFunction:function
                                                                                  error:&error];
    if (pipeline == nil) {
        *status =
            mfa_metal_error(MFA_ERROR_INTERNAL, error,
                            "metal: building the compute pipeline of %s failed", pass->kernel_name);
        return nil;
    }
    // simdgroup_matrix tiles and the kernels' lane arithmetic assume 32-lane SIMD-groups.
    if (pipeline.threadExecutionWidth != 32 || pipeline.maxTotalThreadsPerThreadgroup == 0) {
        *status = mfa_set_error(MFA_ERROR_UNSUPPORTED,
                                "metal: pipeline %s reports SIMD width %lu and at most %lu threads "
                                "per threadgroup; the kernels need width 32",
                                pass->kernel_name, (unsigned long)pipeline.threadExecutionWidth,
                                (unsigned long)pipeline.maxTotalThreadsPerThreadgroup);
        return nil;
    }
    return pipeline;
}

@end

mfa_status mfa_metal_pipeline(void* device, const mfa_pass_plan* pass, mfa_gpu_pipeline* out) {
    LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)device;
    mfa_status status = MFA_OK;
    id<MTLComputePipelineState> pipeline = [context.pipelines pipelineForPass:pass status:&status];
    if (pipeline == nil) return status;
    // Borrowed: the cache keeps every pipeline for the context's lifetime.
    out->pipeline = (__bridge void*)pipeline;
    const NSUInteger threads = pipeline.maxTotalThreadsPerThreadgroup;
    out->max_total_threads_per_threadgroup = threads < UINT32_MAX ? (uint32_t)threads : UINT32_MAX;
    out->static_threadgroup_memory_length = pipeline.staticThreadgroupMemoryLength;
    return MFA_OK;
}
