/*
 * Type-check stub: the one CoreFoundation type the Metal host meets (GPU timestamps).
 * Only for `clang -fsyntax-only` on machines without an Apple SDK; never used to build.
 */
#ifndef MFA_TYPECHECK_COREFOUNDATION_H
#define MFA_TYPECHECK_COREFOUNDATION_H

typedef double CFTimeInterval;

#endif
