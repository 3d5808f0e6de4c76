// The runner's memory operations on Metal: caller memory as MTLBuffers, wrapped without a copy
// where Metal allows and staged otherwise, and the scratch.
#import "metal_host.h"

#include <string.h>

#include "metal/metal_portable.h"

// What a call holds for one operand until it finishes: `buffer`, plus for a staged output the
// way back to the caller's view.
@interface LibMFAOperandBuffer : NSObject
@property (nonatomic, readonly) id<MTLBuffer> buffer;
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer;
- (instancetype)initStagingBuffer:(id<MTLBuffer>)buffer forRange:(const mfa_host_range*)range;
// Copy a staged output's elements (and nothing between them) back to the caller's view.
- (void)copyResultsToCaller;
@end

@implementation LibMFAOperandBuffer {
    BOOL _copyBack;
    char* _callerData;
    int64_t _shape[4];
    int64_t _stride[4];
    size_t _elementSize;
    int64_t _byteOffset; // from the caller's element (0,0,0,0) to the first staged byte
}

- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer {
    self = [super init];
    if (self != nil) _buffer = buffer;
    return self;
}

- (instancetype)initStagingBuffer:(id<MTLBuffer>)buffer forRange:(const mfa_host_range*)range {
    self = [super init];
    if (self != nil) {
        _buffer = buffer;
        _copyBack = range->writable;
        _callerData = range->data;
        memcpy(_shape, range->shape, sizeof _shape);
        memcpy(_stride, range->stride, sizeof _stride);
        _elementSize = range->element_size;
        _byteOffset = (int64_t)(range->first - range->data);
    }
    return self;
}

- (void)copyResultsToCaller {
    // Element by element: the bytes between a strided view's elements may belong to someone
    // else and must not be overwritten.
    if (_copyBack) {
        mfa_metal_copy_view_back(_callerData, (const char*)_buffer.contents, _byteOffset, _shape,
                                 _stride, _elementSize);
    }
}

@end

// Hands `operand` to the call, which gives it back through mfa_metal_release.
static mfa_status hand_out(LibMFAOperandBuffer* _Nullable operand, NSUInteger offset,
                           uint64_t length, mfa_gpu_memory* out) {
    if (operand == nil) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "metal: cannot allocate an operand record");
    }
    out->buffer = (__bridge void*)operand.buffer;
    out->offset = offset;
    out->length = length;
    out->owner = (__bridge_retained void*)operand;
    return MFA_OK;
}

mfa_status mfa_metal_wrap_host(void* device, const mfa_host_range* range, mfa_gpu_memory* out) {
    LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)device;
    const size_t length = (size_t)range->length; // within maxBufferLength: the runner checked

    // Zero copy: wrap the whole pages that enclose the operand (Metal wants a page-aligned
    // start and length) and bind at the operand's offset within them. GPU reads need naturally
    // aligned elements, so a misaligned view is staged instead.
    mfa_page_span pages;
    if ((uintptr_t)range->first % range->element_size == 0 &&
        mfa_metal_page_span((uintptr_t)range->first, length, mfa_page_size(), &pages) &&
        pages.length <= context.maxBufferLength) {
        id<MTLBuffer> wrapped =
            [context.device newBufferWithBytesNoCopy:(void*)pages.start
                                              length:pages.length
                                             options:MTLResourceStorageModeShared
                                         deallocator:nil];
        if (wrapped != nil) {
            return hand_out([[LibMFAOperandBuffer alloc] initWithBuffer:wrapped], pages.offset,
                            range->length, out);
        }
    }

    // Staged: the binding's exact extent in a shared buffer. Outputs are copied in too, so the
    // kernel sees the same bytes either way.
    id<MTLBuffer> staging = [context.device newBufferWithLength:length
                                                        options:MTLResourceStorageModeShared];
    if (staging == nil) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                             "metal: cannot allocate %zu bytes to stage operand %s", length,
                             mfa_operand_name(range->operand));
    }
    memcpy(staging.contents, range->first, length);
    return hand_out([[LibMFAOperandBuffer alloc] initStagingBuffer:staging forRange:range], 0,
                    range->length, out);
}

mfa_status mfa_metal_scratch(void* device, uint64_t bytes, mfa_gpu_memory* out) {
    LibMFAMetalContext* context = (__bridge LibMFAMetalContext*)device;
    // Written and read only by the GPU, within the call.
    id<MTLBuffer> scratch = [context.device newBufferWithLength:(NSUInteger)bytes
                                                        options:MTLResourceStorageModePrivate];
    if (scratch == nil) {
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                             "metal: cannot allocate %llu bytes of scratch",
                             (unsigned long long)bytes);
    }
    return hand_out([[LibMFAOperandBuffer alloc] initWithBuffer:scratch], 0, bytes, out);
}

void mfa_metal_release(void* device, void* owner, bool completed) {
    (void)device;
    // Takes back the reference hand_out gave the call; ARC releases it at the end of the scope.
    LibMFAOperandBuffer* operand = (__bridge_transfer LibMFAOperandBuffer*)owner;
    if (completed) [operand copyResultsToCaller];
}
