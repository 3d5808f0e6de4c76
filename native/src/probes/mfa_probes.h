/*
 * mfa_probes: the machine's roofs, measured by small native loops, so that
 * `python -m mfa_native bench` can say how close each result comes to what the hardware can do.
 *
 * Three probes, each run on `threads` threads at once (no thread is pinned to a core):
 *   mfa_probe_fma_f32   float32 fused multiply-add throughput, GFLOP/s (2 FLOPs per lane);
 *   mfa_probe_dot_bf16  bfloat16 dot-product throughput, GFLOP/s (2 FLOPs per product), where
 *                       the CPU has such an instruction: AMX-BF16 tiles (tdpbf16ps) where the
 *                       CPU and OS offer them, else AVX512_BF16 vdpbf16ps, Armv8.6 bfdot;
 *   mfa_probe_read      streaming read bandwidth from memory, GB/s (10^9 bytes per second).
 * The instruction set is chosen at run time from what the CPU and the OS support; the
 * result's `isa` and `method` fields say what ran. Each source file of a kernel documents its
 * method.
 *
 * This is not part of libmfa's API (mfa.h): it is a separate library, shipped beside libmfa in
 * the Python wheel for the benchmark, which loads it with cffi in ABI mode from this header.
 * The header therefore stays plain declarations: integer #defines only, no other #if than the
 * __cplusplus guard.
 */
#ifndef MFA_PROBES_H
#define MFA_PROBES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return values of the probes. */
#define MFA_PROBE_OK          0
#define MFA_PROBE_UNSUPPORTED 1 /* this CPU, OS or build lacks the instructions; see method */
#define MFA_PROBE_FAILED      2 /* bad argument, no memory or no thread; see method */

/* mfa_probe_read_sum reads whole blocks of this many bytes. */
#define MFA_PROBE_READ_BLOCK 512

typedef struct mfa_probe_result {
    double rate;        /* the best trial: GFLOP/s (compute probes) or GB/s (read probe) */
    double median_rate; /* the median trial, same unit: how steady the machine was */
    int threads;        /* threads that ran at once */
    int trials;         /* trials run */
    double seconds;     /* wall time of the best trial */
    char isa[24];       /* the kernel build that ran: "avx512", "avx512_bf16", "amx_bf16",
                           "avx2", "neon", "neon_bf16" or "portable" */
    char method[232];   /* what each thread ran, in words (instruction, accumulators, bytes) */
} mfa_probe_result;

/* Each runs `trials` trials of about `seconds` each, after a short calibration on one thread,
 * and fills *result (also on failure: rate 0 and the reason in method). `threads` >= 1,
 * `trials` >= 1, 0 < `seconds` <= 10. */
int mfa_probe_fma_f32(int threads, int trials, double seconds, mfa_probe_result* result);
int mfa_probe_dot_bf16(int threads, int trials, double seconds, mfa_probe_result* result);
/* Reads a buffer of `bytes` (>= threads * MFA_PROBE_READ_BLOCK; choose it several times the
 * last-level cache), split into one contiguous slice per thread, each slice first touched by
 * the thread that reads it; on Linux the buffer asks for transparent huge pages. */
int mfa_probe_read(int threads, int trials, double seconds, size_t bytes, mfa_probe_result* result);

/* Self-checks of the kernels the probes time, on the calling thread, for tests: what each
 * kernel computed, so that a caller can compare it with the closed form its source states.
 *   mfa_probe_fma_f32_sum:  every f32 lane starts at 0 and runs `iterations` times
 *                           lane = fma(lane, multiplier, addend); returns the sum of all lanes
 *                           and sets *lanes to their number.
 *   mfa_probe_dot_bf16_sum: every f32 lane starts at 0 and adds a[0]*b[0] + a[1]*b[1]
 *                           `iterations` times, a and b being pairs of bf16 bit patterns;
 *                           returns the sum of all lanes and sets *lanes (0 when unsupported).
 *   mfa_probe_read_sum:     the 64-bit wrapping sum of the words of data[0, bytes), bytes a
 *                           multiple of MFA_PROBE_READ_BLOCK and data 64-byte aligned. */
double mfa_probe_fma_f32_sum(uint64_t iterations, float multiplier, float addend, int* lanes);
double mfa_probe_dot_bf16_sum(uint64_t iterations, uint32_t a_pair, uint32_t b_pair, int* lanes);
int mfa_probe_read_sum(const void* data, size_t bytes, uint64_t* sum);

#ifdef __cplusplus
}
#endif

#endif
