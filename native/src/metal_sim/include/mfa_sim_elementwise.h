// How the simulator's math, common, integer and relational functions apply to scalars and
// vectors alike: element by element, computing in float for half (and bfloat), and the
// constraints that give each header its own overloads of a shared name (max, min, clamp, abs).
#ifndef MFA_SIM_ELEMENTWISE_H
#define MFA_SIM_ELEMENTWISE_H

#include <metal_type_traits>

namespace metal {
namespace sim_detail {
template <class T>
constexpr bool is_float_scalar = is_same_v<T, float> || is_same_v<T, half>;
template <class T>
constexpr bool is_float_type = is_float_scalar<typename vec_traits<T>::element>;
template <class T>
constexpr bool is_int_type = is_integral_v<typename vec_traits<T>::element> &&
                             !is_same_v<typename vec_traits<T>::element, bool>;

template <class T>
using if_float = enable_if_t<is_float_type<T>, int>;
template <class T>
using if_integer = enable_if_t<is_int_type<T>, int>;
template <class T>
using if_float_vector = enable_if_t<is_float_type<T> && (vec_traits<T>::size > 1), int>;
template <class T>
using if_integer_vector = enable_if_t<is_int_type<T> && (vec_traits<T>::size > 1), int>;

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
} // namespace metal

#endif // MFA_SIM_ELEMENTWISE_H
