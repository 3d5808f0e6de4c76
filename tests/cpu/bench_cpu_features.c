/*
 * The CPU backend's 0.2 features against their own baselines, through the public C API, for the
 * targets the feature issues set: the score modifiers' cost over the same call without them, a
 * block-diagonal mask with its summary against an all-true mask, packed sequences against the
 * separate dense calls and against padding, paged decoding against dense decoding, and decoding
 * with 16 query rows per key/value head. Each comparison runs its calls interleaved (A B A B ...)
 * after a warm-up and reports medians and their ratio, so that a burst of load on a shared
 * machine lands on both sides. Not a test: it asserts nothing.
 *
 *   cpu_features_bench [--repeats N] [--only NAME]   (NAME: modifiers, mask, varlen, paged,
 *                                                    decode; default all)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mfa.h"

static int repeats = 5;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compare_doubles(const void* a, const void* b) {
    const double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

static double median(double* x, int n) {
    qsort(x, (size_t)n, sizeof *x, compare_doubles);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* ---- Arrays ---------------------------------------------------------------------------------- */

typedef struct buffer {
    void* data;
    mfa_array a;
} buffer;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float uniform(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) *
                       (2.0 / 9007199254740992.0) -
                   1.0);
}

static uint16_t to_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* A contiguous [d0, d1, d2, d3] array, filled with uniform values (floats) or zeros. */
static buffer make(mfa_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int fill) {
    buffer b;
    memset(&b, 0, sizeof b);
    const size_t count = (size_t)(d0 * d1 * d2 * d3), size = mfa_dtype_size(dtype);
    b.data = mfa_alloc(count * size > 0 ? count * size : 1);
    if (!b.data) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(b.data, 0, count * size);
    if (fill) {
        for (size_t i = 0; i < count; ++i) {
            const float x = uniform();
            if (dtype == MFA_DTYPE_F32)
                ((float*)b.data)[i] = x;
            else
                ((uint16_t*)b.data)[i] = to_bf16(x);
        }
    }
    b.a.data = b.data;
    b.a.dtype = dtype;
    const int64_t shape[4] = {d0, d1, d2, d3};
    memcpy(b.a.shape, shape, sizeof shape);
    b.a.strides[3] = 1;
    b.a.strides[2] = d3;
    b.a.strides[1] = d2 * d3;
    b.a.strides[0] = d1 * d2 * d3;
    return b;
}

static void release(buffer* b) {
    mfa_free(b->data);
    b->data = NULL;
}

/* The operands of one forward + backward call. */
typedef struct call {
    buffer q, k, v, out, lse, dout, dq, dk, dv;
    mfa_attention_args args;
    mfa_attention_params params;
} call;

static void make_call(call* c, mfa_dtype dtype, int64_t b, int64_t hq, int64_t hkv, int64_t nq,
                      int64_t nk, int64_t d, int causal) {
    c->q = make(dtype, b, hq, nq, d, 1);
    c->k = make(dtype, b, hkv, nk, d, 1);
    c->v = make(dtype, b, hkv, nk, d, 1);
    c->out = make(dtype, b, hq, nq, d, 0);
    c->lse = make(MFA_DTYPE_F32, b, hq, nq, 1, 0);
    c->dout = make(dtype, b, hq, nq, d, 1);
    c->dq = make(dtype, b, hq, nq, d, 0);
    c->dk = make(dtype, b, hkv, nk, d, 0);
    c->dv = make(dtype, b, hkv, nk, d, 0);
    mfa_attention_args_init(&c->args, sizeof c->args);
    c->args.q = &c->q.a, c->args.k = &c->k.a, c->args.v = &c->v.a;
    c->args.out = &c->out.a, c->args.lse = &c->lse.a;
    mfa_attention_params_init(&c->params);
    c->params.causal = causal;
}

static void free_call(call* c) {
    buffer* all[] = {&c->q, &c->out, &c->lse, &c->dout, &c->dq, &c->k, &c->v, &c->dk, &c->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) release(all[i]);
}

