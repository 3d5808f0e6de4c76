# Runs a command that must fail with a specific diagnostic:
#   cmake -DEXPECT=<regex> -P expect_failure.cmake -- <command> [args...]
# Passes only when the command exits non-zero AND its output matches EXPECT, so a command that
# fails for an unrelated reason (a bad flag, a missing file) does not count as a pass.
cmake_minimum_required(VERSION 3.21)

if(NOT DEFINED EXPECT)
  message(FATAL_ERROR "expect_failure.cmake: -DEXPECT=<regex> is required")
endif()
set(command "")
set(collecting FALSE)
foreach(i RANGE 1 ${CMAKE_ARGC})
  if(i EQUAL CMAKE_ARGC)
    break()
  endif()
  if(collecting)
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(collecting TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "expect_failure.cmake: no command after --")
endif()

execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_VARIABLE output
                ERROR_VARIABLE output)
if(result EQUAL 0)
  message(FATAL_ERROR "expected a failure matching '${EXPECT}', but the command succeeded:\n${output}")
endif()
if(NOT output MATCHES "${EXPECT}")
  message(FATAL_ERROR "the command failed (${result}), but not with '${EXPECT}':\n${output}")
endif()
message(STATUS "failed as expected (${result}): ${CMAKE_MATCH_0}")
