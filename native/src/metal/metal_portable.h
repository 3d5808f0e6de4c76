/*
 * metal_portable.h - the Metal host's arithmetic that needs no Metal: which pages wrap an
 * operand, how a staged output goes back to a strided view, how a pass names its pipeline.
 *
 * Plain C, compiled into libmfa with the Objective-C host on Apple platforms and into the
 * host's Linux tests (tests/metal_host/portable_test.c), so the parts most prone to
 * off-by-one and sign errors run somewhere every day.
 */
#ifndef MFA_METAL_PORTABLE_H
#define MFA_METAL_PORTABLE_H

#include <stddef.h>
#include <stdint.h>

#include "planner/planner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The whole pages enclosing [first, first + length): Metal wraps memory without a copy only
 * from a page-aligned start for a whole number of pages. `offset` is first - start. */
typedef struct mfa_page_span {
    uintptr_t start;
    size_t length;
    size_t offset;
} mfa_page_span;

/* Fills *span; 0 when the rounded span does not fit in the address space (else 1). page is a
 * power of two (mfa_page_size()). */
int mfa_metal_page_span(uintptr_t first, size_t length, size_t page, mfa_page_span* span);

/* Copies the elements of a strided view, and nothing between them, from `staged` back to
 * `caller`. Element (b, h, s, d) lives at byte elem*(b*stride[0] + ... + d*stride[3]) from
 * `caller`, and at that minus byte_offset in `staged` (byte_offset <= 0 with negative strides:
 * staged holds the view's extent from its lowest byte). stride[3] is ignored when shape[3]
 * is 1, as for lse. */
void mfa_metal_copy_view_back(char* caller, const char* staged, int64_t byte_offset,
                              const int64_t shape[4], const int64_t stride[4], size_t element_size);

/* Writes "<kernel>|<index>:<type>=<value>|..." (the constants in plan order) to key; 0 when it
 * does not fit in size bytes. Equal configurations give equal keys, different ones different
 * keys. */
int mfa_metal_pipeline_key(const mfa_pass_plan* pass, char* key, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* MFA_METAL_PORTABLE_H */