static mfa_context* ctx;

/* One forward, or forward then backward, of a call. */
static void run(call* c, int backward) {
    mfa_attention_args args = c->args;
    args.dsinks = NULL;
    mfa_status status = mfa_attention_compute(ctx, MFA_FORWARD, &c->params, &args);
    if (status == MFA_OK && backward) {
        args = c->args;
        args.dout = &c->dout.a, args.dq = &c->dq.a, args.dk = &c->dk.a, args.dv = &c->dv.a;
        status = mfa_attention_compute(ctx, MFA_BACKWARD, &c->params, &args);
    }
    if (status != MFA_OK) {
        fprintf(stderr, "call failed: %s\n", mfa_last_error());
        exit(1);
    }
}

/* ---- Interleaved timing ---------------------------------------------------------------------- */

typedef void (*work)(void* context, int which);

/* Medians over `repeats` rounds of each of `count` variants, run in turn each round. */
static void time_variants(work w, void* context, int count, double* medians) {
    double samples[8][64];
    for (int v = 0; v < count; ++v) w(context, v); /* warm-up */
    for (int r = 0; r < repeats; ++r)
        for (int v = 0; v < count; ++v) {
            const double start = now();
            w(context, v);
            samples[v][r] = now() - start;
        }
    for (int v = 0; v < count; ++v) medians[v] = median(samples[v], repeats);
}

/* ---- Score modifiers ------------------------------------------------------------------------- */

typedef struct modifier_bench {
    call c;
    buffer slopes, sinks, dsinks;
    int backward;
} modifier_bench;

static void run_modifier(void* context, int which) {
    modifier_bench* m = (modifier_bench*)context;
    m->c.args.softcap = which == 1 ? 30.0f : 0.0f;
    m->c.args.alibi_slopes = which == 2 ? &m->slopes.a : NULL;
    m->c.args.sinks = which == 3 ? &m->sinks.a : NULL;
    m->c.args.dsinks = which == 3 && m->backward ? &m->dsinks.a : NULL;
    run(&m->c, m->backward);
}

static void bench_modifiers(void) {
    printf("\n== softcap, ALiBi, sinks: cost over the same call without them (target <= 1.15x)\n");
    printf("   B 1, H 8, N 2048, not causal; softcap 30, ALiBi slopes [Hq], sinks [Hq]\n");
    printf("%-6s %4s %-9s %10s %10s %10s %10s %8s %8s %8s\n", "dtype", "D", "pass", "plain ms",
           "softcap", "alibi", "sinks", "softcap", "alibi", "sinks");
    const mfa_dtype dtypes[2] = {MFA_DTYPE_F32, MFA_DTYPE_BF16};
    const int64_t dims[2] = {64, 128};
    for (int t = 0; t < 2; ++t)
        for (int di = 0; di < 2; ++di)
            for (int backward = 0; backward < 2; ++backward) {
                modifier_bench m;
                make_call(&m.c, dtypes[t], 1, 8, 8, 2048, 2048, dims[di], 0);
                m.slopes = make(MFA_DTYPE_F32, 1, 8, 1, 1, 0);
                m.sinks = make(MFA_DTYPE_F32, 1, 8, 1, 1, 0);
                m.dsinks = make(MFA_DTYPE_F32, 1, 8, 1, 1, 0);
                for (int h = 0; h < 8; ++h) {
                    ((float*)m.slopes.data)[h] = exp2f(-(float)(h + 1));
                    ((float*)m.sinks.data)[h] = 0.5f * (float)h;
                }
                m.backward = backward;
                double ms[4];
                time_variants(run_modifier, &m, 4, ms);
                printf("%-6s %4lld %-9s %10.2f %10.2f %10.2f %10.2f %7.3fx %7.3fx %7.3fx\n",
                       mfa_dtype_name(dtypes[t]), (long long)dims[di],
                       backward ? "fwd+bwd" : "forward", 1e3 * ms[0], 1e3 * ms[1], 1e3 * ms[2],
                       1e3 * ms[3], ms[1] / ms[0], ms[2] / ms[0], ms[3] / ms[0]);
                fflush(stdout);
                release(&m.slopes);
                release(&m.sinks);
                release(&m.dsinks);
                free_call(&m.c);
            }
}

