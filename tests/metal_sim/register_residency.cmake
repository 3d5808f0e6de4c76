# The register-residency check (see tests/CMakeLists.txt): the planner's pipeline variants, then
# metal_sim_check_residency.py over them.
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${VARIANTS_PROGRAM} OUTPUT_FILE ${WORK_DIR}/variants.json
                RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "planner_variants failed (${status})")
endif()
execute_process(
  COMMAND ${PYTHON} ${CHECK} ${SOURCE} --variants ${WORK_DIR}/variants.json
          --compiler ${COMPILER} --opt ${OPT} --codegen ${CODEGEN}
          "--preprocess-flags=${PREPROCESS_FLAGS}" "--compile-options=${COMPILE_OPTIONS}"
          --work-dir ${WORK_DIR}
  RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "register residency check failed")
endif()
