/* The core's validation and the problems it builds (core/validate.h, core/backend.h), against a
 * scripted backend: one with device buffers, which no backend implements yet, and with every
 * capability bit under the test's control. This holds the contract backends implement against:
 * which fields a problem fills, in which memory, with which strides, lengths and bands; device
 * arrays bounded by their buffer's length; integer arrays read through buffer_contents; and each
 * feature checked against the direction's capability bits after every argument is valid.
 *
 * validate.h is hidden inside libmfa, so this test compiles the core's sources itself. */
#include "core/validate.h"

#include "test_util.h"

/* ---- A scripted device ------------------------------------------------------------------- */

typedef struct fake_buffer {
    size_t length;
    unsigned char* bytes;
    int hidden; /* the CPU cannot see its contents (metal: private storage) */
} fake_buffer;

static int length_queries;

static mfa_status fake_create(void* state, size_t length, void** buffer) {
    (void)state, (void)length, (void)buffer;
    return mfa_set_error(MFA_ERROR_INTERNAL, "not used");
}
static void* fake_contents(void* state, void* buffer) {
    (void)state;
    const fake_buffer* b = (const fake_buffer*)buffer;
    return b->hidden ? NULL : b->bytes;
}
static size_t fake_length(void* state, void* buffer) {
    (void)state;
    ++length_queries;
    return ((const fake_buffer*)buffer)->length;
}
static void fake_destroy(void* state, void* buffer) { (void)state, (void)buffer; }

static const mfa_device_ops fake_device = {fake_create, fake_contents, fake_length, fake_destroy,
                                           NULL,        NULL,          NULL,        NULL,
                                           NULL,        NULL,          NULL};

static const uint32_t all_features =
    MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE | MFA_FEATURE_CAUSAL | MFA_FEATURE_WINDOW |
    MFA_FEATURE_GQA | MFA_FEATURE_VALUE_HEAD_DIM | MFA_FEATURE_STRIDES | MFA_FEATURE_MASK |
    MFA_FEATURE_BLOCK_MASK | MFA_FEATURE_SOFTCAP | MFA_FEATURE_ALIBI | MFA_FEATURE_SINKS |
    MFA_FEATURE_VARLEN | MFA_FEATURE_PAGED_KV | MFA_FEATURE_INITIAL_STATE |
    MFA_FEATURE_DEVICE_BUFFERS | MFA_FEATURE_ENCODE;

static mfa_capabilities caps;
static mfa_target target;

static void reset_target(void) {
    memset(&caps, 0, sizeof caps);
    caps.struct_size = sizeof caps;
    caps.dtypes = 1u << MFA_DTYPE_F32 | 1u << MFA_DTYPE_F16 | 1u << MFA_DTYPE_BF16;
    caps.features = all_features;
    caps.backward_features = all_features & ~(MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE |
                                              MFA_FEATURE_PAGED_KV | MFA_FEATURE_INITIAL_STATE |
                                              MFA_FEATURE_DEVICE_BUFFERS | MFA_FEATURE_ENCODE);
    caps.max_head_dim = 1024;
    target.caps = &caps;
    target.backend = "fake";
    target.device = &fake_device;
    target.state = NULL;
    target.tensors = false;
}

static void expect(const char* label, mfa_status got, mfa_status expected, const char* substring) {
    CHECK(got == expected, "%s: status %s, expected %s; message: %s", label, mfa_status_string(got),
          mfa_status_string(expected), mfa_last_error());
    if (expected != MFA_OK)
        CHECK(strstr(mfa_last_error(), substring) != NULL,
              "%s: message \"%s\" does not mention \"%s\"", label, mfa_last_error(), substring);
}

/* ---- Arrays -------------------------------------------------------------------------------- */

enum { B = 2, HQ = 4, HKV = 2, NQ = 5, NK = 7, D = 8, DV = 6 };