/* ---- Block-diagonal mask ---------------------------------------------------------------------- */

typedef struct mask_bench {
    call c;
    buffer all_true, documents, summary_all, summary_documents;
    int backward;
} mask_bench;

static void run_mask(void* context, int which) {
    mask_bench* m = (mask_bench*)context;
    /* 0: all-true mask; 1: documents with their summary; 2: documents without; 3: all-true with
     * its summary. */
    m->c.args.mask = which == 0 || which == 3 ? &m->all_true.a : &m->documents.a;
    m->c.args.block_mask = which == 1   ? &m->summary_documents.a
                           : which == 3 ? &m->summary_all.a
                                        : NULL;
    run(&m->c, m->backward);
}

static void bench_mask(void) {
    const int64_t n = 4096, documents = 8;
    printf("\n== block-diagonal boolean mask of %lld documents with its summary vs an all-true "
           "mask (target >= 4x)\n",
           (long long)documents);
    printf("   B 1, H 8, N %lld, mask [1, 1, N, N] shared by every head\n", (long long)n);
    printf("%-6s %4s %-9s %12s %12s %12s %12s %9s %9s\n", "dtype", "D", "pass", "all-true ms",
           "docs+summ", "docs", "true+summ", "speedup", "no summ");
    const mfa_dtype dtypes[2] = {MFA_DTYPE_F32, MFA_DTYPE_BF16};
    for (int t = 0; t < 2; ++t)
        for (int backward = 0; backward < 2; ++backward) {
            mask_bench m;
            make_call(&m.c, dtypes[t], 1, 8, 8, n, n, 64, 0);
            m.all_true = make(MFA_DTYPE_BOOL, 1, 1, n, n, 0);
            m.documents = make(MFA_DTYPE_BOOL, 1, 1, n, n, 0);
            memset(m.all_true.data, 1, (size_t)(n * n));
            for (int64_t i = 0; i < n; ++i)
                for (int64_t j = 0; j < n; ++j)
                    ((uint8_t*)m.documents.data)[i * n + j] =
                        i / (n / documents) == j / (n / documents);
            const int64_t blocks = n / MFA_MASK_BLOCK;
            m.summary_all = make(MFA_DTYPE_BOOL, 1, 1, blocks, blocks, 0);
            m.summary_documents = make(MFA_DTYPE_BOOL, 1, 1, blocks, blocks, 0);
            if (mfa_mask_summarize(ctx, &m.all_true.a, n, n, &m.summary_all.a) != MFA_OK ||
                mfa_mask_summarize(ctx, &m.documents.a, n, n, &m.summary_documents.a) != MFA_OK) {
                fprintf(stderr, "summary failed: %s\n", mfa_last_error());
                exit(1);
            }
            m.backward = backward;
            double ms[4];
            time_variants(run_mask, &m, 4, ms);
            printf("%-6s %4d %-9s %12.2f %12.2f %12.2f %12.2f %8.2fx %8.2fx\n",
                   mfa_dtype_name(dtypes[t]), 64, backward ? "fwd+bwd" : "forward", 1e3 * ms[0],
                   1e3 * ms[1], 1e3 * ms[2], 1e3 * ms[3], ms[0] / ms[1], ms[0] / ms[2]);
            fflush(stdout);
            release(&m.all_true);
            release(&m.documents);
            release(&m.summary_all);
            release(&m.summary_documents);
            free_call(&m.c);
        }
}

/* ---- Packed sequences ------------------------------------------------------------------------ */

#define SEQUENCES 8
static const int64_t lengths[SEQUENCES] = {256, 1792, 512, 1280, 768, 1536, 1024, 1024};

typedef struct varlen_bench {
    call packed;              /* [1, H, 8192, D] with offsets */
    call separate[SEQUENCES]; /* one dense call per sequence */
    call padded;              /* B 8 at the longest length */
    buffer cu;
    int backward;
} varlen_bench;

