/* 64-bit indexing: element offsets far beyond 2^31 (and 2^32), without the memory.
 *
 * One sparse mapping of SPAN bytes (MAP_NORESERVE: pages cost memory only once touched) holds
 * small tensors whose strides are billions of elements, so that every index * stride product
 * the library forms for them passes 2^31 and 2^32 elements. Negative strides start from the
 * top of the mapping. Inputs and outputs both live there; only the few pages the tensors
 * actually use are ever touched. A 32-bit product anywhere would read or write the wrong
 * address: zeros of an untouched page instead of the inputs (a wrong result), a write the
 * NaN-filled outputs do not receive (a NaN left over), or a fault outside the mapping.
 *
 * Every available backend runs every case. The cpu backend must compute them; another backend
 * may instead answer MFA_ERROR_UNSUPPORTED with a message and nothing written. */
#define _GNU_SOURCE
#include <sys/mman.h>

#include "test_reference.h"

#define SPAN ((size_t)1 << 36) /* 64 GiB of address space */

static char* region;

/* A tensor placed in the sparse region with explicit strides; `origin` is the byte offset of
 * element (0, 0, 0, 0) inside the region. */
static mfa_tensor sparse_tensor(mfa_dtype dtype, const int64_t shape[4], const int64_t strides[4],
                                size_t origin) {
    mfa_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.data = region + origin;
    for (int d = 0; d < 4; ++d) {
        t.shape[d] = shape[d];
        t.strides[d] = strides[d];
    }
    return t;
}

static void fill(const mfa_tensor* t, float nan_value) {
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d)
                    test_set(t, b, h, s, d, isnan(nan_value) ? nan_value : (float)test_uniform());
}

typedef struct large_case {
    const char* name;
    mfa_dtype dtype;
    int64_t b, hq, hkv, nq, nk, d, dv;
    int64_t q_stride[4], k_stride[4], v_stride[4], out_stride[4];
    size_t q_origin, k_origin, v_origin, out_origin, lse_origin;
} large_case;

#define G31 ((int64_t)1 << 31)
#define G32 ((int64_t)1 << 32)
#define GIB ((size_t)1 << 30)

static const large_case cases[] = {
    /* Keys and values 2^31 + 5 elements apart along the sequence: offsets up to ~4 * 2^31. */
    {"key rows 2^31+5 apart (f16)",
     MFA_DTYPE_F16,
     1,
     2,
     1,
     3,
     4,
     8,
     8,
     {64, 24, 8, 1},
     {0, 0, G31 + 5, 1},
     {0, 0, G31 + 5, 1},
     {64, 24, 8, 1},
     0,
     1 * GIB,
     2 * GIB,
     40 * GIB,
     63 * GIB},
    /* Batches 2^32 + 3 elements apart in every tensor, outputs included: the batch term of an
     * offset exceeds 32 bits, while each batch's block is small and contiguous. (The inputs
     * interleave; outputs sit apart, since an output may not lie inside an input's extent.) */
    {"batches 2^32+3 apart (f32)",
     MFA_DTYPE_F32,
     2,
     1,
     1,
     5,
     6,
     4,
     3,
     {G32 + 3, 64, 4, 1},
     {G32 + 3, 64, 4, 1},
     {G32 + 3, 64, 4, 1},
     {G32 + 3, 64, 4, 1},
     0,
     1024,
     2048,
     40 * GIB,
     60 * GIB},
    /* Negative strides of more than 2^31 elements, from the top of the mapping downwards, and
     * grouped-query heads that also sit 2^31 elements apart. */
    {"negative strides beyond 2^31 (bf16)",
     MFA_DTYPE_BF16,
     1,
     4,
     2,
     2,
     3,
     16,
     8,
     {0, -(G31 + 1), -16, 1},
     {0, -G31 - 77, -(G31 / 2), 1},
     {0, G31 - 3, 8, 1},
     {0, 32, 8, 1},
     30 * GIB,
     62 * GIB,
     20 * GIB,
     40 * GIB,
     50 * GIB},
};