/* A contiguous [b, h, s, d] array at byte_offset in buffer (device) or in host memory. */
static mfa_array device_array(fake_buffer* buffer, int64_t byte_offset, mfa_dtype dtype, int64_t b,
                              int64_t h, int64_t s, int64_t d) {
    mfa_array a;
    memset(&a, 0, sizeof a);
    a.buffer = buffer;
    a.byte_offset = byte_offset;
    a.dtype = dtype;
    const int64_t shape[4] = {b, h, s, d}, strides[4] = {h * s * d, s * d, d, 1};
    memcpy(a.shape, shape, sizeof shape);
    memcpy(a.strides, strides, sizeof strides);
    return a;
}

static int64_t bytes_of(const mfa_array* a) {
    return a->shape[0] * a->shape[1] * a->shape[2] * a->shape[3] *
           (int64_t)mfa_dtype_size(a->dtype);
}

/* A dense forward problem laid out back to back in one buffer. */
typedef struct dense_call {
    fake_buffer buffer;
    mfa_array q, k, v, out, lse;
    mfa_attention_args args;
} dense_call;

static void dense_call_make(dense_call* c) {
    memset(c, 0, sizeof *c);
    c->buffer.length = 1 << 16;
    c->buffer.bytes = (unsigned char*)calloc(1, c->buffer.length);
    int64_t at = 64;
    c->q = device_array(&c->buffer, at, MFA_DTYPE_F32, B, HQ, NQ, D);
    at += bytes_of(&c->q);
    c->k = device_array(&c->buffer, at, MFA_DTYPE_F32, B, HKV, NK, D);
    at += bytes_of(&c->k);
    c->v = device_array(&c->buffer, at, MFA_DTYPE_F32, B, HKV, NK, DV);
    at += bytes_of(&c->v);
    c->out = device_array(&c->buffer, at, MFA_DTYPE_F32, B, HQ, NQ, DV);
    at += bytes_of(&c->out);
    c->lse = device_array(&c->buffer, at, MFA_DTYPE_F32, B, HQ, NQ, 1);
    mfa_attention_args_init(&c->args, sizeof c->args);
    c->args.q = &c->q, c->args.k = &c->k, c->args.v = &c->v, c->args.out = &c->out;
    c->args.lse = &c->lse;
}

static void dense_call_free(dense_call* c) { free(c->buffer.bytes); }

static mfa_status build(const mfa_attention_args* args, mfa_direction direction, bool encode,
                        mfa_problem* problem) {
    return mfa_build_problem(&target, direction, NULL, args, encode, problem);
}

/* ---- Device arrays ------------------------------------------------------------------------- */