static void run_varlen(void* context, int which) {
    varlen_bench* v = (varlen_bench*)context;
    if (which == 0) {
        run(&v->packed, v->backward);
    } else if (which == 1) {
        for (int s = 0; s < SEQUENCES; ++s) run(&v->separate[s], v->backward);
    } else {
        run(&v->padded, v->backward);
    }
}

static void bench_varlen(void) {
    int64_t total = 0, longest = 0;
    for (int s = 0; s < SEQUENCES; ++s) {
        total += lengths[s];
        if (lengths[s] > longest) longest = lengths[s];
    }
    printf("\n== %d packed sequences of mixed lengths (%lld tokens) vs the %d separate dense calls "
           "(target <= 1.10x) and vs padding to the longest (%lld)\n",
           SEQUENCES, (long long)total, SEQUENCES, (long long)longest);
    printf("   H 8, D 64\n");
    printf("%-6s %-7s %-9s %10s %12s %10s %10s %10s\n", "dtype", "causal", "pass", "packed ms",
           "separate ms", "padded ms", "vs sep.", "vs pad.");
    const mfa_dtype dtypes[2] = {MFA_DTYPE_F32, MFA_DTYPE_BF16};
    for (int t = 0; t < 2; ++t)
        for (int causal = 0; causal < 2; ++causal)
            for (int backward = 0; backward < 2; ++backward) {
                varlen_bench v;
                make_call(&v.packed, dtypes[t], 1, 8, 8, total, total, 64, causal);
                v.cu = make(MFA_DTYPE_I32, 1, 1, 1, SEQUENCES + 1, 0);
                int32_t* cu = (int32_t*)v.cu.data;
                cu[0] = 0;
                for (int s = 0; s < SEQUENCES; ++s) cu[s + 1] = cu[s] + (int32_t)lengths[s];
                /* The packed view: [1, H, total, D] in [total, H, D] memory, as flash-attn packs. */
                buffer* packed[] = {&v.packed.q,    &v.packed.k,  &v.packed.v,  &v.packed.out,
                                    &v.packed.dout, &v.packed.dq, &v.packed.dk, &v.packed.dv};
                for (size_t i = 0; i < sizeof packed / sizeof packed[0]; ++i) {
                    mfa_array* a = &packed[i]->a;
                    a->strides[3] = 1, a->strides[1] = a->shape[3];
                    a->strides[2] = a->shape[1] * a->shape[3], a->strides[0] = 0;
                }
                v.packed.args.cu_seqlens_q = &v.cu.a;
                v.packed.args.cu_seqlens_k = &v.cu.a;
                v.packed.args.max_seqlen_q = longest;
                v.packed.args.max_seqlen_k = longest;
                for (int s = 0; s < SEQUENCES; ++s)
                    make_call(&v.separate[s], dtypes[t], 1, 8, 8, lengths[s], lengths[s], 64,
                              causal);
                make_call(&v.padded, dtypes[t], SEQUENCES, 8, 8, longest, longest, 64, causal);
                v.backward = backward;
                double ms[3];
                time_variants(run_varlen, &v, 3, ms);
                printf("%-6s %-7s %-9s %10.2f %12.2f %10.2f %9.3fx %9.3fx\n",
                       mfa_dtype_name(dtypes[t]), causal ? "yes" : "no",
                       backward ? "fwd+bwd" : "forward", 1e3 * ms[0], 1e3 * ms[1], 1e3 * ms[2],
                       ms[0] / ms[1], ms[0] / ms[2]);
                fflush(stdout);
                free_call(&v.packed);
                for (int s = 0; s < SEQUENCES; ++s) free_call(&v.separate[s]);
                free_call(&v.padded);
                release(&v.cu);
            }
}

/* ---- Paged decoding ------------------------------------------------------------------------- */

typedef struct paged_bench {
    call dense, paged;
    buffer table, lengths;
} paged_bench;

