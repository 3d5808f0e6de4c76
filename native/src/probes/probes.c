/*
 * The probes of mfa_probes.h: which kernel build runs (chosen at run time), how the threads
 * start together, and how a rate is timed.
 *
 * Method, for all three probes:
 *   1. Calibrate on the calling thread: run the kernel on work that doubles until one run takes
 *      20 ms, then scale the work so that one run takes the requested seconds.
 *   2. Each trial starts `threads` threads (the calling thread is one of them), lets each
 *      announce that it is ready, then releases them at once; each thread times its own run.
 *      The trial's time is from the earliest start to the latest end, so a thread that the OS
 *      delayed makes the rate lower, never higher.
 *   3. The result is the best trial (the roof: what the machine reaches when nothing disturbs
 *      it) and the median trial (how steady it was). No thread is pinned to a core and no
 *      process-wide setting is changed, so the probes leave the rest of the process as it was.
 * A compute probe counts lanes x FLOPs per lane x iterations per thread; the read probe counts
 * the bytes of the slices read.
 */
#if defined(__APPLE__)
#define _DARWIN_C_SOURCE
#else
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#endif
#include "probes/mfa_probes.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_features.h"
#include "probes/kernels.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(_WIN32)
#define PROBE_EXPORT __declspec(dllexport)
#else
#define PROBE_EXPORT __attribute__((visibility("default")))
#endif

#define MAX_THREADS   1024
#define MAX_TRIALS    1000
#define CALIBRATION_S 0.02
#define BF16_ONE      0x3F80u /* 1.0 */
#define BF16_TWO_M21  0x3500u /* 2^-21 */
#define F32_ONE       0x3F800000u
#define F32_TWO_M20   0x35800000u /* 2^-20 */

/* ---- Which kernel build runs ------------------------------------------------------------- */

#if defined(__x86_64__)
typedef struct x86_features {
    bool avx2_fma, avx512f, avx512_bf16, amx_bf16;
} x86_features;

static uint64_t xcr0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

/* cpuid says what the CPU has; XCR0 says which register states the OS saves on a context switch
 * (bits 1-2: xmm and ymm; 5-7: the opmask and the two halves of the zmm file). */
