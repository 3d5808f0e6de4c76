/*
 * embedded_sources.h - the kernel sources built into libmfa, for run-time compilation when
 * mfa.metallib is missing, stale or unloadable.
 *
 * The table is generated at build time by embed_sources.cmake from metal/ *.metal, each file
 * with its #include "..." directives resolved, so every entry compiles on its own with
 * newLibraryWithSource:options:error:.
 *
 * The same script writes a one-line kernel, linked into mfa.metallib, whose name carries a
 * digest of these sources: a metallib that lacks mfa_metal_source_stamp was built from other
 * kernel sources (an older install, a stale MFA_METALLIB) and is not used.
 */
#ifndef MFA_METAL_EMBEDDED_SOURCES_H
#define MFA_METAL_EMBEDDED_SOURCES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mfa_metal_embedded_source {
    const char* name; /* the .metal file it came from, for messages */
    const char* text; /* NUL-terminated Metal Shading Language */
} mfa_metal_embedded_source;

extern const mfa_metal_embedded_source mfa_metal_embedded_sources[];
extern const size_t mfa_metal_embedded_source_count;
extern const char mfa_metal_source_stamp[]; /* "kernel_source_stamp_<sha256 prefix>" */

#ifdef __cplusplus
}
#endif

#endif /* MFA_METAL_EMBEDDED_SOURCES_H */