static void run_paged(void* context, int which) {
    paged_bench* p = (paged_bench*)context;
    run(which == 0 ? &p->dense : &p->paged, 0);
}

static void bench_paged(void) {
    printf("\n== paged decoding vs dense decoding at the same lengths (target <= 1.15x)\n");
    printf("   Hq 32, Hkv 8, D 128, Nq 1; caches [blocks, block size, Hkv, D], blocks shuffled\n");
    printf("%-6s %3s %6s %6s %10s %10s %8s %9s\n", "dtype", "B", "Nk", "block", "dense ms",
           "paged ms", "ratio", "GB/s");
    const mfa_dtype dtypes[2] = {MFA_DTYPE_F32, MFA_DTYPE_BF16};
    const int64_t batches[2] = {1, 8}, keys[2] = {4096, 32768}, block_sizes[2] = {16, 256};
    for (int t = 0; t < 2; ++t)
        for (int bi = 0; bi < 2; ++bi)
            for (int ki = 0; ki < 2; ++ki)
                for (int si = 0; si < 2; ++si) {
                    const int64_t B = batches[bi], nk = keys[ki], bs = block_sizes[si];
                    const int64_t hq = 32, hkv = 8, d = 128;
                    if (B * nk * hkv * d * 2 * (int64_t)mfa_dtype_size(dtypes[t]) > (3ll << 30))
                        continue;
                    paged_bench p;
                    make_call(&p.dense, dtypes[t], B, hq, hkv, 1, nk, d, 0);
                    const int64_t per_sequence = nk / bs, blocks = B * per_sequence;
                    make_call(&p.paged, dtypes[t], B, hq, hkv, 1, 1, d, 0);
                    release(&p.paged.k);
                    release(&p.paged.v);
                    p.paged.k = make(dtypes[t], blocks, bs, hkv, d, 1);
                    p.paged.v = make(dtypes[t], blocks, bs, hkv, d, 1);
                    /* [blocks, block size, Hkv, D] memory seen as [blocks, Hkv, block size, D]. */
                    for (int w = 0; w < 2; ++w) {
                        mfa_array* a = w ? &p.paged.v.a : &p.paged.k.a;
                        a->shape[1] = hkv, a->shape[2] = bs;
                        a->strides[1] = d, a->strides[2] = hkv * d;
                    }
                    p.paged.args.k = &p.paged.k.a, p.paged.args.v = &p.paged.v.a;
                    p.table = make(MFA_DTYPE_I32, B, 1, 1, per_sequence, 0);
                    p.lengths = make(MFA_DTYPE_I32, B, 1, 1, 1, 0);
                    int32_t* table = (int32_t*)p.table.data;
                    for (int64_t i = 0; i < blocks; ++i) table[i] = (int32_t)i;
                    for (int64_t i = blocks - 1; i > 0; --i) { /* shuffled */
                        const int64_t j = (int64_t)((uniform() + 1.0f) * 0.5f * (float)i);
                        const int32_t x = table[i];
                        table[i] = table[j];
                        table[j] = x;
                    }
                    for (int64_t b = 0; b < B; ++b) ((int32_t*)p.lengths.data)[b] = (int32_t)nk;
                    p.paged.args.block_table = &p.table.a;
                    p.paged.args.cache_seqlens = &p.lengths.a;
                    double ms[2];
                    time_variants(run_paged, &p, 2, ms);
                    const double bytes =
                        2.0 * (double)(B * nk * hkv * d) * (double)mfa_dtype_size(dtypes[t]);
                    printf("%-6s %3lld %6lld %6lld %10.3f %10.3f %7.3fx %9.1f\n",
                           mfa_dtype_name(dtypes[t]), (long long)B, (long long)nk, (long long)bs,
                           1e3 * ms[0], 1e3 * ms[1], ms[1] / ms[0], bytes / ms[0] * 1e-9);
                    fflush(stdout);
                    free_call(&p.dense);
                    free_call(&p.paged);
                    release(&p.table);
                    release(&p.lengths);
                }
}

