// What MSL forbids in kernels, as compile errors. Every kernel translation unit is preprocessed
// with this file right after the language keywords and the binding glue (MetalSimKernels.cmake),
// before its first line: from there on these identifiers are errors in the kernel and in
// everything it includes, the other compatibility headers included (they use none of them).
// The rest of Metal's restrictions are checked elsewhere: size_t and ptrdiff_t kernel arguments
// by metal_sim_codegen.py, recursion and function pointers by metal_sim_check_ir.py, the C++
// standard library by preprocessing without any system header.
#ifndef MFA_SIM_RESTRICTIONS_H
#define MFA_SIM_RESTRICTIONS_H

#pragma GCC poison double malloc calloc realloc free new typeid dynamic_cast throw try catch
#pragma GCC poison virtual thread_local std printf fprintf puts asm __asm __asm__ setjmp longjmp

#endif // MFA_SIM_RESTRICTIONS_H
