/* The one way the C and C++ tests check, shared by every suite.
 *
 *   CHECK(condition)                        a condition that must hold
 *   CHECK(condition, format, ...)           the same, with a printf-style explanation
 *   CHECK_ERROR(label, status, expected, text)
 *       a call that must fail: `status` must be `expected` and the calling thread's error
 *       message (mfa_last_error(), which the library, the planner, the CPU backend and the
 *       simulator all fill through mfa_set_error) must contain `text`; `label` names the case
 *   test_case_selected(filter, name), test_case_report(name, failures_before)
 *       suites of named cases: the cases a filter selects, and a line for each once run
 *   test_finish(name)                       main's exit status: 0, or 1 after any failure
 *
 * A failed check prints "file:line: check failed: ..." (the first 50) and is counted; counting
 * is atomic, so threads may check at once. */
#ifndef MFA_TESTS_CHECK_H
#define MFA_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mfa.h"

static int test_failures = 0;

static void test_fail(const char* file, int line, const char* what, const char* format, ...)
    __attribute__((format(printf, 4, 5)));
static void test_fail(const char* file, int line, const char* what, const char* format, ...) {
    if (__atomic_fetch_add(&test_failures, 1, __ATOMIC_RELAXED) >= 50) return;
    flockfile(stderr); /* one line per failure, whichever threads fail at once */
    fprintf(stderr, "%s:%d: check failed: %s", file, line, what);
    if (format[0] != '\0') {
        va_list args;
        va_start(args, format);
        fputs(": ", stderr);
        vfprintf(stderr, format, args);
        va_end(args);
    }
    fputc('\n', stderr);
    funlockfile(stderr);
}

/* The explanation is optional: a format string literal and its arguments. */
#define CHECK(condition, ...)                                                                      \
    do {                                                                                           \
        if (!(condition)) test_fail(__FILE__, __LINE__, #condition, "" __VA_ARGS__);               \
    } while (0)

/* The status as mfa.h spells it, as docs/bad-inputs.md names it. */
static const char* test_status_name(mfa_status status) {
    switch (status) {
        case MFA_OK: return "MFA_OK";
        case MFA_ERROR_INVALID_ARGUMENT: return "MFA_ERROR_INVALID_ARGUMENT";
        case MFA_ERROR_UNSUPPORTED: return "MFA_ERROR_UNSUPPORTED";
        case MFA_ERROR_BACKEND_UNAVAILABLE: return "MFA_ERROR_BACKEND_UNAVAILABLE";
        case MFA_ERROR_OUT_OF_MEMORY: return "MFA_ERROR_OUT_OF_MEMORY";
        case MFA_ERROR_SIZE_OVERFLOW: return "MFA_ERROR_SIZE_OVERFLOW";
        case MFA_ERROR_DEVICE: return "MFA_ERROR_DEVICE";
        case MFA_ERROR_INTERNAL: return "MFA_ERROR_INTERNAL";
    }
    return "an unknown status";
}

static int test_check_error(const char* file, int line, const char* label, mfa_status status,
                            mfa_status expected, const char* text) {
    const char* message = mfa_last_error();
    if (status != expected) {
        test_fail(file, line, label, "status %s, expected %s (message: %s)",
                  test_status_name(status), test_status_name(expected), message);
        return 0;
    }
    if (text[0] == '\0' || strstr(message, text) == NULL) {
        test_fail(file, line, label, "message \"%s\" does not contain \"%s\"", message, text);
        return 0;
    }
    return 1;
}

#define CHECK_ERROR(label, status, expected, text)                                                 \
    test_check_error(__FILE__, __LINE__, (label), (status), (expected), (text))

/* Suites of named cases: whether a case is selected by the filter (the suite's first argument;
 * NULL: every case), and the line that reports it once run ("name ok", or FAILED where a check
 * failed since failures_before = test_failures before it). */
static int test_case_selected(const char* filter, const char* name) {
    return filter == NULL || strstr(name, filter) != NULL;
}

static void test_case_report(const char* name, int failures_before) {
    printf("%-32s %s\n", name, test_failures == failures_before ? "ok" : "FAILED");
    fflush(stdout);
}

static int test_finish(const char* name) {
    const int failures = __atomic_load_n(&test_failures, __ATOMIC_RELAXED);
    if (failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

#endif