static x86_features x86_detect(void) {
    x86_features f = {false, false, false, false};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28);
    if (!osxsave || !avx) return f;
    const uint64_t saved = xcr0();
    const bool ymm_saved = (saved & 0x6) == 0x6, zmm_saved = (saved & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    const unsigned leaf7_subleaves = a;
    f.avx2_fma = ymm_saved && fma && (b & (1u << 5));
    f.avx512f = f.avx2_fma && zmm_saved && (b & (1u << 16));
    if (leaf7_subleaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
        f.avx512_bf16 = f.avx512f && (a & (1u << 5));
    f.amx_bf16 = f.avx512_bf16 && mfa_cpu_amx_bf16_granted();
    return f;
}
#endif

/* The widest FMA and read kernels this CPU and OS run. */
typedef struct kernel_set {
    const probe_compute* fma;
    const probe_read* read;
} kernel_set;

static kernel_set choose_kernels(void) {
#if defined(__x86_64__)
    const x86_features f = x86_detect();
    if (f.avx512f) return (kernel_set){probe_fma_avx512(), probe_read_avx512()};
    if (f.avx2_fma) return (kernel_set){probe_fma_avx2(), probe_read_avx2()};
#endif
    return (kernel_set){probe_fma_baseline(), probe_read_baseline()};
}

/* The bf16 dot-product kernel, or NULL with the reason in *why: AMX tiles where the CPU backend
 * multiplies on them (its AMX build), otherwise vdpbf16ps. */
static const probe_compute* choose_dot(const char** why) {
#if defined(__x86_64__)
    const x86_features f = x86_detect();
    if (!f.avx512_bf16) {
        *why = "this CPU (or its OS) offers no AVX512_BF16 dot product (vdpbf16ps)";
        return NULL;
    }
#if MFA_PROBES_HAVE_AMX
    if (f.amx_bf16) return probe_dot_amx_bf16();
#endif
#if MFA_PROBES_HAVE_BF16
    return probe_dot_avx512bf16();
#else
    *why = "mfa_probes was built by a compiler without -mavx512bf16";
    return NULL;
#endif
#elif defined(__aarch64__)
    if (!mfa_cpu_arm_bf16()) {
        *why = "this CPU offers no Armv8.6 BF16 dot product (bfdot, FEAT_BF16)";
        return NULL;
    }
#if MFA_PROBES_HAVE_BF16
    return probe_dot_neon_bf16();
#else
    *why = "mfa_probes was built by a compiler without +bf16";
    return NULL;
#endif
#else
    *why = "no bf16 dot-product probe for this architecture";
    return NULL;
#endif
}

/* ---- Threads that start together --------------------------------------------------------- */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct job {
    const probe_compute* compute; /* a compute trial, or */
    const probe_read* read;       /* a read trial, or neither: first touch of the slices */
    uint64_t iterations;          /* compute: per thread; read: passes over the slice */
    uint32_t x, y;
    unsigned char* buffer;
    size_t slice;
    atomic_int ready, go;
} job;

typedef struct worker {
    job* job;
    int index;
    double start, end;
    volatile uint64_t sink; /* keeps every result alive */
} worker;

static void work(worker* w) {
    job* j = w->job;
    atomic_fetch_add_explicit(&j->ready, 1, memory_order_acq_rel);
    while (!atomic_load_explicit(&j->go, memory_order_acquire)) sched_yield();
    unsigned char* slice = j->buffer ? j->buffer + (size_t)w->index * j->slice : NULL;
    w->start = now();
    if (j->compute) {
        w->sink = (uint64_t)j->compute->run(j->iterations, j->x, j->y);
    } else if (j->read) {
        uint64_t sum = 0;
        for (uint64_t pass = 0; pass < j->iterations; ++pass) sum += j->read->run(slice, j->slice);
        w->sink = sum;
    } else {
        /* First touch by the thread that will read the slice: its pages land near that core. */
        for (size_t i = 0; i < j->slice; ++i) slice[i] = (unsigned char)(i * 131 + w->index);
    }
    w->end = now();
}

static void* work_thread(void* argument) {
    work((worker*)argument);
    return NULL;
}

/* Runs the job on `threads` threads; the seconds from the first start to the last end, or a
 * negative number when a thread cannot be created. */
static double run_together(job* j, int threads, worker* workers) {
    atomic_store(&j->ready, 0);
    atomic_store(&j->go, 0);
    pthread_t handles[MAX_THREADS];
    int started = 1;
    for (int i = 0; i < threads; ++i) workers[i] = (worker){j, i, 0.0, 0.0, 0};
    for (; started < threads; ++started) {
        if (pthread_create(&handles[started], NULL, work_thread, &workers[started]) != 0) break;
    }
    const bool complete = started == threads;
    while (atomic_load_explicit(&j->ready, memory_order_acquire) < started - 1) sched_yield();
    if (!complete) {
        /* Release and drop the threads that did start: no trial with fewer threads than asked. */
        j->compute = NULL, j->read = NULL, j->buffer = NULL, j->slice = 0;
    }
    atomic_store_explicit(&j->go, 1, memory_order_release);
    if (complete) work(&workers[0]);
    for (int i = 1; i < started; ++i) pthread_join(handles[i], NULL);
    if (!complete) return -1.0;
    double first = workers[0].start, last = workers[0].end;
    for (int i = 1; i < threads; ++i) {
        if (workers[i].start < first) first = workers[i].start;
        if (workers[i].end > last) last = workers[i].end;
    }
    return last - first;
}

/* ---- Results ------------------------------------------------------------------------------ */

static int fail(mfa_probe_result* result, int status, const char* isa, const char* why) {
    result->rate = 0.0;
    result->median_rate = 0.0;
    result->seconds = 0.0;
    snprintf(result->isa, sizeof result->isa, "%s", isa);
    snprintf(result->method, sizeof result->method, "%s", why);
    return status;
}

static int compare_doubles(const void* a, const void* b) {
    const double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

static const char* check_arguments(int threads, int trials, double seconds) {
    if (threads < 1 || threads > MAX_THREADS) return "threads must be in [1, 1024]";
    if (trials < 1 || trials > MAX_TRIALS) return "trials must be in [1, 1000]";
    if (!(seconds > 0.0 && seconds <= 10.0)) return "seconds must be in (0, 10]";
    return NULL;
}

/* Times `trials` runs of the job; work_per_run is FLOPs or bytes (divided by 1e9). */
static int time_trials(job* j, int threads, int trials, double work_per_run, const char* isa,
                       const char* method, mfa_probe_result* result) {
    worker* workers = calloc((size_t)threads, sizeof *workers);
    double* rates = calloc((size_t)trials, sizeof *rates);
    if (!workers || !rates) {
        free(workers);
        free(rates);
        return fail(result, MFA_PROBE_FAILED, isa, "out of memory");
    }
    for (int t = 0; t < trials; ++t) {
        const double seconds = run_together(j, threads, workers);
        if (seconds < 0) {
            free(workers);
            free(rates);
            return fail(result, MFA_PROBE_FAILED, isa, "cannot start the probe's threads");
        }
        rates[t] = work_per_run / seconds / 1e9;
    }
    qsort(rates, (size_t)trials, sizeof *rates, compare_doubles);
    result->rate = rates[trials - 1];
    result->median_rate =
        trials % 2 ? rates[trials / 2] : 0.5 * (rates[trials / 2 - 1] + rates[trials / 2]);
    result->seconds = work_per_run / result->rate / 1e9;
    result->threads = threads;
    result->trials = trials;
    snprintf(result->isa, sizeof result->isa, "%s", isa);
    snprintf(result->method, sizeof result->method, "%s", method);
    free(workers);
    free(rates);
    return MFA_PROBE_OK;
}

static int probe_compute_rate(const probe_compute* kernel, uint32_t x, uint32_t y, int threads,
                              int trials, double seconds, mfa_probe_result* result) {
    uint64_t iterations = 1024;
    double elapsed;
    for (;;) {
        const double start = now();
        volatile double sink = kernel->run(iterations, x, y);
        (void)sink;
        elapsed = now() - start;
        if (elapsed >= CALIBRATION_S || iterations >= (1ull << 40)) break;
        iterations *= 2;
    }
    iterations = (uint64_t)fmax(1.0, (double)iterations * seconds / elapsed);
    job j = {kernel, NULL, iterations, x, y, NULL, 0, 0, 0};
    const double flops =
        (double)threads * (double)iterations * kernel->lanes * kernel->flops_per_lane;
    return time_trials(&j, threads, trials, flops, kernel->isa, kernel->method, result);
}

PROBE_EXPORT int mfa_probe_fma_f32(int threads, int trials, double seconds,
                                   mfa_probe_result* result) {
    const probe_compute* kernel = choose_kernels().fma;
    const char* bad = check_arguments(threads, trials, seconds);
    if (bad) return fail(result, MFA_PROBE_FAILED, kernel->isa, bad);
    /* lane = lane * 1 + 2^-20: the lanes stay normal numbers (no slow denormal path) and the
     * self-check can predict them exactly. */
    return probe_compute_rate(kernel, F32_ONE, F32_TWO_M20, threads, trials, seconds, result);
}

PROBE_EXPORT int mfa_probe_dot_bf16(int threads, int trials, double seconds,
                                    mfa_probe_result* result) {
    const char* why = NULL;
    const probe_compute* kernel = choose_dot(&why);
    if (!kernel) return fail(result, MFA_PROBE_UNSUPPORTED, "none", why);
    const char* bad = check_arguments(threads, trials, seconds);
    if (bad) return fail(result, MFA_PROBE_FAILED, kernel->isa, bad);
    const uint32_t ones = BF16_ONE | BF16_ONE << 16, small = BF16_TWO_M21 | BF16_TWO_M21 << 16;
    return probe_compute_rate(kernel, ones, small, threads, trials, seconds, result);
}

PROBE_EXPORT int mfa_probe_read(int threads, int trials, double seconds, size_t bytes,
                                mfa_probe_result* result) {
    const probe_read* kernel = choose_kernels().read;
    const char* bad = check_arguments(threads, trials, seconds);
    if (bad) return fail(result, MFA_PROBE_FAILED, kernel->isa, bad);
    const size_t slice = bytes / (size_t)threads / MFA_PROBE_READ_BLOCK * MFA_PROBE_READ_BLOCK;
    if (slice == 0)
        return fail(result, MFA_PROBE_FAILED, kernel->isa,
                    "bytes must be at least threads * MFA_PROBE_READ_BLOCK");
    /* Transparent huge pages where Linux offers them on request, as numpy asks for its large
     * arrays (a caller's k and v): with 4 KiB pages the hardware prefetchers stop at every page
     * boundary, and the probe would report less than such arrays are read at. */
    const size_t huge_page = 2u << 20;
    const size_t length = (slice * (size_t)threads + huge_page - 1) / huge_page * huge_page;
    void* buffer = NULL;
    if (posix_memalign(&buffer, huge_page, length) != 0)
        return fail(result, MFA_PROBE_FAILED, kernel->isa, "cannot allocate the buffer");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(buffer, length, MADV_HUGEPAGE);
#endif
    worker* workers = calloc((size_t)threads, sizeof *workers);
    if (!workers) {
        free(buffer);
        return fail(result, MFA_PROBE_FAILED, kernel->isa, "out of memory");
    }
    job touch = {NULL, NULL, 0, 0, 0, buffer, slice, 0, 0};
    double one_pass = run_together(&touch, threads, workers);
    job read = {NULL, kernel, 1, 0, 0, buffer, slice, 0, 0};
    if (one_pass >= 0) one_pass = run_together(&read, threads, workers);
    free(workers);
    if (one_pass < 0) {
        free(buffer);
        return fail(result, MFA_PROBE_FAILED, kernel->isa, "cannot start the probe's threads");
    }
    read.iterations = (uint64_t)fmax(1.0, round(seconds / fmax(one_pass, 1e-9)));
    const double bytes_per_run = (double)slice * threads * (double)read.iterations;
    const int status =
        time_trials(&read, threads, trials, bytes_per_run, kernel->isa, kernel->method, result);
    free(buffer);
    return status;
}

/* ---- Self-checks ------------------------------------------------------------------------- */

PROBE_EXPORT double mfa_probe_fma_f32_sum(uint64_t iterations, float multiplier, float addend,
                                          int* lanes) {
    const probe_compute* kernel = choose_kernels().fma;
    uint32_t x, y;
    memcpy(&x, &multiplier, sizeof x);
    memcpy(&y, &addend, sizeof y);
    *lanes = kernel->lanes;
    return kernel->run(iterations, x, y);
}

PROBE_EXPORT double mfa_probe_dot_bf16_sum(uint64_t iterations, uint32_t a_pair, uint32_t b_pair,
                                           int* lanes) {
    const char* why = NULL;
    const probe_compute* kernel = choose_dot(&why);
    if (!kernel) {
        *lanes = 0;
        return 0.0;
    }
    *lanes = kernel->lanes;
    return kernel->run(iterations, a_pair, b_pair);
}

PROBE_EXPORT int mfa_probe_read_sum(const void* data, size_t bytes, uint64_t* sum) {
    if (bytes % MFA_PROBE_READ_BLOCK != 0 || (uintptr_t)data % 64 != 0) return MFA_PROBE_FAILED;
    *sum = choose_kernels().read->run(data, bytes);
    return MFA_PROBE_OK;
}
