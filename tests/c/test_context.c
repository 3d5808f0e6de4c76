/* Version, names, backend availability, capability queries and the page-aligned allocator. */
#include <stdint.h>

#include "test_util.h"

static void test_version(void) {
    CHECK(mfa_version_number() == MFA_VERSION_NUMBER, "library %u vs header %d",
          mfa_version_number(), MFA_VERSION_NUMBER);
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", MFA_VERSION_MAJOR, MFA_VERSION_MINOR,
             MFA_VERSION_PATCH);
    CHECK(strcmp(mfa_version_string(), expected) == 0, "version string %s, expected %s",
          mfa_version_string(), expected);
}

static void test_names(void) {
    for (int s = 0; s <= MFA_ERROR_INTERNAL; ++s) {
        const char* name = mfa_status_string((mfa_status)s);
        CHECK(name[0] != '\0' && strcmp(name, "unknown status") != 0, "status %d has no name", s);
        for (int t = 0; t < s; ++t)
            CHECK(strcmp(name, mfa_status_string((mfa_status)t)) != 0,
                  "statuses %d and %d share a name", s, t);
    }
    CHECK(strcmp(mfa_status_string((mfa_status)1234), "unknown status") == 0,
          "unknown status name");
    CHECK(mfa_dtype_size(MFA_DTYPE_F32) == 4 && mfa_dtype_size(MFA_DTYPE_F16) == 2 &&
              mfa_dtype_size(MFA_DTYPE_BF16) == 2 && mfa_dtype_size((mfa_dtype)9) == 0,
          "dtype sizes");
    CHECK(strcmp(mfa_dtype_name(MFA_DTYPE_BF16), "bf16") == 0, "bf16 name");
    CHECK(strcmp(mfa_backend_name(MFA_BACKEND_METAL_SIM), "metal-sim") == 0, "metal-sim name");
    CHECK(strcmp(mfa_backend_name((mfa_backend)77), "unknown") == 0, "unknown backend name");
}

static void test_defaults(void) {
    mfa_attention_params p;
    memset(&p, 0x5a, sizeof p);
    mfa_attention_params_init(&p);
    CHECK(p.struct_size == sizeof p && p.scale == 0.0f && p.causal == 0 &&
              p.alignment == MFA_ALIGN_BOTTOM_RIGHT && p.window_left == -1 && p.window_right == -1,
          "attention params defaults");
    mfa_context_options o;
    memset(&o, 0x5a, sizeof o);
    mfa_context_options_init(&o);
    CHECK(o.struct_size == sizeof o && o.num_threads == 0 && o.gpu_family == MFA_GPU_FAMILY_NONE &&
              o.sim_schedule_seed == 0,
          "context options defaults");
}

