# Runs every kernel in KERNELS through the simulator's compilation steps (preprocess, codegen,
# compile, IR check, address-space check) and checks the outcome each file announces on its first line:
#   // expect-success          it must compile
#   // expect: <regex>         it must fail, with diagnostics matching <regex>
# Then builds the kernel table of the files in DUPLICATE_KERNELS, which define one kernel name
# twice: that must fail, naming both files.
# Invoked by ctest (tests/CMakeLists.txt) with the build's own compiler and flags.
file(GLOB kernels ${KERNELS}/*.metal)
file(MAKE_DIRECTORY ${WORK_DIR})
set(failures 0)
foreach(kernel IN LISTS kernels)
  get_filename_component(stem ${kernel} NAME_WE)
  file(STRINGS ${kernel} first_line LIMIT_COUNT 1)
  set(output "")
  execute_process(
    COMMAND ${COMPILER} ${PREPROCESS_FLAGS} ${kernel} -o ${WORK_DIR}/${stem}.ii
    RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(APPEND output "${out}${err}")
  if(status EQUAL 0)
    execute_process(
      COMMAND ${PYTHON} ${CODEGEN} ${WORK_DIR}/${stem}.ii -o ${WORK_DIR}/${stem}.sim.cpp
              --source ${kernel}
      RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(APPEND output "${out}${err}")
  endif()
  if(status EQUAL 0)
    execute_process(
      COMMAND ${COMPILER} -std=c++17 -O0 ${COMPILE_OPTIONS} -S -emit-llvm ${WORK_DIR}/${stem}.sim.cpp
              -o ${WORK_DIR}/${stem}.ll
      RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(APPEND output "${out}${err}")
  endif()
  if(status EQUAL 0)
    execute_process(
      COMMAND ${PYTHON} ${CHECK_IR} ${WORK_DIR}/${stem}.ll --source ${kernel}
              --stamp ${WORK_DIR}/${stem}.checked
      RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(APPEND output "${out}${err}")
  endif()
  # The address-space type check.
  if(status EQUAL 0)
    execute_process(
      COMMAND ${COMPILER} ${PREPROCESS_FLAGS} -DMFA_SIM_ADDRESS_SPACE_CHECK=1 ${kernel}
              -o ${WORK_DIR}/${stem}.typed.ii
      RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(APPEND output "${out}${err}")
  endif()
  if(status EQUAL 0)
    execute_process(
      COMMAND ${PYTHON} ${CODEGEN} ${WORK_DIR}/${stem}.typed.ii -o ${WORK_DIR}/${stem}.typed.cpp
              --source ${kernel} --address-spaces
      RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(APPEND output "${out}${err}")
  endif()
  if(status EQUAL 0)
    execute_process(
      COMMAND ${COMPILER} -std=c++17 -fsyntax-only ${COMPILE_OPTIONS} ${WORK_DIR}/${stem}.typed.cpp
      RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(APPEND output "${out}${err}")
  endif()

  if(first_line MATCHES "^// expect-success")
    if(NOT status EQUAL 0)
      message(SEND_ERROR "${stem}: the control kernel does not compile:\n${output}")
      math(EXPR failures "${failures} + 1")
    else()
      message(STATUS "${stem}: compiles, as it must")
    endif()
  elseif(first_line MATCHES "^// expect: (.*)$")
    set(expected "${CMAKE_MATCH_1}")
    if(status EQUAL 0)
      message(SEND_ERROR "${stem}: compiled, but must fail with \"${expected}\"")
      math(EXPR failures "${failures} + 1")
    elseif(NOT output MATCHES "${expected}")
      message(SEND_ERROR "${stem}: failed, but without \"${expected}\":\n${output}")
      math(EXPR failures "${failures} + 1")
    else()
      message(STATUS "${stem}: rejected with \"${expected}\"")
    endif()
  else()
    message(SEND_ERROR "${stem}: the first line must be // expect-success or // expect: <regex>")
    math(EXPR failures "${failures} + 1")
  endif()
endforeach()
file(GLOB duplicates ${DUPLICATE_KERNELS}/*.metal)
set(manifests)
foreach(kernel IN LISTS duplicates)
  get_filename_component(stem ${kernel} NAME_WE)
  execute_process(
    COMMAND ${COMPILER} ${PREPROCESS_FLAGS} ${kernel} -o ${WORK_DIR}/duplicate_${stem}.ii
    COMMAND_ERROR_IS_FATAL ANY)
  execute_process(
    COMMAND ${PYTHON} ${CODEGEN} ${WORK_DIR}/duplicate_${stem}.ii
            -o ${WORK_DIR}/duplicate_${stem}.sim.cpp --source ${kernel}
            --manifest ${WORK_DIR}/duplicate_${stem}.json
    COMMAND_ERROR_IS_FATAL ANY)
  list(APPEND manifests ${WORK_DIR}/duplicate_${stem}.json)
endforeach()
execute_process(
  COMMAND ${PYTHON} ${CODEGEN} --kernel-table ${manifests} -o ${WORK_DIR}/duplicate_table.cpp
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(expected "second\\.metal: error: kernel 'same_name' is also defined in [^ ]*first\\.metal")
if(status EQUAL 0)
  message(SEND_ERROR "the kernel table of two files defining 'same_name' was built")
  math(EXPR failures "${failures} + 1")
elseif(NOT "${out}${err}" MATCHES "${expected}")
  message(SEND_ERROR "the kernel table failed, but without \"${expected}\":\n${out}${err}")
  math(EXPR failures "${failures} + 1")
else()
  message(STATUS "duplicate kernel names: rejected with \"${expected}\"")
endif()

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} compile-fail case(s) wrong")
endif()
