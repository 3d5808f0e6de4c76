// The Metal Shading Language, as far as the project's kernels need it, for compiling .metal
// files as C++ (clang >= 16) in the simulator. Included through <metal_stdlib> and the other
// MSL header names; nothing here includes a system header, so kernels see no C++ library.
//
// Design choices, each forced by C++:
// - Address spaces. `device`, `constant`, `threadgroup`, `thread` and `kernel` expand to marker
//   identifiers that metal_sim_codegen.py rewrites after preprocessing, and the attributes that
//   carry Metal meaning ([[buffer(i)]], [[threadgroup(i)]], built-ins, function constants,
//   host_name) are read and stripped by it too. The executable build erases address spaces:
//   with clang's address_space attribute a struct in device or constant memory could be neither
//   copied nor converted (C++, unlike OpenCL C++, has no generic address space for `this`), and
//   AddressSanitizer does not instrument accesses through non-zero address spaces. A second,
//   syntax-only pass (MFA_SIM_ADDRESS_SPACE_CHECK) gives every device/constant/threadgroup
//   pointer its clang address space, so mixing them up, or passing one where a thread pointer
//   is expected, fails the build as it does on Metal. References, objects and bfloat pointers
//   stay generic in that pass.
// - Vector constructors. clang's ext_vector_type gives Metal's layout, arithmetic and swizzles,
//   but C++ has no multi-argument functional cast for them, so `float4(a, b)`, `half2(x)` and
//   friends are function-like macros over metal::make_vec. `(float4)int4_value` is clang's
//   bit cast, not Metal's converting cast: write float4(int4_value).
// - Literals: 1.5h works; clang rejects a `bf` suffix on floating literals, so write
//   bfloat(1.5f) (which older Apple compilers require anyway).
// - half is _Float16. bfloat is a struct (clang's __bf16 is storage-only) converting from float
//   with round-to-nearest-even, as Metal does; bfloat vectors support construction, conversion
//   and element access, not arithmetic.
// - fast:: and precise:: functions compute the same, precise results here.
#ifndef MFA_SIM_METAL_H
#define MFA_SIM_METAL_H

#include "mfa_sim_abi.h"

#define device                             __mfa_sim_device__
#define constant                           __mfa_sim_constant__
#define threadgroup                        __mfa_sim_threadgroup__
#define thread                             __mfa_sim_thread__
#define kernel                             __mfa_sim_kernel__
#define is_function_constant_defined(name) (__mfa_sim_fc_defined_##name)
#define METAL_FUNC                         inline __attribute__((always_inline))

// ---- Scalar types ------------------------------------------------------------------------

typedef _Float16 half;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
typedef __UINTPTR_TYPE__ uintptr_t;

struct bfloat {
    ushort bits;

    bfloat() = default;
    explicit constexpr bfloat(float value) : bits(round_to_nearest_even(value)) {}
    explicit constexpr bfloat(half value) : bfloat(static_cast<float>(value)) {}
    explicit constexpr bfloat(int value) : bfloat(static_cast<float>(value)) {}
    explicit constexpr bfloat(uint value) : bfloat(static_cast<float>(value)) {}
    constexpr operator float() const {
        return __builtin_bit_cast(float, static_cast<uint>(bits) << 16);
    }

    static constexpr bfloat from_bits(ushort b) {
        bfloat r{};
        r.bits = b;
        return r;
    }

    static constexpr ushort round_to_nearest_even(float value) {
        const uint b = __builtin_bit_cast(uint, value);
        if ((b & 0x7FFFFFFFu) > 0x7F800000u)
            return static_cast<ushort>((b >> 16) | 0x0040u); // quiet NaN
        const uint rounding = 0x7FFFu + ((b >> 16) & 1u);
        return static_cast<ushort>((b + rounding) >> 16);
    }
};

// Arithmetic rounds each result to bfloat, as a bfloat ALU would.
#define MFA_SIM_BFLOAT_BINARY(op)                                                                  \
    constexpr bfloat operator op(bfloat a, bfloat b) {                                             \
        return bfloat(static_cast<float>(a) op static_cast<float>(b));                             \
    }                                                                                              \
    constexpr bfloat& operator op##=(bfloat& a, bfloat b) { return a = a op b; }
MFA_SIM_BFLOAT_BINARY(+)
MFA_SIM_BFLOAT_BINARY(-)
MFA_SIM_BFLOAT_BINARY(*)
MFA_SIM_BFLOAT_BINARY(/)
#undef MFA_SIM_BFLOAT_BINARY
constexpr bfloat operator-(bfloat a) {
    return bfloat::from_bits(static_cast<ushort>(a.bits ^ 0x8000u));
}

constexpr half operator""h(long double value) {
    return static_cast<half>(static_cast<float>(value));
}
constexpr half operator""h(unsigned long long value) {
    return static_cast<half>(static_cast<float>(value));
}

// ---- Type traits (<metal_type_traits>) ---------------------------------------------------

