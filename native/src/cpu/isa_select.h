#ifndef MFA_CPU_ISA_SELECT_H
#define MFA_CPU_ISA_SELECT_H

#include "cpu/kernels.h"

/* The fastest kernel build this CPU runs, or the one MFA_CPU_ISA names. Sets the error (via
 * mfa_set_error) and returns its status if MFA_CPU_ISA names a build that cannot run here. */
mfa_status mfa_cpu_select_kernels(const mfa_cpu_kernels** kernels);

#endif /* MFA_CPU_ISA_SELECT_H */
