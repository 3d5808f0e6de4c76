/* Page-aligned allocations, so the Metal backend can wrap caller memory without copying. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/export.h"

MFA_EXPORT size_t mfa_page_size(void) {
    const long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

MFA_EXPORT void* mfa_alloc(size_t bytes) {
    const size_t page = mfa_page_size();
    /* Whole pages: a Metal no-copy buffer must cover a page-aligned length. */
    const size_t pages = bytes / page + (bytes % page != 0) + (bytes == 0);
    size_t length;
    if (__builtin_mul_overflow(pages, page, &length)) {
        mfa_set_error(MFA_ERROR_SIZE_OVERFLOW,
                      "mfa_alloc: %zu bytes rounded up to whole %zu-byte pages overflows", bytes,
                      page);
        return NULL;
    }
    void* ptr = NULL;
    if (posix_memalign(&ptr, page, length) != 0) {
        mfa_set_error(MFA_ERROR_OUT_OF_MEMORY, "mfa_alloc: cannot allocate %zu bytes", length);
        return NULL;
    }
    return ptr;
}

MFA_EXPORT void mfa_free(void* ptr) { free(ptr); }
