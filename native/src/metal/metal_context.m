// Device selection, limits, the command queue and GPU timing of one Metal context, and the
// context as the plan runner's device.
#import "metal_host.h"

#include <stdio.h>

id<MTLDevice> mfa_metal_select_device(void) {
    NSArray<id<MTLDevice>>* devices = MTLCopyAllDevices();
    for (id<MTLDevice> device in devices) {
        if ([device supportsFamily:MTLGPUFamilyApple7]) return device;
    }
    // Headless, sandboxed and virtualised sessions can list no devices yet still offer a
    // default one.
    id<MTLDevice> fallback = MTLCreateSystemDefaultDevice();
    if (fallback != nil && [fallback supportsFamily:MTLGPUFamilyApple7]) return fallback;
    return nil;
}

// Newer families than Apple9 run the Apple9 configuration, the planner's newest tables.
static mfa_gpu_family family_of(id<MTLDevice> device) {
    if ([device supportsFamily:MTLGPUFamilyApple9]) return MFA_GPU_FAMILY_APPLE9;
    if ([device supportsFamily:MTLGPUFamilyApple8]) return MFA_GPU_FAMILY_APPLE8;
    return MFA_GPU_FAMILY_APPLE7;
}

@implementation LibMFAMetalContext {
    char _deviceNameStorage[256];
    id<MTLBuffer> _placeholder; // kept alive for _gpuDeviceStorage.placeholder
    mfa_gpu_device _gpuDeviceStorage;
    NSLock* _timingLock; // guards the two fields below
    BOOL _hasGPUTime;
    double _lastGPUTime;
}

- (instancetype)initWithDevice:(id<MTLDevice>)device
                         queue:(id<MTLCommandQueue>)queue
                   placeholder:(id<MTLBuffer>)placeholder
                       kernels:(LibMFAKernelLibrary*)kernels {
    self = [super init];
    if (self != nil) {
        _device = device;
        _queue = queue;
        _placeholder = placeholder;
        _family = family_of(device);
        const char* name = device.name.UTF8String;
        snprintf(_deviceNameStorage, sizeof _deviceNameStorage, "%s",
                 name != NULL ? name : "Apple GPU");
        _maxBufferLength = device.maxBufferLength;
        _pipelines = [[LibMFAPipelineCache alloc] initWithDevice:device kernels:kernels];
        _timingLock = [[NSLock alloc] init];

        mfa_gpu_device* gpu = &_gpuDeviceStorage;
        gpu->ops = &mfa_metal_device_ops;
        gpu->self = (__bridge void*)self; // the context owns the device, not the reverse
        gpu->backend = "metal";
        gpu->name = _deviceNameStorage;
        gpu->family = _family;
        // maxThreadsPerThreadgroup bounds each dimension; the kernels' threadgroups are 1-D.
        const NSUInteger threads = device.maxThreadsPerThreadgroup.width;
        gpu->max_threads_per_threadgroup = threads < 1024 ? (uint32_t)threads : 1024;
        gpu->max_threadgroup_memory_length = device.maxThreadgroupMemoryLength;
        gpu->max_buffer_length = device.maxBufferLength;
        gpu->placeholder.buffer = (__bridge void*)placeholder;
        gpu->placeholder.offset = 0;
        gpu->placeholder.length = placeholder.length;
        gpu->placeholder.owner = NULL;
    }
    return self;
}

- (const mfa_gpu_device*)gpuDevice {
    return &_gpuDeviceStorage;
}

- (const char*)deviceName {
    return _deviceNameStorage;
}

- (void)recordGPUStart:(CFTimeInterval)start end:(CFTimeInterval)end {
    [_timingLock lock];
    _hasGPUTime = YES;
    _lastGPUTime = end - start;
    [_timingLock unlock];
}

- (BOOL)lastGPUTime:(double*)seconds {
    [_timingLock lock];
    const BOOL has = _hasGPUTime;
    if (has) *seconds = _lastGPUTime; // a failed call writes nothing
    [_timingLock unlock];
    return has;
}

@end

mfa_status mfa_metal_context_create(LibMFAMetalContext* __autoreleasing* out) {
    *out = nil;
    id<MTLDevice> device = mfa_metal_select_device();
    if (device == nil) {
        return mfa_set_error(MFA_ERROR_BACKEND_UNAVAILABLE,
                             "metal: no Apple7 or later GPU (M1 or newer) was found");
    }
    const char* name = device.name.UTF8String;
    if (device.maxThreadgroupMemoryLength < MFA_PLAN_THREADGROUP_MEMORY_LIMIT) {
        return mfa_set_error(MFA_ERROR_UNSUPPORTED,
                             "metal: %s offers %lu bytes of threadgroup memory; the kernels are "
                             "planned for %d",
                             name != NULL ? name : "the GPU",
                             (unsigned long)device.maxThreadgroupMemoryLength,
                             MFA_PLAN_THREADGROUP_MEMORY_LIMIT);
    }
    // One queue per context: command buffers from many threads may share it, and each call
    // encodes its own command buffer.
    id<MTLCommandQueue> queue = [device newCommandQueue];
    if (queue == nil) {
        return mfa_set_error(MFA_ERROR_DEVICE, "metal: %s refused to create a command queue",
                             name != NULL ? name : "the GPU");
    }
    // Bound where a pass has nothing to bind: Metal wants every argument index bound.
    id<MTLBuffer> placeholder = [device newBufferWithLength:16
                                                    options:MTLResourceStorageModeShared];
    if (placeholder == nil) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal: cannot allocate a 16-byte buffer");
    }
    mfa_status status = MFA_OK;
    LibMFAKernelLibrary* kernels = [[LibMFAKernelLibrary alloc] initWithDevice:device
                                                                        status:&status];
    if (kernels == nil) return status;
    LibMFAMetalContext* context = [[LibMFAMetalContext alloc] initWithDevice:device
                                                                       queue:queue
                                                                 placeholder:placeholder
                                                                     kernels:kernels];
    if (context == nil) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal: cannot allocate the context");
    }
    *out = context;
    return MFA_OK;
}