namespace metal {

template <class T, T v>
struct integral_constant {
    static constexpr T value = v;
};
template <bool B>
using bool_constant = integral_constant<bool, B>;
using true_type = bool_constant<true>;
using false_type = bool_constant<false>;

template <bool B, class T = void>
struct enable_if {};
template <class T>
struct enable_if<true, T> {
    typedef T type;
};
template <bool B, class T = void>
using enable_if_t = typename enable_if<B, T>::type;

template <bool B, class T, class F>
struct conditional {
    typedef T type;
};
template <class T, class F>
struct conditional<false, T, F> {
    typedef F type;
};
template <bool B, class T, class F>
using conditional_t = typename conditional<B, T, F>::type;

template <class A, class B>
struct is_same : false_type {};
template <class A>
struct is_same<A, A> : true_type {};
template <class A, class B>
constexpr bool is_same_v = is_same<A, B>::value;

template <class T>
struct remove_cv {
    typedef T type;
};
template <class T>
struct remove_cv<const T> {
    typedef T type;
};
template <class T>
struct remove_cv<volatile T> {
    typedef T type;
};
template <class T>
struct remove_cv<const volatile T> {
    typedef T type;
};
template <class T>
using remove_cv_t = typename remove_cv<T>::type;

template <class T>
constexpr bool is_floating_point_v =
    is_same_v<remove_cv_t<T>, float> || is_same_v<remove_cv_t<T>, half> ||
    is_same_v<remove_cv_t<T>, bfloat>;
template <class T>
constexpr bool is_integral_v =
    is_same_v<remove_cv_t<T>, bool> || is_same_v<remove_cv_t<T>, char> ||
    is_same_v<remove_cv_t<T>, signed char> || is_same_v<remove_cv_t<T>, uchar> ||
    is_same_v<remove_cv_t<T>, short> || is_same_v<remove_cv_t<T>, ushort> ||
    is_same_v<remove_cv_t<T>, int> || is_same_v<remove_cv_t<T>, uint> ||
    is_same_v<remove_cv_t<T>, long> || is_same_v<remove_cv_t<T>, ulong>;
template <class T>
constexpr bool is_arithmetic_v = is_floating_point_v<T> || is_integral_v<T>;

// ---- Vectors -----------------------------------------------------------------------------

template <int N>
struct bfloat_vec;
template <>
struct bfloat_vec<2> {
    bfloat x, y;
    bfloat& operator[](int i) { return (&x)[i]; }
    bfloat operator[](int i) const { return (&x)[i]; }
};
template <>
struct bfloat_vec<3> {
    bfloat x, y, z;
    bfloat& operator[](int i) { return (&x)[i]; }
    bfloat operator[](int i) const { return (&x)[i]; }
};
template <>
struct bfloat_vec<4> {
    bfloat x, y, z, w;
    bfloat& operator[](int i) { return (&x)[i]; }
    bfloat operator[](int i) const { return (&x)[i]; }
};

template <class T, int N>
struct vec_storage {
    typedef T type __attribute__((ext_vector_type(N)));
};
template <int N>
struct vec_storage<bfloat, N> {
    typedef bfloat_vec<N> type;
};
template <class T, int N>
using vec = typename vec_storage<T, N>::type;

// size == 1 for scalars.
template <class T>
struct vec_traits {
    static constexpr int size = 1;
    typedef T element;
};
template <class T, int N>
struct vec_traits<T __attribute__((ext_vector_type(N)))> {
    static constexpr int size = N;
    typedef T element;
};
template <int N>
struct vec_traits<bfloat_vec<N>> {
    static constexpr int size = N;
    typedef bfloat element;
};

namespace sim_detail {
template <class T, int N, class A>
inline void append_components(vec<T, N>& out, int& next, const A& part) {
    if constexpr (vec_traits<A>::size == 1) {
        out[next++] = T(part);
    } else {
        for (int i = 0; i < vec_traits<A>::size; ++i) out[next++] = T(part[i]);
    }
}
} // namespace sim_detail

// Metal's vector constructors: one scalar (splat), one vector of the same size (converting), or
// scalars and vectors whose components add up to N.
template <class T, int N, class... Parts>
inline vec<T, N> make_vec(const Parts&... parts) {
    constexpr int components = (vec_traits<Parts>::size + ... + 0);
    static_assert(components == N || (sizeof...(Parts) == 1 && components == 1),
                  "vector constructor: the arguments' components must add up to the vector size");
    vec<T, N> out;
    if constexpr (sizeof...(Parts) == 1 && components == 1) {
        for (int i = 0; i < N; ++i) out[i] = T(parts...);
    } else {
        int next = 0;
        (sim_detail::append_components<T, N>(out, next, parts), ...);
    }
    return out;
}

} // namespace metal

#define MFA_SIM_VECTOR_TYPES(T)                                                                    \
    typedef metal::vec<T, 2> T##2;                                                                 \
    typedef metal::vec<T, 3> T##3;                                                                 \
    typedef metal::vec<T, 4> T##4;
MFA_SIM_VECTOR_TYPES(float)
MFA_SIM_VECTOR_TYPES(half)
MFA_SIM_VECTOR_TYPES(bfloat)
MFA_SIM_VECTOR_TYPES(int)
MFA_SIM_VECTOR_TYPES(uint)
MFA_SIM_VECTOR_TYPES(short)
MFA_SIM_VECTOR_TYPES(ushort)
MFA_SIM_VECTOR_TYPES(char)
MFA_SIM_VECTOR_TYPES(uchar)
MFA_SIM_VECTOR_TYPES(long)
MFA_SIM_VECTOR_TYPES(ulong)
#undef MFA_SIM_VECTOR_TYPES

#define float2(...)  ::metal::make_vec<float, 2>(__VA_ARGS__)
#define float3(...)  ::metal::make_vec<float, 3>(__VA_ARGS__)
#define float4(...)  ::metal::make_vec<float, 4>(__VA_ARGS__)
#define half2(...)   ::metal::make_vec<half, 2>(__VA_ARGS__)
#define half3(...)   ::metal::make_vec<half, 3>(__VA_ARGS__)
#define half4(...)   ::metal::make_vec<half, 4>(__VA_ARGS__)
#define bfloat2(...) ::metal::make_vec<bfloat, 2>(__VA_ARGS__)
#define bfloat3(...) ::metal::make_vec<bfloat, 3>(__VA_ARGS__)
#define bfloat4(...) ::metal::make_vec<bfloat, 4>(__VA_ARGS__)
#define int2(...)    ::metal::make_vec<int, 2>(__VA_ARGS__)
#define int3(...)    ::metal::make_vec<int, 3>(__VA_ARGS__)
#define int4(...)    ::metal::make_vec<int, 4>(__VA_ARGS__)
#define uint2(...)   ::metal::make_vec<uint, 2>(__VA_ARGS__)
#define uint3(...)   ::metal::make_vec<uint, 3>(__VA_ARGS__)
#define uint4(...)   ::metal::make_vec<uint, 4>(__VA_ARGS__)
#define short2(...)  ::metal::make_vec<short, 2>(__VA_ARGS__)
#define short3(...)  ::metal::make_vec<short, 3>(__VA_ARGS__)
#define short4(...)  ::metal::make_vec<short, 4>(__VA_ARGS__)
#define ushort2(...) ::metal::make_vec<ushort, 2>(__VA_ARGS__)
#define ushort3(...) ::metal::make_vec<ushort, 3>(__VA_ARGS__)
#define ushort4(...) ::metal::make_vec<ushort, 4>(__VA_ARGS__)
#define char2(...)   ::metal::make_vec<char, 2>(__VA_ARGS__)
#define char3(...)   ::metal::make_vec<char, 3>(__VA_ARGS__)
#define char4(...)   ::metal::make_vec<char, 4>(__VA_ARGS__)
#define uchar2(...)  ::metal::make_vec<uchar, 2>(__VA_ARGS__)
#define uchar3(...)  ::metal::make_vec<uchar, 3>(__VA_ARGS__)
#define uchar4(...)  ::metal::make_vec<uchar, 4>(__VA_ARGS__)
#define long2(...)   ::metal::make_vec<long, 2>(__VA_ARGS__)
#define long3(...)   ::metal::make_vec<long, 3>(__VA_ARGS__)
#define long4(...)   ::metal::make_vec<long, 4>(__VA_ARGS__)
#define ulong2(...)  ::metal::make_vec<ulong, 2>(__VA_ARGS__)
#define ulong3(...)  ::metal::make_vec<ulong, 3>(__VA_ARGS__)
#define ulong4(...)  ::metal::make_vec<ulong, 4>(__VA_ARGS__)

