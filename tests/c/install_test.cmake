# Installs the build tree into a scratch prefix, then builds the C example against it twice:
# with find_package(mfa) in a separate CMake project, and with the flags from pkg-config.
# Invoked by ctest: cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DC_COMPILER=... -P install_test.cmake
set(prefix "${BUILD_DIR}/install-test/prefix")
file(REMOVE_RECURSE "${BUILD_DIR}/install-test")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f include/mfa.h lib/cmake/mfa/mfaConfig.cmake lib/pkgconfig/mfa.pc)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()

set(consumer "${BUILD_DIR}/install-test/consumer")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/c/consumer" -B "${consumer}"
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER}
    -DMFA_EXAMPLE_SOURCE=${SOURCE_DIR}/examples/hello_attention.c)
run(${CMAKE_COMMAND} --build "${consumer}")
set(ENV{LD_LIBRARY_PATH} "${prefix}/lib")
run("${consumer}/hello_attention")

find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs mfa OUTPUT_VARIABLE flags
                RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config does not know mfa")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${C_COMPILER} "${SOURCE_DIR}/examples/hello_attention.c" ${flags} -lm
    -o "${BUILD_DIR}/install-test/hello_pkgconfig")
run("${BUILD_DIR}/install-test/hello_pkgconfig")
