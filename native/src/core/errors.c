/* Per-thread error messages and status names. */
#include <stdarg.h>
#include <stdio.h>

#include "core/backend.h"
#include "core/export.h"

/* One message per thread: concurrent callers never see each other's errors. */
static _Thread_local char last_error_message[1024];

MFA_EXPORT const char* mfa_status_string(mfa_status status) {
    switch (status) {
        case MFA_OK: return "ok";
        case MFA_ERROR_INVALID_ARGUMENT: return "invalid argument";
        case MFA_ERROR_UNSUPPORTED: return "unsupported";
        case MFA_ERROR_BACKEND_UNAVAILABLE: return "backend unavailable";
        case MFA_ERROR_OUT_OF_MEMORY: return "out of memory";
        case MFA_ERROR_SIZE_OVERFLOW: return "size overflow";
        case MFA_ERROR_DEVICE: return "device error";
        case MFA_ERROR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

MFA_EXPORT const char* mfa_last_error(void) { return last_error_message; }

mfa_status mfa_set_error(mfa_status status, const char* format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(last_error_message, sizeof last_error_message, format, args);
    va_end(args);
    return status;
}
