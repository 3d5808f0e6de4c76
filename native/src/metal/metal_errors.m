// Metal failures as an mfa_status and a message for mfa_last_error().
#import "metal_host.h"

#include <stdarg.h>
#include <stdio.h>

mfa_status mfa_metal_error(mfa_status status, NSError* error, const char* format, ...) {
    char what[768];
    va_list args;
    va_start(args, format);
    vsnprintf(what, sizeof what, format, args);
    va_end(args);
    if (error == nil) return mfa_set_error(status, "%s (Metal gave no error detail)", what);
    // The description's UTF-8 buffer belongs to an autoreleased string; mfa_set_error copies it
    // before the caller's @autoreleasepool drains.
    const char* description = error.localizedDescription.UTF8String;
    const char* domain = error.domain.UTF8String;
    return mfa_set_error(status, "%s: %s (%s %ld)", what, description ? description : "?",
                         domain ? domain : "?", (long)error.code);
}

mfa_status mfa_metal_require_not_enqueued(id<MTLCommandBuffer> buffer, const char* call,
                                          const char* advice) {
    if (buffer.status == MTLCommandBufferStatusNotEnqueued) return MFA_OK;
    return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                         "metal: %s: the command buffer was already committed (status %lu)%s", call,
                         (unsigned long)buffer.status, advice);
}