static void test_device_views(void) {
    dense_call c;
    dense_call_make(&c);
    mfa_problem p;
    length_queries = 0;
    expect("dense device call", build(&c.args, MFA_FORWARD, false, &p), MFA_OK, "");
    CHECK(length_queries == 5, "every device array is bounded by its buffer (%d queries)",
          length_queries);
    CHECK(p.memory == MFA_MEMORY_DEVICE && p.layout == MFA_LAYOUT_DENSE && p.features == 0,
          "memory %d, layout %d, features 0x%x", (int)p.memory, (int)p.layout,
          (unsigned)p.features);
    CHECK(p.q.data == NULL && p.q.buffer == &c.buffer && p.q.byte_offset == 64 &&
              p.out.byte_offset == c.out.byte_offset && mfa_view_present(&p.lse),
          "device views carry buffer and byte_offset, never data");
    CHECK(!mfa_view_present(&p.mask) && !mfa_view_present(&p.dq), "absent views");
    expect("encode takes device arrays", build(&c.args, MFA_FORWARD, true, &p), MFA_OK, "");

    /* Every byte inside the buffer: the end, then the start through a negative stride. */
    c.lse.byte_offset = (int64_t)c.buffer.length - bytes_of(&c.lse) + 4;
    expect("past the end", build(&c.args, MFA_FORWARD, false, &p), MFA_ERROR_INVALID_ARGUMENT,
           "lse: the view reaches bytes 65380 to 65539 of its buffer (byte_offset 65380, element "
           "offsets 0 to 39), outside the buffer's 65536 bytes");
    c.lse.byte_offset = (int64_t)c.buffer.length - bytes_of(&c.lse);
    expect("at the end", build(&c.args, MFA_FORWARD, false, &p), MFA_OK, "");
    c.q.strides[2] = -D;
    c.q.byte_offset = (NQ - 1) * D * 4 - 4; /* one element short of the last row's start */
    expect("before the start", build(&c.args, MFA_FORWARD, false, &p), MFA_ERROR_INVALID_ARGUMENT,
           "q: the view reaches bytes -4 to");
    c.q.byte_offset = (NQ - 1) * D * 4;
    expect("reversed rows from byte 0", build(&c.args, MFA_FORWARD, false, &p), MFA_OK, "");
    CHECK(p.q.byte_offset == (NQ - 1) * D * 4 && p.q.stride[2] == -D, "negative stride kept");
    c.q.byte_offset = 2;
    expect("misaligned offset", build(&c.args, MFA_FORWARD, false, &p), MFA_ERROR_INVALID_ARGUMENT,
           "q.byte_offset = 2 is not a multiple of its element size (4 bytes)");
    dense_call_free(&c);

    /* Overlap is within a buffer: the same offsets in two buffers are distinct memory. */
    dense_call_make(&c);
    c.out.byte_offset = c.q.byte_offset + 4;
    expect("out overlaps q in one buffer", build(&c.args, MFA_FORWARD, false, &p),
           MFA_ERROR_INVALID_ARGUMENT, "out overlaps q");
    fake_buffer other = {1 << 16, NULL, 0};
    c.out.buffer = &other;
    expect("same offsets, two buffers", build(&c.args, MFA_FORWARD, false, &p), MFA_OK, "");
    dense_call_free(&c);

    /* One kind of memory per call. */
    dense_call_make(&c);
    float host[B * HKV * NK * D];
    c.k.buffer = NULL;
    c.k.byte_offset = 0;
    c.k.data = host;
    expect("mixed memory", build(&c.args, MFA_FORWARD, false, &p), MFA_ERROR_INVALID_ARGUMENT,
           "k is in host memory but q is in a device buffer");
    dense_call_free(&c);

    /* encode: device arrays only. */
    float q[B * HQ * NQ * D], k[B * HKV * NK * D], v[B * HKV * NK * DV], out[B * HQ * NQ * DV];
    mfa_array hq = device_array(NULL, 0, MFA_DTYPE_F32, B, HQ, NQ, D);
    mfa_array hk = device_array(NULL, 0, MFA_DTYPE_F32, B, HKV, NK, D);
    mfa_array hv = device_array(NULL, 0, MFA_DTYPE_F32, B, HKV, NK, DV);
    mfa_array ho = device_array(NULL, 0, MFA_DTYPE_F32, B, HQ, NQ, DV);
    hq.data = q, hk.data = k, hv.data = v, ho.data = out;
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    args.q = &hq, args.k = &hk, args.v = &hv, args.out = &ho;
    expect("encode of host arrays", build(&args, MFA_FORWARD, true, &p), MFA_ERROR_INVALID_ARGUMENT,
           "mfa_attention_encode takes device arrays only");
    expect("compute of host arrays", build(&args, MFA_FORWARD, false, &p), MFA_OK, "");
    CHECK(p.memory == MFA_MEMORY_HOST && p.q.data == (char*)q && p.q.buffer == NULL,
          "host views carry data");
    /* A host array's byte_offset moves its origin (DLPack's data + byte_offset). */
    hq.data = (char*)q - 64;
    hq.byte_offset = 64;
    expect("host byte_offset", build(&args, MFA_FORWARD, false, &p), MFA_OK, "");
    CHECK(p.q.data == (char*)q && p.q.byte_offset == 0, "host origin is data + byte_offset");
    /* Without device buffers, a device array is unsupported, named. */
    caps.features &= ~MFA_FEATURE_DEVICE_BUFFERS;
    dense_call_make(&c);
    expect("no device buffers", build(&c.args, MFA_FORWARD, false, &p), MFA_ERROR_UNSUPPORTED,
           "q is in a device buffer: the fake backend takes host memory only");
    dense_call_free(&c);
    reset_target();
}

