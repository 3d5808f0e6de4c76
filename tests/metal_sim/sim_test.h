// Shared helpers of the simulator tests: dispatch set-up and reference conversions written
// independently of the simulator's own. Checks are check.h's.
#ifndef MFA_TESTS_METAL_SIM_SIM_TEST_H
#define MFA_TESTS_METAL_SIM_SIM_TEST_H

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "metal_sim/sim.h"

namespace sim_test {

template <class T>
mfa::sim::BufferBinding bind(std::vector<T>& data) {
    mfa::sim::BufferBinding b;
    b.base = data.data();
    b.length = data.size() * sizeof(T);
    return b;
}

template <class T>
mfa::sim::BufferBinding bind_value(T& value) {
    mfa::sim::BufferBinding b;
    b.base = &value;
    b.length = sizeof(T);
    return b;
}

inline mfa::sim::Dispatch one_group(const char* kernel, uint32_t threads) {
    mfa::sim::Dispatch d;
    d.kernel = kernel;
    d.threads_per_threadgroup = {threads, 1, 1};
    d.threadgroups = {1, 1, 1};
    return d;
}

// Runs a dispatch expected to succeed; reports the simulator's message otherwise.
inline bool run(const mfa::sim::Dispatch& d) {
    const mfa_status status = mfa::sim::dispatch(d);
    CHECK(status == MFA_OK, "dispatch of '%s' failed: %s", d.kernel, mfa_last_error());
    return status == MFA_OK;
}

inline uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// ---- Reference rounding: nearest representable value by search, ties to the even encoding ----
// Deliberately unlike the simulator's bit manipulation: decode every finite 16-bit pattern of a
// format and pick the nearest to the exact input in double precision.

inline double decode_half(uint16_t h) {
    const int sign = h >> 15, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    double magnitude =
        exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
    return sign ? -magnitude : magnitude;
}

inline double decode_bfloat(uint16_t b) { return (double)bits_float((uint32_t)b << 16); }

// Nearest finite encoding of value among `decode` (finite patterns only), with overflow to
// infinity beyond the midpoint between the largest finite value and the next power step.
template <class Decode>
uint16_t reference_round(float value, Decode decode, uint16_t infinity_bits,
                         uint16_t largest_finite_bits) {
    if (std::isnan(value)) return 0; // callers do not pass NaN
    const double x = value;
    const double largest = decode(largest_finite_bits);
    const double next_step = 2 * largest - decode(largest_finite_bits - 1); // one ulp above
    const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
    if (std::fabs(x) >= (largest + next_step) / 2) return sign | infinity_bits;
    uint16_t best = 0;
    double best_error = INFINITY;
    for (uint32_t bits = 0; bits <= largest_finite_bits; ++bits) {
        const double error = std::fabs(std::fabs(x) - decode((uint16_t)bits));
        if (error < best_error || (error == best_error && (bits & 1) == 0)) {
            best = (uint16_t)bits;
            best_error = error;
        }
    }
    return sign | best;
}

inline uint16_t reference_half(float value) {
    return reference_round(value, decode_half, 0x7C00, 0x7BFF);
}

inline uint16_t reference_bfloat(float value) {
    return reference_round(value, decode_bfloat, 0x7F80, 0x7F7F);
}

} // namespace sim_test

#endif // MFA_TESTS_METAL_SIM_SIM_TEST_H