// ---- Constants ---------------------------------------------------------------------------

#define INFINITY     (__builtin_inff())
#define NAN          (__builtin_nanf(""))
#define MAXFLOAT     __FLT_MAX__
#define FLT_MAX      __FLT_MAX__
#define FLT_MIN      __FLT_MIN__
#define FLT_EPSILON  __FLT_EPSILON__
#define HALF_MAX     (static_cast<half>(65504.0f))
#define HALF_MIN     (static_cast<half>(6.103515625e-05f))
#define HALF_EPSILON (static_cast<half>(0.0009765625f))
#define M_E_F        2.71828182845904523536f
#define M_LOG2E_F    1.44269504088896340736f
#define M_LOG10E_F   0.434294481903251827651f
#define M_LN2_F      0.693147180559945309417f
#define M_LN10_F     2.30258509299404568402f
#define M_PI_F       3.14159265358979323846f
#define M_PI_2_F     1.57079632679489661923f
#define M_PI_4_F     0.785398163397448309616f
#define M_1_PI_F     0.318309886183790671538f
#define M_2_PI_F     0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F    1.41421356237309504880f
#define M_SQRT1_2_F  0.707106781186547524401f

namespace metal {

template <class T>
struct numeric_limits;

#define MFA_SIM_FLOAT_LIMITS(T, min_v, max_v, epsilon_v, infinity_v, nan_v)                        \
    template <>                                                                                    \
    struct numeric_limits<T> {                                                                     \
        static constexpr bool is_specialized = true;                                               \
        static constexpr bool is_signed = true;                                                    \
        static constexpr bool is_integer = false;                                                  \
        static constexpr bool has_infinity = true;                                                 \
        static constexpr T min() { return min_v; }                                                 \
        static constexpr T max() { return max_v; }                                                 \
        static constexpr T lowest() { return -max_v; }                                             \
        static constexpr T epsilon() { return epsilon_v; }                                         \
        static constexpr T infinity() { return infinity_v; }                                       \
        static constexpr T quiet_NaN() { return nan_v; }                                           \
    };
MFA_SIM_FLOAT_LIMITS(float, __FLT_MIN__, __FLT_MAX__, __FLT_EPSILON__, __builtin_inff(),
                     __builtin_nanf(""))
MFA_SIM_FLOAT_LIMITS(half, static_cast<half>(6.103515625e-05f), static_cast<half>(65504.0f),
                     static_cast<half>(0.0009765625f), static_cast<half>(__builtin_inff()),
                     static_cast<half>(__builtin_nanf("")))
MFA_SIM_FLOAT_LIMITS(bfloat, bfloat::from_bits(0x0080), bfloat::from_bits(0x7F7F),
                     bfloat::from_bits(0x3C00), bfloat::from_bits(0x7F80),
                     bfloat::from_bits(0x7FC0))
#undef MFA_SIM_FLOAT_LIMITS

#define MFA_SIM_INT_LIMITS(T, signed_v, min_v, max_v)                                              \
    template <>                                                                                    \
    struct numeric_limits<T> {                                                                     \
        static constexpr bool is_specialized = true;                                               \
        static constexpr bool is_signed = signed_v;                                                \
        static constexpr bool is_integer = true;                                                   \
        static constexpr bool has_infinity = false;                                                \
        static constexpr T min() { return min_v; }                                                 \
        static constexpr T max() { return max_v; }                                                 \
        static constexpr T lowest() { return min_v; }                                              \
    };
MFA_SIM_INT_LIMITS(char, true, -128, 127)
MFA_SIM_INT_LIMITS(uchar, false, 0, 255)
MFA_SIM_INT_LIMITS(short, true, -32768, 32767)
MFA_SIM_INT_LIMITS(ushort, false, 0, 65535)
MFA_SIM_INT_LIMITS(int, true, -__INT_MAX__ - 1, __INT_MAX__)
MFA_SIM_INT_LIMITS(uint, false, 0u, 0xFFFFFFFFu)
MFA_SIM_INT_LIMITS(long, true, -__LONG_MAX__ - 1, __LONG_MAX__)
MFA_SIM_INT_LIMITS(ulong, false, 0ul, ~0ul)
#undef MFA_SIM_INT_LIMITS

// ---- Math (<metal_math>, <metal_common>, <metal_integer>) --------------------------------

namespace sim_detail {
template <class T>
constexpr bool is_float_scalar = is_same_v<T, float> || is_same_v<T, half>;
template <class T>
constexpr bool is_float_type = is_float_scalar<typename vec_traits<T>::element>;
template <class T>
constexpr bool is_int_type = is_integral_v<typename vec_traits<T>::element> &&
                             !is_same_v<typename vec_traits<T>::element, bool>;

// Applies f element by element, computing in float for half.
template <class T, class F>
inline T map(T x, F f) {
    if constexpr (vec_traits<T>::size == 1) {
        return static_cast<T>(f(static_cast<float>(x)));
    } else {
        typedef typename vec_traits<T>::element E;
        T out;
        for (int i = 0; i < vec_traits<T>::size; ++i)
            out[i] = static_cast<E>(f(static_cast<float>(x[i])));
        return out;
    }
}
template <class T, class F>
inline T map2(T x, T y, F f) {
    if constexpr (vec_traits<T>::size == 1) {
        return static_cast<T>(f(static_cast<float>(x), static_cast<float>(y)));
    } else {
        typedef typename vec_traits<T>::element E;
        T out;
        for (int i = 0; i < vec_traits<T>::size; ++i)
            out[i] = static_cast<E>(f(static_cast<float>(x[i]), static_cast<float>(y[i])));
        return out;
    }
}
template <class T, class F>
inline T map3(T x, T y, T z, F f) {
    if constexpr (vec_traits<T>::size == 1) {
        return static_cast<T>(
            f(static_cast<float>(x), static_cast<float>(y), static_cast<float>(z)));
    } else {
        typedef typename vec_traits<T>::element E;
        T out;
        for (int i = 0; i < vec_traits<T>::size; ++i)
            out[i] = static_cast<E>(
                f(static_cast<float>(x[i]), static_cast<float>(y[i]), static_cast<float>(z[i])));
        return out;
    }
}
template <class T>
inline T splat(typename vec_traits<T>::element value) {
    if constexpr (vec_traits<T>::size == 1) {
        return value;
    } else {
        T out;
        for (int i = 0; i < vec_traits<T>::size; ++i) out[i] = value;
        return out;
    }
}
} // namespace sim_detail

#define MFA_SIM_FLOAT_T template <class T, enable_if_t<sim_detail::is_float_type<T>, int> = 0>
#define MFA_SIM_UNARY(name, expression)                                                            \
    MFA_SIM_FLOAT_T inline T name(T x) {                                                           \
        return sim_detail::map(x, [](float v) -> float { return expression; });                    \
    }
MFA_SIM_UNARY(exp, __builtin_expf(v))
MFA_SIM_UNARY(exp2, __builtin_exp2f(v))
MFA_SIM_UNARY(exp10, __builtin_powf(10.0f, v))
MFA_SIM_UNARY(log, __builtin_logf(v))
MFA_SIM_UNARY(log2, __builtin_log2f(v))
MFA_SIM_UNARY(log10, __builtin_log10f(v))
MFA_SIM_UNARY(sqrt, __builtin_sqrtf(v))
MFA_SIM_UNARY(rsqrt, 1.0f / __builtin_sqrtf(v))
MFA_SIM_UNARY(fabs, __builtin_fabsf(v))
MFA_SIM_UNARY(floor, __builtin_floorf(v))
MFA_SIM_UNARY(ceil, __builtin_ceilf(v))
MFA_SIM_UNARY(round, __builtin_roundf(v))
MFA_SIM_UNARY(rint, __builtin_rintf(v))
MFA_SIM_UNARY(trunc, __builtin_truncf(v))
MFA_SIM_UNARY(sin, __builtin_sinf(v))
MFA_SIM_UNARY(cos, __builtin_cosf(v))
MFA_SIM_UNARY(tan, __builtin_tanf(v))
MFA_SIM_UNARY(tanh, __builtin_tanhf(v))
MFA_SIM_UNARY(saturate, __builtin_fminf(__builtin_fmaxf(v, 0.0f), 1.0f))
#undef MFA_SIM_UNARY

#define MFA_SIM_BINARY(name, expression)                                                           \
    MFA_SIM_FLOAT_T inline T name(T x, T y) {                                                      \
        return sim_detail::map2(x, y, [](float a, float b) -> float { return expression; });       \
    }
MFA_SIM_BINARY(fmax, __builtin_fmaxf(a, b))
MFA_SIM_BINARY(fmin, __builtin_fminf(a, b))
MFA_SIM_BINARY(pow, __builtin_powf(a, b))
MFA_SIM_BINARY(powr, __builtin_powf(a, b))
MFA_SIM_BINARY(divide, a / b)
MFA_SIM_BINARY(copysign, __builtin_copysignf(a, b))
MFA_SIM_BINARY(fmod, __builtin_fmodf(a, b))
#undef MFA_SIM_BINARY

MFA_SIM_FLOAT_T inline T fma(T a, T b, T c) {
    return sim_detail::map3(a, b, c,
                            [](float x, float y, float z) { return __builtin_fmaf(x, y, z); });
}
MFA_SIM_FLOAT_T inline T mix(T x, T y, T a) {
    return sim_detail::map3(x, y, a, [](float u, float v, float w) { return u + (v - u) * w; });
}

// max/min of floating types follow fmax/fmin (a NaN operand yields the other operand).
template <class T, enable_if_t<sim_detail::is_float_type<T> || sim_detail::is_int_type<T>, int> = 0>
inline T max(T x, T y) {
    if constexpr (sim_detail::is_float_type<T>) {
        return fmax(x, y);
    } else if constexpr (vec_traits<T>::size == 1) {
        return x > y ? x : y;
    } else {
        T out;
        for (int i = 0; i < vec_traits<T>::size; ++i) out[i] = x[i] > y[i] ? x[i] : y[i];
        return out;
    }
}
template <class T, enable_if_t<sim_detail::is_float_type<T> || sim_detail::is_int_type<T>, int> = 0>
inline T min(T x, T y) {
    if constexpr (sim_detail::is_float_type<T>) {
        return fmin(x, y);
    } else if constexpr (vec_traits<T>::size == 1) {
        return x < y ? x : y;
    } else {
        T out;
        for (int i = 0; i < vec_traits<T>::size; ++i) out[i] = x[i] < y[i] ? x[i] : y[i];
        return out;
    }
}
template <class T, enable_if_t<sim_detail::is_float_type<T> || sim_detail::is_int_type<T>, int> = 0>
inline T clamp(T x, T low, T high) {
    return min(max(x, low), high);
}
// The vector forms that take scalar bounds.
template <class T, enable_if_t<(vec_traits<T>::size > 1), int> = 0>
inline T max(T x, typename vec_traits<T>::element y) {
    return max(x, sim_detail::splat<T>(y));
}
template <class T, enable_if_t<(vec_traits<T>::size > 1), int> = 0>
inline T min(T x, typename vec_traits<T>::element y) {
    return min(x, sim_detail::splat<T>(y));
}
template <class T, enable_if_t<(vec_traits<T>::size > 1), int> = 0>
inline T clamp(T x, typename vec_traits<T>::element low, typename vec_traits<T>::element high) {
    return clamp(x, sim_detail::splat<T>(low), sim_detail::splat<T>(high));
}

template <class T, enable_if_t<sim_detail::is_float_type<T> || sim_detail::is_int_type<T>, int> = 0>
inline T abs(T x) {
    if constexpr (sim_detail::is_float_type<T>) {
        return fabs(x);
    } else if constexpr (vec_traits<T>::size == 1) {
        return x < 0 ? static_cast<T>(-x) : x;
    } else {
        T out;
        for (int i = 0; i < vec_traits<T>::size; ++i) out[i] = x[i] < 0 ? -x[i] : x[i];
        return out;
    }
}

// Classification: bool for scalars; for vectors an int mask (1 where true), which select(),
// all() and any() accept as they accept comparison results.
#define MFA_SIM_CLASSIFY(name, expression)                                                         \
    MFA_SIM_FLOAT_T inline auto name(T x) {                                                        \
        if constexpr (vec_traits<T>::size == 1) {                                                  \
            const float v = static_cast<float>(x);                                                 \
            return static_cast<bool>(expression);                                                  \
        } else {                                                                                   \
            vec<int, vec_traits<T>::size> mask;                                                    \
            for (int i = 0; i < vec_traits<T>::size; ++i) {                                        \
                const float v = static_cast<float>(x[i]);                                          \
                mask[i] = (expression) ? 1 : 0;                                                    \
            }                                                                                      \
            return mask;                                                                           \
        }                                                                                          \
    }
MFA_SIM_CLASSIFY(isnan, __builtin_isnan(v))
MFA_SIM_CLASSIFY(isinf, __builtin_isinf(v))
MFA_SIM_CLASSIFY(isfinite, __builtin_isfinite(v))
MFA_SIM_CLASSIFY(signbit, __builtin_signbit(v))
#undef MFA_SIM_CLASSIFY

template <class T, enable_if_t<(vec_traits<T>::size > 1), int> = 0>
inline typename vec_traits<T>::element dot(T x, T y) {
    typename vec_traits<T>::element sum = 0;
    for (int i = 0; i < vec_traits<T>::size; ++i) sum += x[i] * y[i];
    return sum;
}

// select(a, b, c): c ? b : a, per component for vectors (c a comparison mask or bool).
template <class T>
inline T select(T a, T b, bool c) {
    return c ? b : a;
}
template <
    class T, class M,
    enable_if_t<(vec_traits<T>::size > 1 && vec_traits<T>::size == vec_traits<M>::size), int> = 0>
inline T select(T a, T b, M c) {
    T out;
    for (int i = 0; i < vec_traits<T>::size; ++i) out[i] = c[i] ? b[i] : a[i];
    return out;
}

template <class M>
inline bool all(M mask) {
    if constexpr (vec_traits<M>::size == 1) {
        return static_cast<bool>(mask);
    } else {
        for (int i = 0; i < vec_traits<M>::size; ++i)
            if (!mask[i]) return false;
        return true;
    }
}
template <class M>
inline bool any(M mask) {
    if constexpr (vec_traits<M>::size == 1) {
        return static_cast<bool>(mask);
    } else {
        for (int i = 0; i < vec_traits<M>::size; ++i)
            if (mask[i]) return true;
        return false;
    }
}

template <class To, class From>
inline To as_type(const From& value) {
    static_assert(sizeof(To) == sizeof(From), "as_type: the types must have the same size");
    return __builtin_bit_cast(To, value);
}

#undef MFA_SIM_FLOAT_T

// The simulator computes both variants precisely.
#define MFA_SIM_MATH_VARIANT(ns)                                                                   \
    namespace ns {                                                                                 \
    using metal::abs;                                                                              \
    using metal::ceil;                                                                             \
    using metal::clamp;                                                                            \
    using metal::cos;                                                                              \
    using metal::divide;                                                                           \
    using metal::exp;                                                                              \
    using metal::exp10;                                                                            \
    using metal::exp2;                                                                             \
    using metal::fabs;                                                                             \
    using metal::floor;                                                                            \
    using metal::fma;                                                                              \
    using metal::fmax;                                                                             \
    using metal::fmin;                                                                             \
    using metal::log;                                                                              \
    using metal::log10;                                                                            \
    using metal::log2;                                                                             \
    using metal::max;                                                                              \
    using metal::min;                                                                              \
    using metal::pow;                                                                              \
    using metal::powr;                                                                             \
    using metal::rint;                                                                             \
    using metal::round;                                                                            \
    using metal::rsqrt;                                                                            \
    using metal::saturate;                                                                         \
    using metal::sin;                                                                              \
    using metal::sqrt;                                                                             \
    using metal::tan;                                                                              \
    using metal::tanh;                                                                             \
    using metal::trunc;                                                                            \
    }
MFA_SIM_MATH_VARIANT(fast)
MFA_SIM_MATH_VARIANT(precise)
#undef MFA_SIM_MATH_VARIANT

// ---- Synchronisation (<metal_compute>) ---------------------------------------------------

enum class mem_flags : uint {
    mem_none = 0,
    mem_device = 1,
    mem_threadgroup = 2,
    mem_texture = 4,
    mem_threadgroup_imageblock = 8,
    mem_object_data = 16,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) {
    return static_cast<mem_flags>(static_cast<uint>(a) | static_cast<uint>(b));
}

// Every rendezvous records its call site: lanes of a SIMD-group (threads of a threadgroup)
// must all be in the same one, or the dispatch fails as divergent.
#define MFA_SIM_SITE_PARAMETERS                                                                    \
    const char *mfa_sim_file = __builtin_FILE(), uint mfa_sim_line = __builtin_LINE()

// Memory ordering needs no fence here: a threadgroup's threads all run on one OS thread.
inline void threadgroup_barrier(mem_flags, MFA_SIM_SITE_PARAMETERS) {
    const mfa_sim_abi::Site site{"threadgroup_barrier", mfa_sim_file, mfa_sim_line};
    mfa_sim_threadgroup_barrier(&site);
}

namespace sim_detail {
// Runs operation(records, lanes) once for the whole SIMD-group, in the last lane to arrive,
// after every lane has deposited its record.
template <class Record, class Operation>
inline void simd_rendezvous(const char* name, const char* file, uint line, Record& mine,
                            Operation operation) {
    const mfa_sim_abi::Site site{name, file, line};
    const mfa_sim_abi::SimdRendezvous r = mfa_sim_simd_arrive(&site, &mine);
    if (r.records) {
        operation(reinterpret_cast<Record* const*>(r.records), r.lanes);
        mfa_sim_simd_release();
    }
}

struct NoRecord {};

template <class T>
struct ExchangeRecord {
    T value;
    uint argument;
    T result;
};
} // namespace sim_detail

inline void simdgroup_barrier(mem_flags, MFA_SIM_SITE_PARAMETERS) {
    sim_detail::NoRecord none;
    sim_detail::simd_rendezvous("simdgroup_barrier", mfa_sim_file, mfa_sim_line, none,
                                [](sim_detail::NoRecord* const*, uint) {});
}

// ---- SIMD-group functions (<metal_simdgroup>) --------------------------------------------

namespace sim_detail {
// Each lane's result is value[source(lane, argument, lanes)]; source returns -1 for "keep my
// own value" and fails the dispatch for a lane that does not exist.
template <class T, class Source>
inline T simd_permute(const char* name, T value, uint argument, const char* file, uint line,
                      Source source) {
    ExchangeRecord<T> mine{value, argument, value};
    simd_rendezvous(name, file, line, mine, [&](ExchangeRecord<T>* const* lanes, uint count) {
        for (uint lane = 0; lane < count; ++lane) {
            const int from = source(lane, lanes[lane]->argument, count);
            if (from >= static_cast<int>(count))
                mfa_sim_fail("a SIMD-group shuffle reads a lane that does not exist in this "
                             "SIMD-group");
            lanes[lane]->result = from < 0 ? lanes[lane]->value : lanes[from]->value;
        }
    });
    return mine.result;
}

template <class T, class Combine>
inline T simd_reduce(const char* name, T value, const char* file, uint line, Combine combine) {
    ExchangeRecord<T> mine{value, 0, value};
    simd_rendezvous(name, file, line, mine, [&](ExchangeRecord<T>* const* lanes, uint count) {
        T total = lanes[0]->value;
        for (uint lane = 1; lane < count; ++lane) total = combine(total, lanes[lane]->value);
        for (uint lane = 0; lane < count; ++lane) lanes[lane]->result = total;
    });
    return mine.result;
}

template <class T, class Combine>
inline T simd_scan(const char* name, T value, bool inclusive, T identity, const char* file,
                   uint line, Combine combine) {
    ExchangeRecord<T> mine{value, 0, value};
    simd_rendezvous(name, file, line, mine, [&](ExchangeRecord<T>* const* lanes, uint count) {
        T running = identity;
        for (uint lane = 0; lane < count; ++lane) {
            const T next = combine(running, lanes[lane]->value);
            lanes[lane]->result = inclusive ? next : running;
            running = next;
        }
    });
    return mine.result;
}
} // namespace sim_detail

template <class T>
inline T simd_shuffle(T value, ushort lane, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_permute(
        "simd_shuffle", value, lane, mfa_sim_file, mfa_sim_line,
        [](uint, uint source, uint) { return static_cast<int>(source); });
}
template <class T>
inline T simd_shuffle_xor(T value, ushort mask, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_permute(
        "simd_shuffle_xor", value, mask, mfa_sim_file, mfa_sim_line,
        [](uint lane, uint m, uint) { return static_cast<int>(lane ^ m); });
}
// Lanes whose source would fall outside the SIMD-group keep their own value.
template <class T>
inline T simd_shuffle_up(T value, ushort delta, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_permute(
        "simd_shuffle_up", value, delta, mfa_sim_file, mfa_sim_line,
        [](uint lane, uint d, uint) { return lane >= d ? static_cast<int>(lane - d) : -1; });
}
template <class T>
inline T simd_shuffle_down(T value, ushort delta, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_permute("simd_shuffle_down", value, delta, mfa_sim_file, mfa_sim_line,
                                    [](uint lane, uint d, uint count) {
                                        return lane + d < count ? static_cast<int>(lane + d) : -1;
                                    });
}
template <class T>
inline T simd_shuffle_rotate_up(T value, ushort delta, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_permute("simd_shuffle_rotate_up", value, delta, mfa_sim_file,
                                    mfa_sim_line, [](uint lane, uint d, uint count) {
                                        return static_cast<int>((lane + count - d % count) % count);
                                    });
}
template <class T>
inline T simd_shuffle_rotate_down(T value, ushort delta, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_permute(
        "simd_shuffle_rotate_down", value, delta, mfa_sim_file, mfa_sim_line,
        [](uint lane, uint d, uint count) { return static_cast<int>((lane + d) % count); });
}
template <class T>
inline T simd_broadcast(T value, ushort lane, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_permute(
        "simd_broadcast", value, lane, mfa_sim_file, mfa_sim_line,
        [](uint, uint source, uint) { return static_cast<int>(source); });
}
template <class T>
inline T simd_broadcast_first(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_permute("simd_broadcast_first", value, 0, mfa_sim_file, mfa_sim_line,
                                    [](uint, uint, uint) { return 0; });
}

template <class T>
inline T simd_sum(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_reduce("simd_sum", value, mfa_sim_file, mfa_sim_line,
                                   [](T a, T b) { return T(a + b); });
}
template <class T>
inline T simd_product(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_reduce("simd_product", value, mfa_sim_file, mfa_sim_line,
                                   [](T a, T b) { return T(a * b); });
}
template <class T>
inline T simd_max(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_reduce("simd_max", value, mfa_sim_file, mfa_sim_line,
                                   [](T a, T b) { return max(a, b); });
}
template <class T>
inline T simd_min(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_reduce("simd_min", value, mfa_sim_file, mfa_sim_line,
                                   [](T a, T b) { return min(a, b); });
}
template <class T>
inline T simd_and(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_reduce("simd_and", value, mfa_sim_file, mfa_sim_line,
                                   [](T a, T b) { return T(a & b); });
}
template <class T>
inline T simd_or(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_reduce("simd_or", value, mfa_sim_file, mfa_sim_line,
                                   [](T a, T b) { return T(a | b); });
}
template <class T>
inline T simd_xor(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_reduce("simd_xor", value, mfa_sim_file, mfa_sim_line,
                                   [](T a, T b) { return T(a ^ b); });
}
inline bool simd_all(bool value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_reduce("simd_all", value, mfa_sim_file, mfa_sim_line,
                                   [](bool a, bool b) { return a && b; });
}
inline bool simd_any(bool value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_reduce("simd_any", value, mfa_sim_file, mfa_sim_line,
                                   [](bool a, bool b) { return a || b; });
}
template <class T>
inline T simd_prefix_inclusive_sum(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_scan("simd_prefix_inclusive_sum", value, true, T(0), mfa_sim_file,
                                 mfa_sim_line, [](T a, T b) { return T(a + b); });
}
template <class T>
inline T simd_prefix_exclusive_sum(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_scan("simd_prefix_exclusive_sum", value, false, T(0), mfa_sim_file,
                                 mfa_sim_line, [](T a, T b) { return T(a + b); });
}
template <class T>
inline T simd_prefix_inclusive_product(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_scan("simd_prefix_inclusive_product", value, true, T(1), mfa_sim_file,
                                 mfa_sim_line, [](T a, T b) { return T(a * b); });
}
template <class T>
inline T simd_prefix_exclusive_product(T value, MFA_SIM_SITE_PARAMETERS) {
    return sim_detail::simd_scan("simd_prefix_exclusive_product", value, false, T(1), mfa_sim_file,
                                 mfa_sim_line, [](T a, T b) { return T(a * b); });
}
// Lane 0 is the first active lane: the simulator never runs a SIMD-group with lanes masked off
// except by return, and a returned lane cannot take part in SIMD-group functions.
inline bool simd_is_first() { return mfa_sim_current_thread()->thread_index_in_simdgroup == 0; }

// ---- simdgroup_matrix (<metal_simdgroup_matrix>) -----------------------------------------

namespace sim_detail {
// Apple's lane layout: lane L holds row (q & 4) + (L / 2) % 4, columns col0 and col0 + 1,
// where q = L / 4 and col0 = (q & 2) * 2 + (L % 2) * 2 (reference/mfa.md section 3).
inline uint fragment_row(uint lane) { return ((lane / 4) & 4) + (lane / 2) % 4; }
inline uint fragment_column(uint lane) { return ((lane / 4) & 2) * 2 + (lane % 2) * 2; }
inline uint current_lane() { return mfa_sim_current_thread()->thread_index_in_simdgroup; }
} // namespace sim_detail

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
    static_assert(Cols == 8 && Rows == 8,
                  "Apple GPUs (and the simulator) have 8x8 simdgroup matrices");
    static_assert(is_same_v<T, float> || is_same_v<T, half> || is_same_v<T, bfloat>,
                  "simdgroup_matrix element types are float, half and bfloat");