/* ---- Problems: what backends receive ------------------------------------------------------ */

static void test_dense_problem_fields(void) {
    float q[B * HQ * NQ * D], k[B * HKV * NK * D], v[B * HKV * NK * DV], out[B * HQ * NQ * DV];
    float lse[B * HQ * NQ], slopes[HQ], sinks[HQ];
    float mask[NQ * NK];
    mfa_array arrays[8];
    const struct {
        void* data;
        int64_t b, h, s, d;
    } shapes[8] = {{q, B, HQ, NQ, D},    {k, B, HKV, NK, D},  {v, B, HKV, NK, DV},
                   {out, B, HQ, NQ, DV}, {lse, B, HQ, NQ, 1}, {slopes, 1, HQ, 1, 1},
                   {sinks, 1, HQ, 1, 1}, {mask, 1, 1, NQ, NK}};
    for (int i = 0; i < 8; ++i) {
        arrays[i] = device_array(NULL, 0, MFA_DTYPE_F32, shapes[i].b, shapes[i].h, shapes[i].s,
                                 shapes[i].d);
        arrays[i].data = shapes[i].data;
    }
    arrays[7].strides[0] = 12345; /* a size-1 dimension: never stepped, so stride 0 */
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    args.q = &arrays[0], args.k = &arrays[1], args.v = &arrays[2], args.out = &arrays[3];
    args.lse = &arrays[4], args.alibi_slopes = &arrays[5], args.sinks = &arrays[6];
    args.mask = &arrays[7];
    args.softcap = 20.0f;
    mfa_attention_params params;
    mfa_attention_params_init(&params);
    params.causal = 1;
    params.window_left = 2;
    params.alignment = MFA_ALIGN_TOP_LEFT;
    mfa_problem p;
    expect("dense with modifiers",
           mfa_build_problem(&target, MFA_FORWARD, &params, &args, false, &p), MFA_OK, "");
    CHECK(p.features ==
              (MFA_FEATURE_MASK | MFA_FEATURE_SOFTCAP | MFA_FEATURE_ALIBI | MFA_FEATURE_SINKS),
          "features 0x%x", (unsigned)p.features);
    CHECK(p.softcap == 20.0f && p.mask_dtype == MFA_DTYPE_F32 && p.initial_state == 0, "scalars");
    CHECK(p.mask.stride[0] == 0 && p.mask.stride[1] == 0 && p.mask.stride[2] == NK &&
              p.mask.stride[3] == 1,
          "mask broadcasts through zero strides: [%lld, %lld, %lld, %lld]",
          (long long)p.mask.stride[0], (long long)p.mask.stride[1], (long long)p.mask.stride[2],
          (long long)p.mask.stride[3]);
    CHECK(p.alibi_slopes.stride[0] == 0 && p.alibi_slopes.stride[1] == 1 &&
              p.sinks.stride[1] == 1 && p.sinks.data == (char*)sinks,
          "per-head views");
    CHECK(p.alignment == MFA_ALIGN_TOP_LEFT && p.window_left == 2 && p.window_right == 0,
          "causal folds into window_right = 0 (got %lld)", (long long)p.window_right);
    int64_t lo, hi;
    mfa_visibility_band(NQ, NK, 0, 2, 0, &lo, &hi);
    CHECK(p.band_lo == lo && p.band_hi == hi && lo == -2 && hi == 0, "dense band [%lld, %lld]",
          (long long)p.band_lo, (long long)p.band_hi);
    mfa_problem_band(&p, 3, 9, &lo, &hi);
    CHECK(lo == -2 && hi == 0, "a sequence's band under top-left alignment");
    p.alignment = MFA_ALIGN_BOTTOM_RIGHT;
    mfa_problem_band(&p, 3, 9, &lo, &hi);
    CHECK(lo == 4 && hi == 6, "a sequence's band under bottom-right alignment: [%lld, %lld]",
          (long long)lo, (long long)hi);
    mfa_problem_band(&p, 4, 0, &lo, &hi); /* an empty sequence: no key, any band */
    CHECK(lo >= -4 && hi <= 0, "band of a sequence without keys stays clamped");

    /* Each feature against the capabilities of its direction, after the arguments. */
    caps.features &= ~MFA_FEATURE_ALIBI;
    expect("a missing feature", mfa_build_problem(&target, MFA_FORWARD, &params, &args, false, &p),
           MFA_ERROR_UNSUPPORTED,
           "the fake backend does not support ALiBi (args.alibi_slopes; MFA_FEATURE_ALIBI) in the "
           "forward");
    arrays[5].shape[1] = 3;
    expect("a bad argument before a missing feature",
           mfa_build_problem(&target, MFA_FORWARD, &params, &args, false, &p),
           MFA_ERROR_INVALID_ARGUMENT, "args.alibi_slopes.shape[1] (heads) must equal");
    arrays[5].shape[1] = HQ;
    reset_target();
    caps.backward_features &= ~MFA_FEATURE_SOFTCAP;
    expect("forward has it", mfa_build_problem(&target, MFA_FORWARD, &params, &args, false, &p),
           MFA_OK, "");
    float dout[B * HQ * NQ * DV], dq[B * HQ * NQ * D], dk[B * HKV * NK * D], dv[B * HKV * NK * DV];
    mfa_array grads[4] = {arrays[3], arrays[0], arrays[1], arrays[2]};
    grads[0].data = dout, grads[1].data = dq, grads[2].data = dk, grads[3].data = dv;
    args.dout = &grads[0], args.dq = &grads[1], args.dk = &grads[2], args.dv = &grads[3];
    expect("backward lacks it", mfa_build_problem(&target, MFA_BACKWARD, &params, &args, false, &p),
           MFA_ERROR_UNSUPPORTED, "softcap (args.softcap; MFA_FEATURE_SOFTCAP) in the backward");
    reset_target();
    expect("backward", mfa_build_problem(&target, MFA_BACKWARD, &params, &args, false, &p), MFA_OK,
           "");
    CHECK(p.dq.data == (char*)dq && p.out.data == (char*)out && !mfa_view_present(&p.dsinks),
          "backward views");
}

