# The metallib stamp must follow the kernel sources: the same sources give the same stamp (and
# leave the generated files untouched, so nothing rebuilds), and a change in any included
# header gives a new one.
#   cmake -DEMBED_SCRIPT=<embed_sources.cmake> -DFIXTURES=<kernels dir> -DWORK_DIR=<dir> -P stamp_check.cmake
cmake_minimum_required(VERSION 3.21)

function(embed out_var)
  execute_process(COMMAND ${CMAKE_COMMAND} -DKERNEL_DIR=${WORK_DIR}/kernels
                          -DOUTPUT_DIR=${WORK_DIR}/out -P ${EMBED_SCRIPT}
                  RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "embed_sources.cmake failed (${result})")
  endif()
  file(STRINGS ${WORK_DIR}/out/source_stamp.metal stamp REGEX "^kernel void kernel_source_stamp_")
  set(${out_var} "${stamp}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(COPY ${FIXTURES}/ DESTINATION ${WORK_DIR}/kernels)

embed(original)
file(TIMESTAMP ${WORK_DIR}/out/embedded_sources.c before "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1.1)
embed(again)
file(TIMESTAMP ${WORK_DIR}/out/embedded_sources.c after "%s")
if(NOT again STREQUAL original)
  message(FATAL_ERROR "same sources, different stamps: '${original}' vs '${again}'")
endif()
if(NOT before STREQUAL after)
  message(FATAL_ERROR "unchanged sources rewrote embedded_sources.c")
endif()

file(APPEND ${WORK_DIR}/kernels/local.h "// a change in a header\n")
embed(changed)
if(changed STREQUAL original)
  message(FATAL_ERROR "a header changed but the stamp did not: '${changed}'")
endif()
message(STATUS "stamps: ${original} -> ${changed}")
