/* Type-check stub: the Darwin libc declarations the Metal host uses. Never used to build. */
#ifndef MFA_TYPECHECK_STDLIB_H
#define MFA_TYPECHECK_STDLIB_H
char *getenv(const char *name);
#endif