/* Packed sequences with their offsets in a device buffer, read through buffer_contents. */
static void test_varlen_problem(void) {
    enum { TOTAL_Q = 9, TOTAL_K = 12 };
    fake_buffer buffer = {1 << 16, (unsigned char*)calloc(1, 1 << 16), 0};
    int64_t at = 0;
    mfa_array q = device_array(&buffer, at, MFA_DTYPE_F16, 1, HQ, TOTAL_Q, D);
    at += bytes_of(&q);
    mfa_array k = device_array(&buffer, at, MFA_DTYPE_F16, 1, HKV, TOTAL_K, D);
    at += bytes_of(&k);
    mfa_array v = device_array(&buffer, at, MFA_DTYPE_F16, 1, HKV, TOTAL_K, DV);
    at += bytes_of(&v);
    mfa_array out = device_array(&buffer, at, MFA_DTYPE_F16, 1, HQ, TOTAL_Q, DV);
    at += bytes_of(&out);
    mfa_array cu_q = device_array(&buffer, at, MFA_DTYPE_I32, 1, 1, 1, 4);
    at += bytes_of(&cu_q);
    mfa_array cu_k = device_array(&buffer, at, MFA_DTYPE_I32, 1, 1, 1, 4);
    const int32_t offsets_q[4] = {0, 4, 4, TOTAL_Q}, offsets_k[4] = {0, 0, 5, TOTAL_K};
    memcpy(buffer.bytes + cu_q.byte_offset, offsets_q, sizeof offsets_q);
    memcpy(buffer.bytes + cu_k.byte_offset, offsets_k, sizeof offsets_k);
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    args.q = &q, args.k = &k, args.v = &v, args.out = &out;
    args.cu_seqlens_q = &cu_q, args.cu_seqlens_k = &cu_k;
    args.max_seqlen_q = 6, args.max_seqlen_k = 8;
    mfa_problem p;
    expect("packed sequences on the device", build(&args, MFA_FORWARD, false, &p), MFA_OK, "");
    CHECK(p.layout == MFA_LAYOUT_VARLEN && p.features == MFA_FEATURE_VARLEN && p.batch == 3 &&
              p.seq_q == 6 && p.seq_k == 8,
          "layout %d batch %lld seq %lld/%lld", (int)p.layout, (long long)p.batch,
          (long long)p.seq_q, (long long)p.seq_k);
    CHECK(p.varlen.total_q == TOTAL_Q && p.varlen.total_k == TOTAL_K && p.varlen.longest_q == 5 &&
              p.varlen.longest_k == 7,
          "totals %lld/%lld, longest %lld/%lld", (long long)p.varlen.total_q,
          (long long)p.varlen.total_k, (long long)p.varlen.longest_q,
          (long long)p.varlen.longest_k);
    CHECK(p.varlen.cu_seqlens_q.buffer == &buffer &&
              p.varlen.cu_seqlens_q.byte_offset == cu_q.byte_offset &&
              p.varlen.cu_seqlens_q.stride[3] == 1 && p.q.stride[0] == 0,
          "offset views, and packed views with batch stride 0");
    int32_t bad[4] = {0, 7, 4, TOTAL_Q};
    memcpy(buffer.bytes + cu_q.byte_offset, bad, sizeof bad);
    expect("device offsets are read", build(&args, MFA_FORWARD, false, &p),
           MFA_ERROR_INVALID_ARGUMENT, "args.cu_seqlens_q: sequence 0 has 7 queries");
    buffer.hidden = 1;
    expect("offsets the CPU cannot see", build(&args, MFA_FORWARD, false, &p),
           MFA_ERROR_UNSUPPORTED,
           "args.cu_seqlens_q is in a buffer whose contents the CPU cannot read");
    free(buffer.bytes);
}

