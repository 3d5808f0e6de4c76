// What the argument-binding glue of metal_sim_codegen.py calls: each kernel parameter is bound
// from the dispatch's buffers, threadgroup memory or the thread's built-ins, and each function
// constant from the dispatch's values, with the checks Metal makes at pipeline creation or that a
// GPU would fault on. Every kernel translation unit is preprocessed with this file after the
// language keywords (MetalSimKernels.cmake).
#ifndef MFA_SIM_GLUE_H
#define MFA_SIM_GLUE_H

#include <metal_type_traits>

#include "mfa_sim_abi.h"

namespace mfa_sim_glue {

template <class P>
constexpr unsigned long alignment_of() {
    if constexpr (metal::is_same_v<metal::remove_cv_t<P>, void>)
        return 1;
    else
        return alignof(P);
}

// A [[buffer(i)]] pointer parameter.
struct BufferPointer {
    char* data;
    const char* misaligned;
    // P may carry an address space in the type-checking pass; a C-style cast may add it.
    template <class P>
    operator P*() const {
        if (reinterpret_cast<uintptr_t>(data) % alignment_of<P>() != 0) mfa_sim_fail(misaligned);
        return (P*)data;
    }
};

// A [[buffer(i)]] reference parameter: the binding must hold a whole P.
struct BufferReference {
    char* data;
    unsigned long long size;
    const char* too_small;
    const char* misaligned;
    template <class P>
    operator P&() const {
        if (size < sizeof(P)) mfa_sim_fail(too_small);
        if (reinterpret_cast<uintptr_t>(data) % alignof(P) != 0) mfa_sim_fail(misaligned);
        return *reinterpret_cast<P*>(data);
    }
};

inline BufferPointer buffer_pointer(const mfa_sim_abi::ArgumentTable& arguments, int index,
                                    bool required, const char* unbound, const char* misaligned) {
    char* data = arguments.buffers[index].data;
    if (!data && required) mfa_sim_fail(unbound);
    return {data, misaligned};
}

inline BufferReference buffer_reference(const mfa_sim_abi::ArgumentTable& arguments, int index,
                                        const char* unbound, const char* too_small,
                                        const char* misaligned) {
    const mfa_sim_abi::BufferView& view = arguments.buffers[index];
    if (!view.data) mfa_sim_fail(unbound);
    return {view.data, view.size, too_small, misaligned};
}

inline BufferPointer threadgroup_pointer(const mfa_sim_abi::ArgumentTable& arguments, int index,
                                         const char* unbound, const char* misaligned) {
    char* data = arguments.threadgroup_memory[index];
    if (!data) mfa_sim_fail(unbound);
    return {data, misaligned};
}

// A built-in: converts to the parameter's scalar or vector type, as Metal allows.
struct Builtin {
    const unsigned* components;
    int count;
    template <class P>
    operator P() const {
        typedef typename metal::vec_traits<P>::element E;
        static_assert(metal::is_integral_v<E>, "built-in kernel arguments have integer types");
        if constexpr (metal::vec_traits<P>::size == 1) {
            return static_cast<P>(components[0]);
        } else {
            static_assert(metal::vec_traits<P>::size <= 3, "built-ins have at most 3 components");
            P out;
            for (int i = 0; i < metal::vec_traits<P>::size; ++i)
                out[i] = static_cast<E>(components[i]);
            return out;
        }
    }
};

inline Builtin builtin(const unsigned (&components)[3]) { return {components, 3}; }
inline Builtin builtin(const unsigned& component) { return {&component, 1}; }

// The MTLDataType a function constant of type T is declared with.
template <class T>
struct constant_type;
#define MFA_SIM_CONSTANT_TYPE(T, type)                                                             \
    template <>                                                                                    \
    struct constant_type<T> {                                                                      \
        static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::type;                      \
    };
MFA_SIM_CONSTANT_TYPE(bool, Bool)
MFA_SIM_CONSTANT_TYPE(char, Char)
MFA_SIM_CONSTANT_TYPE(signed char, Char)
MFA_SIM_CONSTANT_TYPE(uchar, UChar)
MFA_SIM_CONSTANT_TYPE(short, Short)
MFA_SIM_CONSTANT_TYPE(ushort, UShort)
MFA_SIM_CONSTANT_TYPE(int, Int)
MFA_SIM_CONSTANT_TYPE(uint, UInt)
MFA_SIM_CONSTANT_TYPE(half, Half)
MFA_SIM_CONSTANT_TYPE(float, Float)
#undef MFA_SIM_CONSTANT_TYPE

// Sets this OS thread's copy of one [[function_constant(index)]]: the dispatch's value, or
// zero and "not defined" when the dispatch gives none (as Metal treats an unset constant).
template <class T>
inline const char* bind_constant(T& value, bool& defined, const mfa_sim_abi::ConstantTable& table,
                                 unsigned short index, const char* type_mismatch) {
    for (unsigned long i = 0; i < table.count; ++i) {
        const mfa_sim_abi::ConstantValue& c = table.values[i];
        if (c.index != index) continue;
        if (c.type != constant_type<T>::value) return type_mismatch;
        switch (c.type) {
            case mfa_sim_abi::Bool: value = static_cast<T>(c.value.b); break;
            case mfa_sim_abi::Char:
            case mfa_sim_abi::Short:
            case mfa_sim_abi::Int: value = static_cast<T>(c.value.i); break;
            case mfa_sim_abi::UChar:
            case mfa_sim_abi::UShort:
            case mfa_sim_abi::UInt: value = static_cast<T>(c.value.u); break;
            case mfa_sim_abi::Half:
            case mfa_sim_abi::Float: value = static_cast<T>(c.value.f); break;
        }
        defined = true;
        return nullptr;
    }
    value = T();
    defined = false;
    return nullptr;
}

} // namespace mfa_sim_glue

#endif // MFA_SIM_GLUE_H
