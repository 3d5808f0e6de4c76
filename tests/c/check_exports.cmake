# The shared library must export exactly the functions declared in mfa.h: nothing internal
# leaks into the ABI, and nothing declared is missing.
# cmake -DLIBRARY=... -DHEADER=... -DNM=... -P check_exports.cmake

# The sorted, distinct names captured by `capture` (group 1) from each match of `pattern` in text.
function(names_in text pattern capture out)
  string(REGEX MATCHALL "${pattern}" matches "${text}")
  set(names "")
  foreach(match ${matches})
    string(REGEX REPLACE "${capture}" "\\1" name "${match}")
    list(APPEND names ${name})
  endforeach()
  list(REMOVE_DUPLICATES names)
  list(SORT names)
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

file(READ "${HEADER}" header)
names_in("${header}" "[a-z_0-9]+\\*? (mfa_[a-z_0-9]+)\\(" ".* (mfa_[a-z_0-9]+)\\($" declared)
execute_process(COMMAND ${NM} -D --defined-only "${LIBRARY}" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIBRARY}")
endif()
names_in("${symbols}" " T [A-Za-z_0-9]+" " T ([A-Za-z_0-9]+)" names)
if(NOT names STREQUAL declared)
  message(FATAL_ERROR "exported functions differ from mfa.h\n declared: ${declared}\n exported: ${names}")
endif()
list(LENGTH names count)
message(STATUS "libmfa exports exactly the ${count} functions of mfa.h")