static void test_paged_problem(void) {
    enum { BLOCKS = 5, BS = 16, MAX_BLOCKS = 3, PNQ = 2, NEW = 3 };
    static float q[B * HQ * PNQ * D], out[B * HQ * PNQ * D], kc[BLOCKS * HKV * BS * D],
        vc[BLOCKS * HKV * BS * D], kn[B * HKV * NEW * D], vn[B * HKV * NEW * D];
    int32_t table[B * MAX_BLOCKS] = {4, 0, -1, 2, 3, 1}, lengths[B] = {13, 30};
    mfa_array a[8] = {device_array(NULL, 0, MFA_DTYPE_BF16, B, HQ, PNQ, D),
                      device_array(NULL, 0, MFA_DTYPE_BF16, BLOCKS, HKV, BS, D),
                      device_array(NULL, 0, MFA_DTYPE_BF16, BLOCKS, HKV, BS, D),
                      device_array(NULL, 0, MFA_DTYPE_BF16, B, HQ, PNQ, D),
                      device_array(NULL, 0, MFA_DTYPE_I32, B, 1, 1, MAX_BLOCKS),
                      device_array(NULL, 0, MFA_DTYPE_I32, B, 1, 1, 1),
                      device_array(NULL, 0, MFA_DTYPE_BF16, B, HKV, NEW, D),
                      device_array(NULL, 0, MFA_DTYPE_BF16, B, HKV, NEW, D)};
    void* data[8] = {q, kc, vc, out, table, lengths, kn, vn};
    for (int i = 0; i < 8; ++i) a[i].buffer = NULL, a[i].data = data[i];
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    args.q = &a[0], args.k = &a[1], args.v = &a[2], args.out = &a[3];
    args.block_table = &a[4], args.cache_seqlens = &a[5], args.k_new = &a[6], args.v_new = &a[7];
    mfa_problem p;
    expect("paged with appended keys", build(&args, MFA_FORWARD, false, &p), MFA_OK, "");
    CHECK(p.layout == MFA_LAYOUT_PAGED && p.features == MFA_FEATURE_PAGED_KV && p.batch == B &&
              p.seq_q == PNQ && p.seq_k == MAX_BLOCKS * BS && p.heads_kv == HKV,
          "layout %d batch %lld seq %lld/%lld", (int)p.layout, (long long)p.batch,
          (long long)p.seq_q, (long long)p.seq_k);
    CHECK(p.paged.block_size == BS && p.paged.num_blocks == BLOCKS &&
              p.paged.max_blocks == MAX_BLOCKS && p.paged.new_len == NEW &&
              p.paged.longest_k == 33 && p.paged.block_table.data == (char*)table &&
              p.paged.block_table.stride[0] == MAX_BLOCKS && p.paged.cache_seqlens.stride[0] == 1 &&
              p.paged.k_new.data == (char*)kn,
          "paged fields: block size %lld, longest %lld", (long long)p.paged.block_size,
          (long long)p.paged.longest_k);
    /* Sequence 0 has 16 keys, so it reaches its first entry only: table[0][2] = -1 is never
     * read. With 33 keys it reaches all three. */
    lengths[0] = 30;
    expect("a reached entry of -1", build(&args, MFA_FORWARD, false, &p),
           MFA_ERROR_INVALID_ARGUMENT, "args.block_table[0, 2] = -1 is not a block of the cache");
    lengths[0] = 13;
    caps.features &= ~MFA_FEATURE_PAGED_KV;
    expect("paged unsupported", build(&args, MFA_FORWARD, false, &p), MFA_ERROR_UNSUPPORTED,
           "paged KV caches (args.block_table; MFA_FEATURE_PAGED_KV) in the forward");
    reset_target();
}

