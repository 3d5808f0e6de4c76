/* Which sanitizer runtime a test is built with, for the tests that such a runtime defeats
 * whatever libmfa does (they skip or shrink that part, and say why):
 *
 *   TEST_ASAN        AddressSanitizer
 *   TEST_TSAN        ThreadSanitizer
 *   TEST_SANITIZED   either of them, or MemorySanitizer
 *
 * clang says so through __has_feature, gcc through __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__. */
#ifndef MFA_TESTS_SANITIZER_H
#define MFA_TESTS_SANITIZER_H

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define TEST_TSAN 1
#endif
#if __has_feature(memory_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define TEST_TSAN 1
#endif
#if defined(TEST_ASAN) || defined(TEST_TSAN)
#define TEST_SANITIZED 1
#endif

#endif
