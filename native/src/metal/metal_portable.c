// The Metal host's Metal-free arithmetic; see metal_portable.h.
#include "metal/metal_portable.h"

#include <stdio.h>
#include <string.h>

int mfa_metal_page_span(uintptr_t first, size_t length, size_t page, mfa_page_span* span) {
    const uintptr_t offset = first & (uintptr_t)(page - 1);
    const uintptr_t start = first - offset;
    size_t covered;
    if (__builtin_add_overflow((size_t)offset, length, &covered)) return 0;
    const size_t tail = (page - covered % page) % page;
    size_t rounded;
    if (__builtin_add_overflow(covered, tail, &rounded)) return 0;
    uintptr_t end;
    if (__builtin_add_overflow(start, (uintptr_t)rounded, &end)) return 0;
    span->start = start;
    span->length = rounded;
    span->offset = (size_t)offset;
    return 1;
}

void mfa_metal_copy_view_back(char* caller, const char* staged, int64_t byte_offset,
                              const int64_t shape[4], const int64_t stride[4],
                              size_t element_size) {
    const int64_t size = (int64_t)element_size;
    const int contiguous_rows = shape[3] == 1 || stride[3] == 1;
    for (int64_t b = 0; b < shape[0]; b++) {
        for (int64_t h = 0; h < shape[1]; h++) {
            for (int64_t s = 0; s < shape[2]; s++) {
                const int64_t row = (b * stride[0] + h * stride[1] + s * stride[2]) * size;
                if (contiguous_rows) {
                    memcpy(caller + row, staged + (row - byte_offset), (size_t)(shape[3] * size));
                    continue;
                }
                for (int64_t d = 0; d < shape[3]; d++) {
                    const int64_t at = row + d * stride[3] * size;
                    memcpy(caller + at, staged + (at - byte_offset), element_size);
                }
            }
        }
    }
}

int mfa_metal_pipeline_key(const mfa_pass_plan* pass, char* key, size_t size) {
    int used = snprintf(key, size, "%s", pass->kernel_name);
    for (uint32_t i = 0; i < pass->num_constants; i++) {
        if (used < 0 || (size_t)used >= size) return 0;
        const mfa_function_constant* constant = &pass->constants[i];
        used += snprintf(key + used, size - (size_t)used, "|%u:%u=%u", constant->index,
                         constant->type, constant->value);
    }
    return used > 0 && (size_t)used < size;
}
