// Tests of the Metal host's Metal-free arithmetic (native/src/metal/metal_portable.c): the
// pages that wrap an operand, the copy of a staged output back into a strided view, and
// pipeline keys.
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "metal/metal_portable.h"

static void test_page_span(void) {
    for (size_t page = 4096; page <= 16384; page *= 4) {
        mfa_page_span span;
        // Aligned start, exact pages.
        CHECK(mfa_metal_page_span(8 * page, 2 * page, page, &span));
        CHECK(span.start == 8 * page && span.length == 2 * page && span.offset == 0);
        // Mid-page start, end inside the same page.
        CHECK(mfa_metal_page_span(8 * page + 100, 50, page, &span));
        CHECK(span.start == 8 * page && span.length == page && span.offset == 100);
        // Mid-page start crossing into the next page by one byte.
        CHECK(mfa_metal_page_span(8 * page + page - 10, 11, page, &span));
        CHECK(span.start == 8 * page && span.length == 2 * page && span.offset == page - 10);
        // The span always covers the operand and is whole pages.
        for (size_t first = 5 * page; first < 5 * page + 3 * page; first += 997) {
            for (size_t length = 1; length < 3 * page; length += 1231) {
                CHECK(mfa_metal_page_span(first, length, page, &span));
                CHECK(span.start % page == 0 && span.length % page == 0);
                CHECK(span.start + span.offset == first);
                CHECK(span.offset + length <= span.length &&
                      span.length - (span.offset + length) < page);
            }
        }
        // Rounding past the end of the address space is refused, not wrapped.
        CHECK(!mfa_metal_page_span(UINTPTR_MAX - page / 2, page, page, &span));
        CHECK(!mfa_metal_page_span(page, SIZE_MAX - 10, page, &span));
    }
}

// A caller buffer full of sentinels, a staged copy whose view elements hold distinct values;
// after the copy back, exactly the view's elements changed.
static void check_copy_back(const char* what, const int64_t shape[4], const int64_t stride[4],
                            size_t element_size, int64_t first_element) {
    enum { BYTES = 1 << 14 };
    static unsigned char caller[BYTES], staged[BYTES], expected[BYTES];
    memset(caller, 0xAA, sizeof caller);
    memset(expected, 0xAA, sizeof expected);
    memset(staged, 0x55, sizeof staged); // gap bytes in the staging copy: must not come back
    // The view's extent, as the planner reports it: from its lowest byte.
    int64_t lowest = 0;
    for (int i = 0; i < 4; i++) {
        if (shape[3] == 1 && i == 3) continue;
        if (stride[i] < 0) lowest += stride[i] * (shape[i] - 1);
    }
    const int64_t byte_offset = lowest * (int64_t)element_size;
    char* data = (char*)caller + first_element * (int64_t)element_size;
    const int64_t data_offset = data - (char*)caller;
    unsigned char value = 1;
    for (int64_t b = 0; b < shape[0]; b++)
        for (int64_t h = 0; h < shape[1]; h++)
            for (int64_t s = 0; s < shape[2]; s++)
                for (int64_t d = 0; d < shape[3]; d++) {
                    const int64_t element = b * stride[0] + h * stride[1] + s * stride[2] +
                                            (shape[3] == 1 ? 0 : d * stride[3]);
                    const int64_t at = element * (int64_t)element_size;
                    for (size_t k = 0; k < element_size;
                         k++, value = (unsigned char)(value % 250 + 1)) {
                        staged[at - byte_offset + (int64_t)k] = value;
                        expected[data_offset + at + (int64_t)k] = value;
                    }
                }
    mfa_metal_copy_view_back(data, (const char*)staged, byte_offset, shape, stride, element_size);
    CHECK(memcmp(caller, expected, sizeof caller) == 0, "copy back of %s: wrong bytes", what);
}

static void test_copy_back(void) {
    // [B, H, N, D] contiguous, f16.
    check_copy_back("bhsd", (int64_t[]){2, 3, 5, 4}, (int64_t[]){60, 20, 4, 1}, 2, 0);
    // [B, N, H, D] memory: heads interleaved inside each row; one head's view leaves gaps.
    check_copy_back("bshd head slice", (int64_t[]){2, 1, 5, 4}, (int64_t[]){60, 4, 12, 1}, 4, 4);
    // Feature stride 2 (every other column), bf16.
    check_copy_back("strided features", (int64_t[]){1, 2, 3, 4}, (int64_t[]){48, 24, 8, 2}, 2, 0);
    // Sequence reversed: negative stride, the first element is not the lowest address.
    check_copy_back("reversed rows", (int64_t[]){2, 2, 6, 3}, (int64_t[]){40, 20, -3, 1}, 4,
                    40 + 20 + 15);
    // lse: [B, H, N, 1], stride[3] meaningless.
    check_copy_back("lse", (int64_t[]){2, 3, 7, 1}, (int64_t[]){21, 7, 1, 12345}, 4, 0);
}

static void test_pipeline_key(void) {
    mfa_pass_plan pass;
    memset(&pass, 0, sizeof pass);
    pass.kernel_name = "kernel_attention_forward";
    pass.num_constants = 2;
    pass.constants[0] = (mfa_function_constant){100, MFA_CONSTANT_TYPE_UINT, 1};
    pass.constants[1] = (mfa_function_constant){109, MFA_CONSTANT_TYPE_BOOL, 0};
    char key[256], other[256];
    CHECK(mfa_metal_pipeline_key(&pass, key, sizeof key));
    CHECK(strcmp(key, "kernel_attention_forward|100:33=1|109:53=0") == 0);
    CHECK(mfa_metal_pipeline_key(&pass, other, sizeof other) && strcmp(key, other) == 0);
    pass.constants[1].value = 1;
    CHECK(mfa_metal_pipeline_key(&pass, other, sizeof other) && strcmp(key, other) != 0);
    pass.constants[1].value = 0;
    pass.kernel_name = "kernel_attention_backward_query";
    CHECK(mfa_metal_pipeline_key(&pass, other, sizeof other) && strcmp(key, other) != 0);
    // Values that would collide if concatenated without separators: 1|11 vs 11|1.
    pass.constants[0].value = 1;
    pass.constants[1] = (mfa_function_constant){101, MFA_CONSTANT_TYPE_UINT, 11};
    CHECK(mfa_metal_pipeline_key(&pass, key, sizeof key));
    pass.constants[0].value = 11;
    pass.constants[1].value = 1;
    CHECK(mfa_metal_pipeline_key(&pass, other, sizeof other) && strcmp(key, other) != 0);
    // Too small a buffer is reported, whether the name or a constant overflows it.
    CHECK(!mfa_metal_pipeline_key(&pass, key, 10));
    CHECK(!mfa_metal_pipeline_key(&pass, key,
                                  strlen("kernel_attention_backward_query|100:33=11") + 1));
    CHECK(mfa_metal_pipeline_key(&pass, key,
                                 strlen("kernel_attention_backward_query|100:33=11|101:33=1") + 1));
}

int main(void) {
    test_page_span();
    test_copy_back();
    test_pipeline_key();
    return test_finish("metal host portable arithmetic");
}