    // This lane's two elements; uninitialised until written, as on the GPU.
    vec<T, 2> elements;

    simdgroup_matrix() = default;
    // The diagonal matrix with `diagonal` on its diagonal.
    explicit simdgroup_matrix(T diagonal) {
        const uint lane = sim_detail::current_lane();
        const uint row = sim_detail::fragment_row(lane), column = sim_detail::fragment_column(lane);
        elements[0] = row == column ? diagonal : T(0.0f);
        elements[1] = row == column + 1 ? diagonal : T(0.0f);
    }

    thread vec<T, 2>& thread_elements() { return elements; }
    const thread vec<T, 2>& thread_elements() const { return elements; }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int Cols, int Rows>
inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T value) {
    simdgroup_matrix<T, Cols, Rows> m;
    m.elements[0] = value;
    m.elements[1] = value;
    return m;
}

namespace sim_detail {
template <class T, class Pointer>
struct TransferRecord {
    simdgroup_matrix<T, 8, 8>* matrix;
    Pointer memory;
    ulong elements_per_row;
    ulong2 origin;
    bool transpose;
};

// Offset in memory of element (row, column) of the 8x8 tile: matrix_origin is (column, row),
// and a transposed tile is stored column-major.
inline ulong element_offset(ulong elements_per_row, ulong2 origin, bool transpose, uint row,
                            uint column) {
    return transpose ? (origin.x + column) * elements_per_row + origin.y + row
                     : (origin.y + row) * elements_per_row + origin.x + column;
}

template <class Record>
inline void require_uniform_transfer(Record* const* lanes, uint count, const char* what) {
    if (count != 32)
        mfa_sim_fail("simdgroup_matrix operations need a full SIMD-group of 32 threads");
    for (uint lane = 1; lane < count; ++lane) {
        if (lanes[lane]->memory != lanes[0]->memory ||
            lanes[lane]->elements_per_row != lanes[0]->elements_per_row ||
            lanes[lane]->origin.x != lanes[0]->origin.x ||
            lanes[lane]->origin.y != lanes[0]->origin.y ||
            lanes[lane]->transpose != lanes[0]->transpose)
            mfa_sim_fail(what);
    }
}

template <class T, int Cols, int Rows>
inline void load_matrix(simdgroup_matrix<T, Cols, Rows>& d, const T* source, ulong elements_per_row,
                        ulong2 matrix_origin, bool transpose_matrix, const char* file, uint line) {
    typedef TransferRecord<T, const T*> Record;
    Record mine{&d, source, elements_per_row, matrix_origin, transpose_matrix};
    simd_rendezvous("simdgroup_load", file, line, mine, [](Record* const* lanes, uint count) {
        require_uniform_transfer(lanes, count,
                                 "simdgroup_load: the lanes pass different arguments");
        for (uint lane = 0; lane < count; ++lane) {
            const Record& r = *lanes[lane];
            const uint row = fragment_row(lane), column = fragment_column(lane);
            for (uint j = 0; j < 2; ++j)
                r.matrix->elements[j] = r.memory[element_offset(r.elements_per_row, r.origin,
                                                                r.transpose, row, column + j)];
        }
    });
}

template <class T, int Cols, int Rows>
inline void store_matrix(const simdgroup_matrix<T, Cols, Rows>& a, T* destination,
                         ulong elements_per_row, ulong2 matrix_origin, bool transpose_matrix,
                         const char* file, uint line) {
    typedef TransferRecord<T, T*> Record;
    Record mine{const_cast<simdgroup_matrix<T, Cols, Rows>*>(&a), destination, elements_per_row,
                matrix_origin, transpose_matrix};
    simd_rendezvous("simdgroup_store", file, line, mine, [](Record* const* lanes, uint count) {
        require_uniform_transfer(lanes, count,
                                 "simdgroup_store: the lanes pass different arguments");
        for (uint lane = 0; lane < count; ++lane) {
            const Record& r = *lanes[lane];
            const uint row = fragment_row(lane), column = fragment_column(lane);
            for (uint j = 0; j < 2; ++j)
                r.memory[element_offset(r.elements_per_row, r.origin, r.transpose, row,
                                        column + j)] = r.matrix->elements[j];
        }
    });
}
} // namespace sim_detail