static void test_device_merge(void) {
    fake_buffer buffer = {1 << 12, NULL, 0};
    mfa_array outs[2] = {device_array(&buffer, 0, MFA_DTYPE_F32, 1, 2, 3, 4),
                         device_array(&buffer, 96, MFA_DTYPE_F16, 1, 2, 3, 4)};
    mfa_array lses[2] = {device_array(&buffer, 256, MFA_DTYPE_F32, 1, 2, 3, 1),
                         device_array(&buffer, 512, MFA_DTYPE_F32, 1, 2, 3, 1)};
    const mfa_array* out_ptrs[2] = {&outs[0], &outs[1]};
    const mfa_array* lse_ptrs[2] = {&lses[0], &lses[1]};
    mfa_merge_part parts[2];
    mfa_merge_problem problem;
    expect("merge in place on the device",
           mfa_build_merge(&target, 2, out_ptrs, lse_ptrs, &outs[0], &lses[1], parts, &problem),
           MFA_OK, "");
    CHECK(problem.memory == MFA_MEMORY_DEVICE && problem.count == 2 &&
              problem.parts[1].out_dtype == MFA_DTYPE_F16 && problem.out.byte_offset == 0 &&
              problem.lse.byte_offset == 512 && problem.rows == 3 && problem.head_dim_v == 4,
          "merge problem fields");
    mfa_array shifted = outs[0];
    shifted.byte_offset = 4;
    expect("merge out shifted onto a part",
           mfa_build_merge(&target, 2, out_ptrs, lse_ptrs, &shifted, NULL, parts, &problem),
           MFA_ERROR_INVALID_ARGUMENT, "out overlaps outs[0]");
    buffer.length = 530;
    expect("merge part past its buffer",
           mfa_build_merge(&target, 2, out_ptrs, lse_ptrs, &outs[0], NULL, parts, &problem),
           MFA_ERROR_INVALID_ARGUMENT, "lses[1]: the view reaches bytes 512 to 535");
    buffer.length = 500;
    expect("merge part past its buffer",
           mfa_build_merge(&target, 2, out_ptrs, lse_ptrs, &outs[0], NULL, parts, &problem),
           MFA_ERROR_INVALID_ARGUMENT, "outside the buffer's 500 bytes");
}

int main(void) {
    reset_target();
    test_device_views();
    test_dense_problem_fields();
    test_varlen_problem();
    test_paged_problem();
    test_device_merge();
    return test_finish("test_core_validation");
}