static void test_cpu_context(void) {
    CHECK(mfa_backend_available(MFA_BACKEND_CPU) == 1, "cpu must always be available");
    CHECK(mfa_backend_available(MFA_BACKEND_AUTO) == 1, "auto must always be available");
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.num_threads = 3;
    mfa_context* ctx = NULL;
    CHECK(mfa_context_create(MFA_BACKEND_CPU, &options, &ctx) == MFA_OK, "%s", mfa_last_error());
    if (!ctx) return;
    CHECK(mfa_context_backend(ctx) == MFA_BACKEND_CPU, "backend of a cpu context");
    CHECK(mfa_context_device_name(ctx)[0] != '\0', "empty device name");
    mfa_capabilities caps;
    caps.struct_size = sizeof caps;
    CHECK(mfa_context_capabilities(ctx, &caps) == MFA_OK, "%s", mfa_last_error());
    CHECK(caps.struct_size == sizeof caps, "struct_size must be preserved");
    CHECK(caps.dtypes == 7u, "cpu dtypes mask %u, expected f32|f16|bf16", caps.dtypes);
    const uint32_t modifiers = MFA_FEATURE_MASK | MFA_FEATURE_BLOCK_MASK | MFA_FEATURE_SOFTCAP |
                               MFA_FEATURE_ALIBI | MFA_FEATURE_SINKS;
    const uint32_t all = MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE | MFA_FEATURE_CAUSAL |
                         MFA_FEATURE_WINDOW | MFA_FEATURE_GQA | MFA_FEATURE_VALUE_HEAD_DIM |
                         MFA_FEATURE_STRIDES | modifiers | MFA_FEATURE_VARLEN |
                         MFA_FEATURE_PAGED_KV | MFA_FEATURE_INITIAL_STATE;
    const uint32_t backward = MFA_FEATURE_CAUSAL | MFA_FEATURE_WINDOW | MFA_FEATURE_GQA |
                              MFA_FEATURE_VALUE_HEAD_DIM | MFA_FEATURE_STRIDES | modifiers |
                              MFA_FEATURE_VARLEN;
    CHECK(caps.features == all, "cpu features %u, expected %u", caps.features, all);
    CHECK(caps.backward_features == backward, "cpu backward features %u, expected %u",
          caps.backward_features, backward);
    CHECK(caps.max_head_dim >= 512, "cpu max head dim %lld < 512", (long long)caps.max_head_dim);
    CHECK(caps.gpu_family == MFA_GPU_FAMILY_NONE, "cpu has no gpu family");
    CHECK(caps.num_threads == 3, "cpu threads %d, expected the 3 asked for", caps.num_threads);

    /* An older caller knowing only the first two fields gets just those. */
    struct {
        size_t struct_size;
        uint32_t dtypes;
        uint32_t sentinel;
    } old;
    old.struct_size = offsetof(mfa_capabilities, features);
    old.sentinel = 0xdeadbeef;
    CHECK(mfa_context_capabilities(ctx, (mfa_capabilities*)(void*)&old) == MFA_OK, "%s",
          mfa_last_error());
    CHECK(old.dtypes == 7u && old.sentinel == 0xdeadbeef, "prefix copy of capabilities");
    mfa_context_destroy(ctx);

    CHECK(mfa_context_create(MFA_BACKEND_AUTO, NULL, &ctx) == MFA_OK, "%s", mfa_last_error());
    if (ctx) {
        mfa_backend b = mfa_context_backend(ctx);
        CHECK(b == (mfa_backend_available(MFA_BACKEND_METAL) ? MFA_BACKEND_METAL : MFA_BACKEND_CPU),
              "auto picked %s", mfa_backend_name(b));
        mfa_context_destroy(ctx);
    }
}

static void test_metal_sim_context(void) {
    if (!mfa_backend_available(MFA_BACKEND_METAL_SIM)) {
        printf("metal-sim not built: its capability checks are skipped\n");
        return;
    }
    const mfa_gpu_family families[] = {MFA_GPU_FAMILY_APPLE7, MFA_GPU_FAMILY_APPLE8,
                                       MFA_GPU_FAMILY_APPLE9};
    for (size_t i = 0; i < 3; ++i) {
        mfa_context_options options;
        mfa_context_options_init(&options);
        options.gpu_family = families[i];
        mfa_context* ctx = NULL;
        CHECK(mfa_context_create(MFA_BACKEND_METAL_SIM, &options, &ctx) == MFA_OK, "%s",
              mfa_last_error());
        if (!ctx) continue;
        mfa_capabilities caps;
        caps.struct_size = sizeof caps;
        CHECK(mfa_context_capabilities(ctx, &caps) == MFA_OK, "%s", mfa_last_error());
        CHECK(caps.gpu_family == families[i], "simulated family %d, asked for %d",
              (int)caps.gpu_family, (int)families[i]);
        CHECK(caps.features & MFA_FEATURE_BACKWARD, "metal-sim must run backward");
        mfa_context_destroy(ctx);
    }
}

static void test_alloc(void) {
    size_t page = mfa_page_size();
    CHECK(page >= 4096 && (page & (page - 1)) == 0, "page size %zu", page);
    const size_t sizes[] = {0, 1, 4096, 100000};
    for (size_t i = 0; i < 4; ++i) {
        unsigned char* p = (unsigned char*)mfa_alloc(sizes[i]);
        CHECK(p != NULL, "mfa_alloc(%zu): %s", sizes[i], mfa_last_error());
        if (!p) continue;
        CHECK(((uintptr_t)p % page) == 0, "mfa_alloc(%zu) not page aligned", sizes[i]);
        memset(p, 1, sizes[i]);
        mfa_free(p);
    }
    CHECK(mfa_alloc(SIZE_MAX) == NULL, "mfa_alloc(SIZE_MAX) must fail");
    CHECK(strstr(mfa_last_error(), "mfa_alloc") != NULL, "mfa_alloc error message: %s",
          mfa_last_error());
    mfa_free(NULL);
}

int main(void) {
    test_version();
    test_names();
    test_defaults();
    test_cpu_context();
    test_metal_sim_context();
    test_alloc();
    return test_finish("test_context");
}