// MSL loads and stores matrices from device and threadgroup memory only. The address-space
// type-checking pass (MFA_SIM_ADDRESS_SPACE_CHECK) declares exactly those two overloads; the
// executable build, where address spaces are erased, one.
#define MFA_SIM_MATRIX_LOAD_STORE(space)                                                           \
    template <class T, int Cols, int Rows>                                                         \
    inline void simdgroup_load(thread simdgroup_matrix<T, Cols, Rows>& d, const space T* source,   \
                               ulong elements_per_row = Cols, ulong2 matrix_origin = ulong2(0),    \
                               bool transpose_matrix = false, MFA_SIM_SITE_PARAMETERS) {           \
        sim_detail::load_matrix(d, (const T*)source, elements_per_row, matrix_origin,              \
                                transpose_matrix, mfa_sim_file, mfa_sim_line);                     \
    }                                                                                              \
    template <class T, int Cols, int Rows>                                                         \
    inline void simdgroup_store(thread const simdgroup_matrix<T, Cols, Rows>& a,                   \
                                space T* destination, ulong elements_per_row = Cols,               \
                                ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false,   \
                                MFA_SIM_SITE_PARAMETERS) {                                         \
        sim_detail::store_matrix(a, (T*)destination, elements_per_row, matrix_origin,              \
                                 transpose_matrix, mfa_sim_file, mfa_sim_line);                    \
    }
