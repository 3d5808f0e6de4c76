/* Type-check stub: the Darwin libc declarations the Metal host uses. Never used to build. */
#ifndef MFA_TYPECHECK_DLFCN_H
#define MFA_TYPECHECK_DLFCN_H
typedef struct dl_info {
    const char *dli_fname;
    void *dli_fbase;
    const char *dli_sname;
    void *dli_saddr;
} Dl_info;
int dladdr(const void *addr, Dl_info *info);
#endif
