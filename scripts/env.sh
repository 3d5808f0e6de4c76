# Sourced by the other scripts: the compilers the project builds with, and the test timeout.

# On Linux clang 16, which the metal-sim backend needs; elsewhere the platform's default compiler.
if [ "$(uname -s)" = Linux ] && command -v clang++-16 >/dev/null; then
    export CC=clang-16 CXX=clang++-16
fi

# Seconds one test may run before it counts as hung and fails. Every timeout in scripts/ derives
# from it (ctest and pytest in scripts/test, the sanitizer suites in scripts/hardening). The
# default is generous: a loaded 2-core machine runs the sanitizer suites several times slower
# than an idle one. Set it in the environment to change it.
export MFA_TEST_TIMEOUT=${MFA_TEST_TIMEOUT:-900}