#if MFA_SIM_ADDRESS_SPACE_CHECK
MFA_SIM_MATRIX_LOAD_STORE(device)
MFA_SIM_MATRIX_LOAD_STORE(threadgroup)
#else
MFA_SIM_MATRIX_LOAD_STORE()
#endif
#undef MFA_SIM_MATRIX_LOAD_STORE

namespace sim_detail {
template <class TD, class TA, class TB, class TC>
struct MultiplyRecord {
    simdgroup_matrix<TD, 8, 8>* d;
    const simdgroup_matrix<TA, 8, 8>* a;
    const simdgroup_matrix<TB, 8, 8>* b;
    const simdgroup_matrix<TC, 8, 8>* c; // nullptr: no accumulator
};

template <class M>
inline void gather(float (&out)[8][8], M get, uint count) {
    for (uint lane = 0; lane < count; ++lane) {
        const uint row = fragment_row(lane), column = fragment_column(lane);
        out[row][column] = static_cast<float>(get(lane)->elements[0]);
        out[row][column + 1] = static_cast<float>(get(lane)->elements[1]);
    }
}

// d = a * b (+ c), accumulated in float in k order, then rounded to d's type. Mixed element
// types are accepted, as MLX's and MFA's kernels use them.
template <class TD, class TA, class TB, class TC>
inline void multiply(const char* name, simdgroup_matrix<TD, 8, 8>& d,
                     const simdgroup_matrix<TA, 8, 8>& a, const simdgroup_matrix<TB, 8, 8>& b,
                     const simdgroup_matrix<TC, 8, 8>* c, const char* file, uint line) {
    typedef MultiplyRecord<TD, TA, TB, TC> Record;
    Record mine{&d, &a, &b, c};
    simd_rendezvous(name, file, line, mine, [](Record* const* lanes, uint count) {
        if (count != 32)
            mfa_sim_fail("simdgroup_matrix operations need a full SIMD-group of 32 threads");
        float A[8][8], B[8][8], C[8][8] = {};
        gather(
            A, [&](uint lane) { return lanes[lane]->a; }, count);
        gather(
            B, [&](uint lane) { return lanes[lane]->b; }, count);
        if (lanes[0]->c)
            gather(
                C, [&](uint lane) { return lanes[lane]->c; }, count);
        for (uint lane = 0; lane < count; ++lane) {
            const uint row = fragment_row(lane), column = fragment_column(lane);
            for (uint j = 0; j < 2; ++j) {
                float sum = C[row][column + j];
                for (int k = 0; k < 8; ++k) sum += A[row][k] * B[k][column + j];
                lanes[lane]->d->elements[j] = TD(sum);
            }
        }
    });
}
} // namespace sim_detail

