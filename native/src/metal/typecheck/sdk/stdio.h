/* Type-check stub: the Darwin libc declarations the Metal host (and its GPU test) use. Never
 * used to build. */
#ifndef MFA_TYPECHECK_STDIO_H
#define MFA_TYPECHECK_STDIO_H
#include <stdarg.h>
#include <stddef.h>
int printf(const char *restrict format, ...) __attribute__((format(printf, 1, 2)));
int snprintf(char *restrict str, size_t size, const char *restrict format, ...) __attribute__((format(printf, 3, 4)));
int vsnprintf(char *restrict str, size_t size, const char *restrict format, va_list ap) __attribute__((format(printf, 3, 0)));
#endif