/* ---- Decoding with 16 rows per key/value head -------------------------------------------------- */

typedef struct decode_bench {
    call one, four;
} decode_bench;

static void run_decode(void* context, int which) {
    decode_bench* d = (decode_bench*)context;
    run(which == 0 ? &d->one : &d->four, 0);
}

static void bench_decode(void) {
    printf("\n== decoding: 4 queries per head (16 rows per key/value head) vs 1 (4 rows), same "
           "cache\n");
    printf("   B 1, Hq 32, Hkv 8, D 128; equal times mean the 16-row case is as memory-bound\n");
    printf("%-6s %6s %10s %10s %8s %9s %9s\n", "dtype", "Nk", "Nq 1 ms", "Nq 4 ms", "ratio",
           "GB/s 1", "GB/s 4");
    const mfa_dtype dtypes[2] = {MFA_DTYPE_F32, MFA_DTYPE_BF16};
    const int64_t keys[2] = {4096, 32768};
    for (int t = 0; t < 2; ++t)
        for (int ki = 0; ki < 2; ++ki) {
            decode_bench d;
            make_call(&d.one, dtypes[t], 1, 32, 8, 1, keys[ki], 128, 0);
            make_call(&d.four, dtypes[t], 1, 32, 8, 4, keys[ki], 128, 0);
            d.four.args.k = &d.one.k.a, d.four.args.v = &d.one.v.a;
            double ms[2];
            time_variants(run_decode, &d, 2, ms);
            const double bytes =
                2.0 * (double)(keys[ki] * 8 * 128) * (double)mfa_dtype_size(dtypes[t]);
            printf("%-6s %6lld %10.3f %10.3f %7.3fx %9.1f %9.1f\n", mfa_dtype_name(dtypes[t]),
                   (long long)keys[ki], 1e3 * ms[0], 1e3 * ms[1], ms[1] / ms[0],
                   bytes / ms[0] * 1e-9, bytes / ms[1] * 1e-9);
            fflush(stdout);
            free_call(&d.one);
            free_call(&d.four);
        }
}

static void print_machine(void) {
    char line[256], model[200] = "unknown CPU";
    FILE* info = fopen("/proc/cpuinfo", "r");
    if (info) {
        while (fgets(line, sizeof line, info))
            if (strncmp(line, "model name", 10) == 0) {
                const char* colon = strchr(line, ':');
                if (colon) snprintf(model, sizeof model, "%s", colon + 2);
                model[strcspn(model, "\n")] = '\0';
                break;
            }
        fclose(info);
    }
    double load[3] = {0, 0, 0};
    FILE* avg = fopen("/proc/loadavg", "r");
    if (avg) {
        if (fscanf(avg, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(avg);
    }
    printf("%s; libmfa %s on %s; load average %.2f %.2f %.2f; medians of %d interleaved runs\n",
           model, mfa_version_string(), mfa_context_device_name(ctx), load[0], load[1], load[2],
           repeats);
}

int main(int argc, char** argv) {
    const char* only = NULL;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
            repeats = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: %s [--repeats N (1-64)] [--only modifiers|mask|varlen|paged|"
                    "decode]\n",
                    argv[0]);
            return 2;
        }
    }
    if (repeats < 1 || repeats > 64) {
        fprintf(stderr, "--repeats must be in [1, 64]\n");
        return 2;
    }
    if (mfa_context_create(MFA_BACKEND_CPU, NULL, &ctx) != MFA_OK) {
        fprintf(stderr, "no cpu context: %s\n", mfa_last_error());
        return 1;
    }
    print_machine();
    if (!only || strcmp(only, "modifiers") == 0) bench_modifiers();
    if (!only || strcmp(only, "mask") == 0) bench_mask();
    if (!only || strcmp(only, "varlen") == 0) bench_varlen();
    if (!only || strcmp(only, "paged") == 0) bench_paged();
    if (!only || strcmp(only, "decode") == 0) bench_decode();
    mfa_context_destroy(ctx);
    return 0;
}
