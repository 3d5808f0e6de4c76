// Checks the table embed_sources.cmake generated from fixtures/kernels: includes resolved once
// each, <...> includes and comments untouched, #line directives pointing at the real files,
// every byte of the sources preserved, and a stamp naming a Metal kernel.
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "metal/embedded_sources.h"

static int occurrences(const char* text, const char* needle) {
    int count = 0;
    for (const char* at = strstr(text, needle); at != NULL; at = strstr(at + 1, needle)) count++;
    return count;
}

// A line whose first non-blank characters are a quoted #include directive.
static int has_quoted_include(const char* text) {
    for (const char* line = text; line != NULL && *line != '\0';) {
        const char* p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#') {
            p++;
            while (*p == ' ' || *p == '\t') p++;
            if (strncmp(p, "include", 7) == 0) {
                p += 7;
                while (*p == ' ' || *p == '\t') p++;
                if (*p == '"') return 1;
            }
        }
        line = strchr(line, '\n');
        if (line != NULL) line++;
    }
    return 0;
}

int main(void) {
    CHECK(mfa_metal_embedded_source_count == 2, "two sources, one per .metal file");
    if (mfa_metal_embedded_source_count != 2) return 1;
    const mfa_metal_embedded_source* first = &mfa_metal_embedded_sources[0];
    const mfa_metal_embedded_source* second = &mfa_metal_embedded_sources[1];

    CHECK(strcmp(first->name, "first.metal") == 0, "sources sorted by name: first.metal");
    CHECK(strcmp(second->name, "second.metal") == 0, "sources sorted by name: second.metal");
    for (size_t i = 0; i < 2; i++) {
        const char* text = mfa_metal_embedded_sources[i].text;
        CHECK(!has_quoted_include(text), "no quoted #include directive left");
        CHECK(occurrences(text, "LOCAL_MARKER = 2") == 1, "local.h inlined exactly once");
        CHECK(occurrences(text, "${not_cmake} \\back\\slash") == 1 &&
                  occurrences(text, "\"quoted\" text; semicolons; [brackets]") == 1,
              "special characters survive byte for byte");
    }

    CHECK(strncmp(first->text, "#include <metal_stdlib>\n", 24) == 0, "<...> includes stay");
    CHECK(occurrences(first->text, "SHARED_MARKER = 1") == 1, "common/shared.h inlined");
    CHECK(occurrences(first->text, "#line 1 \"common/shared.h\"\n") == 1, "#line into a header");
    CHECK(occurrences(first->text, "#line 1 \"local.h\"\n") == 1, "../local.h resolved as local.h");
    CHECK(occurrences(first->text, "#line 4 \"common/shared.h\"\n") == 1,
          "#line back into shared.h");
    CHECK(occurrences(first->text, "#line 3 \"first.metal\"\n") == 1, "#line back into the source");
    CHECK(occurrences(first->text, "// #include \"never_resolved.h\" stays") == 1,
          "a commented-out directive is left alone");
    const char* tail = "kernel void first_kernel() {}\n";
    const size_t length = strlen(first->text);
    CHECK(length >= strlen(tail) && strcmp(first->text + length - strlen(tail), tail) == 0,
          "the source ends as the file does");
    CHECK(occurrences(second->text, "#line 2 \"second.metal\"\nkernel void second_kernel() {}\n") ==
              1,
          "second.metal resumes at its line 2");

    CHECK(strncmp(mfa_metal_source_stamp, "kernel_source_stamp_", 20) == 0 &&
              strlen(mfa_metal_source_stamp) == 20 + 16 &&
              strspn(mfa_metal_source_stamp + 20, "0123456789abcdef") == 16,
          "stamp is kernel_source_stamp_ and 16 hex digits");

    printf("embedded sources: stamp %s\n", mfa_metal_source_stamp);
    return test_finish("embedded sources");
}
