/*
 * Scalar conversions between the storage dtypes and f32.
 *
 * Written with integer bit operations (no _Float16 / __bf16) so they mean the same thing on every
 * compiler and target, and simple enough that the per-ISA translation units auto-vectorize them.
 * Every function is static inline: the per-ISA files include this header under different target
 * flags, and internal linkage keeps the linker from merging an AVX-512 copy into baseline code.
 */
#ifndef MFA_CPU_CONVERT_H
#define MFA_CPU_CONVERT_H

#include <stdint.h>
#include <string.h>

static inline uint32_t mfa_cpu_f32_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

static inline float mfa_cpu_f32_from_bits(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static inline float mfa_cpu_bf16_to_f32(uint16_t h) {
    return mfa_cpu_f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays NaN (quieted, sign and top payload bits kept), overflow
 * rounds to infinity as IEEE requires. */
static inline uint16_t mfa_cpu_f32_to_bf16(float x) {
    uint32_t bits = mfa_cpu_f32_bits(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* Moving the 15 exponent+mantissa bits into f32 position and multiplying by 2^112 rebiases the
 * exponent and normalizes subnormal halves in one exact multiply; only inf/NaN need a fix-up. */
static inline float mfa_cpu_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t magnitude = (uint32_t)(h & 0x7fffu) << 13;
    float x = mfa_cpu_f32_from_bits(magnitude) * 0x1p112f;
    uint32_t bits = mfa_cpu_f32_bits(x);
    if ((h & 0x7c00u) == 0x7c00u) bits |= 0x7f800000u;
    return mfa_cpu_f32_from_bits(bits | sign);
}

/* Round to nearest even, overflow to infinity, NaN stays NaN. */
static inline uint16_t mfa_cpu_f32_to_f16(float x) {
    const uint32_t bits = mfa_cpu_f32_bits(x);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) /* 65520 and up round past the largest half, 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (magnitude < 0x38800000u) {
        /* Below 2^-14 the result is subnormal: adding 0.5 puts the half's last place (2^-24)
         * at the f32's last place, so the hardware's own round-to-nearest-even does the work. */
        const float shifted = mfa_cpu_f32_from_bits(magnitude) + 0.5f;
        return (uint16_t)(sign | (mfa_cpu_f32_bits(shifted) - 0x3f000000u));
    }
    const uint32_t odd = (magnitude >> 13) & 1u;
    const uint32_t rebiased = magnitude + ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    return (uint16_t)(sign | (rebiased >> 13));
}

#endif /* MFA_CPU_CONVERT_H */