template <class TD, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(thread simdgroup_matrix<TD, 8, 8>& d,
                                          thread const simdgroup_matrix<TA, 8, 8>& a,
                                          thread const simdgroup_matrix<TB, 8, 8>& b,
                                          thread const simdgroup_matrix<TC, 8, 8>& c,
                                          MFA_SIM_SITE_PARAMETERS) {
    sim_detail::multiply("simdgroup_multiply_accumulate", d, a, b, &c, mfa_sim_file, mfa_sim_line);
}

template <class TD, class TA, class TB>
inline void
simdgroup_multiply(thread simdgroup_matrix<TD, 8, 8>& d, thread const simdgroup_matrix<TA, 8, 8>& a,
                   thread const simdgroup_matrix<TB, 8, 8>& b, MFA_SIM_SITE_PARAMETERS) {
    sim_detail::multiply<TD, TA, TB, TD>("simdgroup_multiply", d, a, b, nullptr, mfa_sim_file,
                                         mfa_sim_line);
}

template <class T>
inline simdgroup_matrix<T, 8, 8> operator*(const simdgroup_matrix<T, 8, 8>& a,
                                           const simdgroup_matrix<T, 8, 8>& b) {
    simdgroup_matrix<T, 8, 8> d;
    simdgroup_multiply(d, a, b);
    return d;
}

} // namespace metal

// ---- Argument binding for the generated glue ---------------------------------------------

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

template <class T>
struct constant_type;
template <>
struct constant_type<bool> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::Bool;
};
template <>
struct constant_type<char> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::Char;
};
template <>
struct constant_type<signed char> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::Char;
};
template <>
struct constant_type<uchar> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::UChar;
};
template <>
struct constant_type<short> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::Short;
};
template <>
struct constant_type<ushort> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::UShort;
};
template <>
struct constant_type<int> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::Int;
};
template <>
struct constant_type<uint> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::UInt;
};
template <>
struct constant_type<half> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::Half;
};
template <>
struct constant_type<float> {
    static constexpr mfa_sim_abi::ConstantType value = mfa_sim_abi::Float;
};

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

// ---- What MSL forbids in kernels ---------------------------------------------------------
// From here on these identifiers are compile errors, in the kernel and anything it includes.
#pragma GCC poison double malloc calloc realloc free new typeid dynamic_cast throw try catch
#pragma GCC poison virtual thread_local std printf fprintf puts asm __asm __asm__ setjmp longjmp

#endif // MFA_SIM_METAL_H
