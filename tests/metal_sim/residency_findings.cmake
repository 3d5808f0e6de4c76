# The register-residency check on kernels/residency.metal (see tests/CMakeLists.txt): it must
# report the array with a dynamic index and the runtime-unrolled loop, and nothing in the
# resident_fragments kernels, so that a check which finds nothing, or everything, fails here.
file(MAKE_DIRECTORY ${WORK_DIR})
set(variants "")
foreach(kernel resident_fragments fragments_dynamic_index matrix_loop_runtime_count)
  string(APPEND variants "{\"kernel\": \"${kernel}\", \"constants\": {}}\n")
endforeach()
string(APPEND variants
  "{\"kernel\": \"resident_fragments_constant_count\", \"constants\": {\"0\": 6}}\n")
file(WRITE ${WORK_DIR}/variants.json "${variants}")
execute_process(
  COMMAND ${PYTHON} ${CHECK} ${SOURCE} --variants ${WORK_DIR}/variants.json
          --compiler ${COMPILER} --opt ${OPT} --codegen ${CODEGEN}
          "--preprocess-flags=${PREPROCESS_FLAGS}" "--compile-options=${COMPILE_OPTIONS}"
          --work-dir ${WORK_DIR}
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT status EQUAL 1)
  message(FATAL_ERROR "the check exited with ${status}, not 1 (findings)")
endif()
foreach(expected
    "fragments_dynamic_index [^\n]*: an array stays in stack memory"
    "matrix_loop_runtime_count [^\n]*: 1 loop\\(s\\) marked llvm.loop.unroll.disable")
  if(NOT err MATCHES "${expected}")
    message(FATAL_ERROR "no finding matching '${expected}'")
  endif()
endforeach()
if(err MATCHES "residency: resident_fragments")
  message(FATAL_ERROR "a finding in a kernel that keeps its fragments in registers")
endif()
