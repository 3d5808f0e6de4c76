/* Type-check stub: the Darwin libc declarations the Metal host uses. Never used to build. */
#ifndef MFA_TYPECHECK_STRING_H
#define MFA_TYPECHECK_STRING_H
#include <stddef.h>
void *memcpy(void *restrict dst, const void *restrict src, size_t n);
int strcmp(const char *s1, const char *s2);
char *strrchr(const char *s, int c);
#endif
