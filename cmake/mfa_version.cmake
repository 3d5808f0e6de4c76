# The version of mfa, read from the MFA_VERSION_* macros of native/include/mfa.h: the one place it
# is written. The root CMakeLists.txt includes this file before project(); the Python package's
# metadata reads the same macros (pyproject.toml), and tests/python/test_version.py checks that
# all of them agree, running this file as a script: cmake -P cmake/mfa_version.cmake
file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/../native/include/mfa.h mfa_version_lines
     REGEX "^#define MFA_VERSION_(MAJOR|MINOR|PATCH) [0-9]+$")
set(MFA_VERSION "")
foreach(part MAJOR MINOR PATCH)
  if(NOT mfa_version_lines MATCHES "#define MFA_VERSION_${part} ([0-9]+)")
    message(FATAL_ERROR "mfa.h has no '#define MFA_VERSION_${part} <number>' line")
  endif()
  list(APPEND MFA_VERSION ${CMAKE_MATCH_1})
endforeach()
list(JOIN MFA_VERSION "." MFA_VERSION)
if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  message(${MFA_VERSION})
endif()
