// libmfa is built with hidden visibility; only the definitions of the functions declared in
// mfa.h carry this marker, so internal symbols never leak into the ABI.
#ifndef MFA_CORE_EXPORT_H
#define MFA_CORE_EXPORT_H

#if defined(_WIN32)
#define MFA_EXPORT __declspec(dllexport)
#else
#define MFA_EXPORT __attribute__((visibility("default")))
#endif

#endif