static void run_case(mfa_context* ctx, const char* backend, const large_case* c) {
    const int64_t q_shape[4] = {c->b, c->hq, c->nq, c->d}, k_shape[4] = {c->b, c->hkv, c->nk, c->d};
    const int64_t v_shape[4] = {c->b, c->hkv, c->nk, c->dv},
                  out_shape[4] = {c->b, c->hq, c->nq, c->dv};
    const int64_t lse_shape[4] = {c->b, c->hq, c->nq, 1},
                  lse_stride[4] = {c->hq * c->nq, c->nq, 1, 1};
    const mfa_tensor q = sparse_tensor(c->dtype, q_shape, c->q_stride, c->q_origin);
    const mfa_tensor k = sparse_tensor(c->dtype, k_shape, c->k_stride, c->k_origin);
    const mfa_tensor v = sparse_tensor(c->dtype, v_shape, c->v_stride, c->v_origin);
    const mfa_tensor out = sparse_tensor(c->dtype, out_shape, c->out_stride, c->out_origin);
    const mfa_tensor lse = sparse_tensor(MFA_DTYPE_F32, lse_shape, lse_stride, c->lse_origin);
    fill(&q, 0);
    fill(&k, 0);
    fill(&v, 0);
    fill(&out, NAN); /* every element must be overwritten */
    fill(&lse, NAN);

    mfa_attention_params params;
    mfa_attention_params_init(&params);
    params.causal = 1;
    const mfa_status s = mfa_attention_forward(ctx, &params, &q, &k, &v, &out, &lse);
    if (s == MFA_ERROR_UNSUPPORTED && strcmp(backend, "cpu") != 0) {
        CHECK(mfa_last_error()[0] != '\0', "%s / %s: unsupported without a message", backend,
              c->name);
        CHECK(isnan(test_get(&out, 0, 0, 0, 0)), "%s / %s: unsupported but out was written",
              backend, c->name);
        printf("test_large_offsets: %s declines \"%s\": %s\n", backend, c->name, mfa_last_error());
        return;
    }
    CHECK(s == MFA_OK, "%s / %s: forward failed: %s", backend, c->name, mfa_last_error());
    if (s != MFA_OK) return;
    const ref_problem p = ref_problem_of(&q, &k, &v, &params);
    ref_result r = ref_forward(&p, &q, &k, &v);
    char why[256];
    CHECK(ref_compare(&out, c->dtype, r.out, r.out_mag, c->nk + c->d, r.max_score, why, sizeof why),
          "%s / %s: out: %s", backend, c->name, why);
    CHECK(ref_compare(&lse, MFA_DTYPE_F32, r.lse, r.lse_mag, c->nk + c->d, r.max_score, why,
                      sizeof why),
          "%s / %s: lse: %s", backend, c->name, why);
    ref_free(&r);
}

int main(void) {
    region = (char*)mmap(NULL, SPAN, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED) {
        printf("test_large_offsets: cannot reserve %zu bytes of address space here; skipped\n",
               SPAN);
        return 77;
    }
    const mfa_backend backends[] = {MFA_BACKEND_CPU, MFA_BACKEND_METAL_SIM, MFA_BACKEND_METAL};
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; ++i) {
        if (!mfa_backend_available(backends[i])) continue;
        mfa_context* ctx = test_context(backends[i], NULL, mfa_backend_name(backends[i]));
        if (!ctx) continue;
        for (size_t j = 0; j < sizeof cases / sizeof cases[0]; ++j)
            run_case(ctx, mfa_backend_name(backends[i]), &cases[j]);
        mfa_context_destroy(ctx);
        /* Give the touched pages back, so the next backend starts from zeros. */
        madvise(region, SPAN, MADV_DONTNEED);
    }
    munmap(region, SPAN);
    return test_finish("test_large_offsets");
}
