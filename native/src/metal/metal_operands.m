// Caller memory as MTLBuffers: wrapped without a copy where Metal allows, staged otherwise.
#import "metal_host.h"

#include <string.h>

#include "metal/metal_portable.h"

// The caller's view behind an operand, with the shape the problem gives it.
typedef struct operand_view {
    const mfa_view* view;
    int64_t shape[4];
    size_t element_size;
} operand_view;

static BOOL find_operand_view(const mfa_problem* p, mfa_operand operand, operand_view* out) {
    const size_t element = mfa_dtype_size(p->dtype);
    const int64_t query[4] = {p->batch, p->heads_q, p->seq_q, p->head_dim};
    const int64_t key[4] = {p->batch, p->heads_kv, p->seq_k, p->head_dim};
    const int64_t value[4] = {p->batch, p->heads_kv, p->seq_k, p->head_dim_v};
    const int64_t output[4] = {p->batch, p->heads_q, p->seq_q, p->head_dim_v};
    const int64_t rows[4] = {p->batch, p->heads_q, p->seq_q, 1};
    const int64_t* shape = NULL;
    switch (operand) {
        case MFA_OPERAND_Q:
            out->view = &p->q;
            shape = query;
            break;
        case MFA_OPERAND_K:
            out->view = &p->k;
            shape = key;
            break;
        case MFA_OPERAND_V:
            out->view = &p->v;
            shape = value;
            break;
        case MFA_OPERAND_O:
            out->view = &p->out;
            shape = output;
            break;
        case MFA_OPERAND_L:
            out->view = &p->lse;
            shape = rows;
            break;
        case MFA_OPERAND_DOUT:
            out->view = &p->dout;
            shape = output;
            break;
        case MFA_OPERAND_DQ:
            out->view = &p->dq;
            shape = query;
            break;
        case MFA_OPERAND_DK:
            out->view = &p->dk;
            shape = key;
            break;
        case MFA_OPERAND_DV:
            out->view = &p->dv;
            shape = value;
            break;
        default: return NO; // delta is the call's scratch, not caller memory
    }
    memcpy(out->shape, shape, sizeof out->shape);
    out->element_size = operand == MFA_OPERAND_L ? sizeof(float) : element;
    return YES;
}

@implementation LibMFAOperandBuffer {
    // A staged output's way back: the caller's view and where its binding starts.
    BOOL _copyBack;
    char* _callerData;
    int64_t _shape[4];
    int64_t _stride[4];
    size_t _elementSize;
    int64_t _byteOffset;
}

- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset {
    self = [super init];
    if (self != nil) {
        _buffer = buffer;
        _offset = offset;
    }
    return self;
}

- (instancetype)initStagingBuffer:(id<MTLBuffer>)buffer
                          forView:(const operand_view*)view
                          binding:(const mfa_buffer_binding*)binding {
    self = [super init];
    if (self != nil) {
        _buffer = buffer;
        _staged = YES;
        _copyBack = binding->writable != 0;
        _callerData = view->view->data;
        memcpy(_shape, view->shape, sizeof _shape);
        memcpy(_stride, view->view->stride, sizeof _stride);
        _elementSize = view->element_size;
        _byteOffset = binding->byte_offset;
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

LibMFAOperandBuffer* mfa_metal_bind_operand(LibMFAMetalContext* context, const mfa_problem* problem,
                                            const mfa_buffer_binding* binding,
                                            id<MTLBuffer> scratch, mfa_status* status) {
    if (binding->operand == MFA_OPERAND_DELTA) {
        if (scratch == nil) {
            *status = mfa_set_error(MFA_ERROR_INTERNAL,
                                    "metal: a pass binds delta but the plan has no scratch");
            return nil;
        }
        return [[LibMFAOperandBuffer alloc] initWithBuffer:scratch offset:0];
    }
    operand_view view;
    if (!find_operand_view(problem, binding->operand, &view)) {
        *status = mfa_set_error(MFA_ERROR_INTERNAL, "metal: the plan binds unknown operand %d",
                                (int)binding->operand);
        return nil;
    }
    // An optional output the caller did not ask for (lse), or an operand with no elements: the
    // kernel is planned not to touch it.
    if (view.view->data == NULL || binding->byte_length == 0) {
        return [[LibMFAOperandBuffer alloc] initWithBuffer:context.placeholder offset:0];
    }
    const char* name = mfa_operand_name(binding->operand);
    if (binding->byte_length < 0 || (uint64_t)binding->byte_length > context.maxBufferLength) {
        *status =
            mfa_set_error(MFA_ERROR_UNSUPPORTED,
                          "metal: operand %s spans %lld bytes; %s's largest buffer is %lu bytes",
                          name, (long long)binding->byte_length, context.deviceName,
                          (unsigned long)context.maxBufferLength);
        return nil;
    }
    char* first = view.view->data + binding->byte_offset;
    const size_t length = (size_t)binding->byte_length;

    // Zero copy: wrap the whole pages that enclose the operand (Metal wants a page-aligned
    // start and length) and bind at the operand's offset within them. GPU reads need naturally
    // aligned elements, so a misaligned view is staged instead.
    mfa_page_span pages;
    if ((uintptr_t)first % view.element_size == 0 &&
        mfa_metal_page_span((uintptr_t)first, length, mfa_page_size(), &pages) &&
        pages.length <= context.maxBufferLength) {
        id<MTLBuffer> wrapped =
            [context.device newBufferWithBytesNoCopy:(void*)pages.start
                                              length:pages.length
                                             options:MTLResourceStorageModeShared
                                         deallocator:nil];
        if (wrapped != nil)
            return [[LibMFAOperandBuffer alloc] initWithBuffer:wrapped offset:pages.offset];
    }

    // Staged: the binding's exact extent in a shared buffer. Outputs are copied in too, so the
    // kernel sees the same bytes either way.
    id<MTLBuffer> staging = [context.device newBufferWithLength:length
                                                        options:MTLResourceStorageModeShared];
    if (staging == nil) {
        *status =
            mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                          "metal: cannot allocate %zu bytes to stage operand %s", length, name);
        return nil;
    }
    memcpy(staging.contents, first, length);
    return [[LibMFAOperandBuffer alloc] initStagingBuffer:staging forView:&view binding:binding];
}
