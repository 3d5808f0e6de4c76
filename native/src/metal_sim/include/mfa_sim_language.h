// The keywords MSL adds to C++, for compiling .metal files as C++ in the simulator. Every kernel
// translation unit is preprocessed with this file first (MetalSimKernels.cmake), as the Metal
// compiler knows these words without any include.
//
// `device`, `constant`, `threadgroup`, `thread` and `kernel` expand to marker identifiers that
// metal_sim_codegen.py rewrites after preprocessing; it also reads and strips the attributes
// that carry Metal meaning ([[buffer(i)]], [[threadgroup(i)]], built-ins, function constants).
// The executable build erases address spaces: with clang's address_space attribute a struct in
// device or constant memory could be neither copied nor converted (C++, unlike OpenCL C++, has
// no generic address space for `this`), and AddressSanitizer does not instrument accesses
// through non-zero address spaces. A second, syntax-only pass (MFA_SIM_ADDRESS_SPACE_CHECK)
// gives every device/constant/threadgroup pointer its clang address space, so mixing them up,
// or passing one where a thread pointer is expected, fails the build as it does on Metal.
// References, objects and bfloat pointers stay generic in that pass.
#ifndef MFA_SIM_LANGUAGE_H
#define MFA_SIM_LANGUAGE_H

#define device                             __mfa_sim_device__
#define constant                           __mfa_sim_constant__
#define threadgroup                        __mfa_sim_threadgroup__
#define thread                             __mfa_sim_thread__
#define kernel                             __mfa_sim_kernel__
#define is_function_constant_defined(name) (__mfa_sim_fc_defined_##name)
#define METAL_FUNC                         inline __attribute__((always_inline))

#endif // MFA_SIM_LANGUAGE_H
