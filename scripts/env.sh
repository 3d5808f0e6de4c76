# Sourced by the other scripts: the compilers the project builds with. On Linux that is clang 16,
# which the metal-sim backend needs; elsewhere the platform's default compiler.
if [ "$(uname -s)" = Linux ] && command -v clang++-16 >/dev/null; then
    export CC=clang-16 CXX=clang++-16
fi
# Seconds allowed per test; every timeout in scripts/ derives from it.
export MFA_TEST_TIMEOUT=${MFA_TEST_TIMEOUT:-900}
