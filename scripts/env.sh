# Sourced by the other scripts: the compilers the project builds with, and the test timeout.

# On Linux clang 16, which the metal-sim backend needs; elsewhere the platform's default compiler.
if [ "$(uname -s)" = Linux ] && command -v clang++-16 >/dev/null; then
    export CC=clang-16 CXX=clang++-16
fi

# A compiler cache, where ccache is installed (scripts/setup installs it on Linux): the .venv's
# libmfa (scripts/setup) and ctest's build (scripts/test) compile the same files with the same
# flags, and the second takes the first's objects. In depend mode it reads the compiler's
# dependency file instead of running the preprocessor on every miss. The cache is the project's,
# in build/ccache, unless CCACHE_DIR names another.
if command -v ccache >/dev/null; then
    export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
    export CCACHE_DIR=${CCACHE_DIR:-$PWD/build/ccache} CCACHE_DEPEND=1
fi

# Seconds one test may run before it counts as hung and fails. Every timeout in scripts/ derives
# from it (ctest and pytest in scripts/test, the sanitizer suites in scripts/hardening). The
# default is generous: a loaded 2-core machine runs the sanitizer suites several times slower
# than an idle one. Set it in the environment to change it.
export MFA_TEST_TIMEOUT=${MFA_TEST_TIMEOUT:-900}
