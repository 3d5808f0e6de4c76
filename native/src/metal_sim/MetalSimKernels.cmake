# mfa_sim_add_kernels(<target> SOURCES <file.metal>... [INCLUDE_DIRECTORIES <dir>...]
#                     [NO_ADDRESS_SPACE_CHECK])
#
# Compiles .metal files for the simulator and adds them to <target>. Each file goes through
#   1. the C++ preprocessor, with the compatibility headers (include/metal_stdlib, ...) and no
#      system headers at all, so a kernel that includes the C++ standard library fails here;
#   2. metal_sim_codegen.py, which accepts the kernel forms sim.h lists (anything else is an
#      error naming it), strips Metal's attributes, makes function constants
#      per-dispatch, and appends the argument-binding glue generated from each kernel signature;
#   3. the C++ compiler, with -fno-exceptions -fno-rtti, as a source of <target>;
#   4. metal_sim_check_ir.py over the unit's unoptimised LLVM IR, which rejects recursion and
#      calls through function pointers (Metal allows neither; C++ cannot tell);
#   5. an address-space type check: the same steps with device, constant and threadgroup
#      pointers given clang address spaces, compiled -fsyntax-only, so a threadgroup pointer
#      passed where a device (or thread) pointer is expected fails the build as on Metal. It
#      cannot follow class objects into named address spaces (C++ lacks MSL's generic `this`),
#      so copying a whole struct out of a device pointer fails it although MSL allows it: read
#      the fields, bind the struct by reference, or pass NO_ADDRESS_SPACE_CHECK.
# Then one more generated source, <target>'s kernel table (kernel_table.cpp): every kernel of
# the files, by name, with its entry point; mfa::sim::dispatch finds kernels there, and a name
# defined twice fails the build. One call per target, with all its files. <target> must contain
# the executor: it is libmfa, or links mfa_sim_test_runtime.
include_guard(GLOBAL)
find_package(Python3 COMPONENTS Interpreter REQUIRED)
# The first directory to include this file owns the imported target; every directory that
# compiles kernels needs it.
set_property(TARGET Python3::Interpreter PROPERTY IMPORTED_GLOBAL TRUE)

set(MFA_SIM_DIR ${CMAKE_CURRENT_LIST_DIR} CACHE INTERNAL "metal-sim sources")
set(MFA_SIM_COMPAT_INCLUDE_DIR ${CMAKE_CURRENT_LIST_DIR}/include CACHE INTERNAL
    "metal-sim compatibility headers")
set(MFA_SIM_CODEGEN ${CMAKE_CURRENT_LIST_DIR}/metal_sim_codegen.py CACHE INTERNAL
    "metal-sim code generator")
set(MFA_SIM_CHECK_IR ${CMAKE_CURRENT_LIST_DIR}/metal_sim_check_ir.py CACHE INTERNAL
    "metal-sim recursion and function-pointer check")
# The language mode the kernels are preprocessed in: MSL 3.1 (bfloat) on a C++17 base. Before
# its first line every kernel gets what the Metal compiler knows without an include (the
# keywords), what the generated glue calls, and then Metal's restrictions, which from there on
# hold for the kernel and for everything it includes.
set(MFA_SIM_PREPROCESS_FLAGS -E -x c++ -std=c++17 -nostdinc -nostdinc++
    -isystem ${MFA_SIM_COMPAT_INCLUDE_DIR} -D__METAL_VERSION__=310 -D__HAVE_BFLOAT__=1
    -D__METAL_SIM__=1
    -include ${MFA_SIM_COMPAT_INCLUDE_DIR}/mfa_sim_language.h
    -include ${MFA_SIM_COMPAT_INCLUDE_DIR}/mfa_sim_glue.h
    -include ${MFA_SIM_COMPAT_INCLUDE_DIR}/mfa_sim_restrictions.h
    CACHE INTERNAL "metal-sim preprocessing flags")
# -Wno-unused-parameter: kernels routinely take built-ins they do not read.
# -Wno-pass-failed: `#pragma clang loop unroll(full)` over a loop bounded by function constants
# cannot be honoured here, where the constants are bound at dispatch time rather than at
# pipeline creation (metal_sim_check_residency.py checks the loops as Metal specialises them).
set(MFA_SIM_KERNEL_COMPILE_OPTIONS -fno-exceptions -fno-rtti -Wno-unused-parameter
    -Wno-pass-failed CACHE INTERNAL "metal-sim kernel compile options")
# Under AddressSanitizer the kernels keep every check but stack-use-after-return: with it, every
# call of a kernel function that has a fragment array took a fake frame from the sanitizer's
# heap, and the simulator's kernel tests ran 1.5-1.7 times as long (kernels_attention: 38 s against
# 23 alone, 85 against 56 beside the rest of the suite, on 2 cores of an AMD EPYC). A kernel
# passes its thread-space arrays down to the functions it calls and never keeps their addresses
# past a return (returning one is a clang warning); the simulator's own code, whose rendezvous
# hands pointers to stack records between fibers, keeps the check.
if(MFA_SANITIZE)
  set(MFA_SIM_SANITIZER_OPTIONS -fsanitize-address-use-after-return=never
      CACHE INTERNAL "metal-sim kernel options under AddressSanitizer")
else()
  set(MFA_SIM_SANITIZER_OPTIONS "" CACHE INTERNAL "metal-sim kernel options (none)")
endif()
# The executable build's tracing: every load and store a kernel makes calls the race detector and
# census of the executor (executor.cpp); `func` is the coverage level the tracing needs, and adds
# no instrumentation of its own. The residency check compiles without it.
if(MFA_SIM_TRACE)
  set(MFA_SIM_TRACE_OPTIONS -fsanitize-coverage=func,trace-loads,trace-stores
      CACHE INTERNAL "metal-sim kernel tracing options (the race detector and census)")
else()
  set(MFA_SIM_TRACE_OPTIONS "" CACHE INTERNAL "metal-sim kernel tracing options (none)")
endif()

function(mfa_sim_add_kernels target)
  cmake_parse_arguments(ARG "NO_ADDRESS_SPACE_CHECK" "" "SOURCES;INCLUDE_DIRECTORIES" ${ARGN})
  get_property(added TARGET ${target} PROPERTY MFA_SIM_KERNELS_ADDED)
  if(added)
    message(FATAL_ERROR "mfa_sim_add_kernels(${target}): a target has one kernel table; pass all "
                        "its .metal files in one call")
  endif()
  set_property(TARGET ${target} PROPERTY MFA_SIM_KERNELS_ADDED TRUE)
  file(GLOB compat_headers ${MFA_SIM_COMPAT_INCLUDE_DIR}/*)
  set(include_flags)
  foreach(dir IN LISTS ARG_INCLUDE_DIRECTORIES)
    list(APPEND include_flags -I${dir})
  endforeach()
  set(out_dir ${CMAKE_CURRENT_BINARY_DIR}/metal_sim_kernels/${target})
  set(all_generated)
  set(manifests)
  set(stems)
  foreach(source IN LISTS ARG_SOURCES)
    get_filename_component(source ${source} ABSOLUTE)
    get_filename_component(stem ${source} NAME_WE)
    if(stem IN_LIST stems)
      message(FATAL_ERROR "mfa_sim_add_kernels(${target}): two files named ${stem}.metal")
    endif()
    list(APPEND stems ${stem})
    set(preprocessed ${out_dir}/${stem}.ii)
    set(generated ${out_dir}/${stem}.sim.cpp)
    set(manifest ${out_dir}/${stem}.kernels.json)
    list(APPEND manifests ${manifest})
    add_custom_command(
      OUTPUT ${generated} ${manifest}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${out_dir}
      COMMAND ${CMAKE_CXX_COMPILER} ${MFA_SIM_PREPROCESS_FLAGS} ${include_flags}
              -MD -MF ${preprocessed}.d -MT ${generated} ${source} -o ${preprocessed}
      COMMAND Python3::Interpreter ${MFA_SIM_CODEGEN} ${preprocessed} -o ${generated}
              --source ${source} --manifest ${manifest}
      DEPENDS ${source} ${MFA_SIM_CODEGEN} ${compat_headers}
      DEPFILE ${preprocessed}.d
      COMMENT "metal-sim: compiling ${stem}.metal as C++"
      VERBATIM)
    set(checked ${out_dir}/${stem}.checked)
    add_custom_command(
      OUTPUT ${checked}
      COMMAND ${CMAKE_CXX_COMPILER} -std=c++17 -O0 ${MFA_SIM_KERNEL_COMPILE_OPTIONS} -S -emit-llvm
              ${generated} -o ${out_dir}/${stem}.ll
      COMMAND Python3::Interpreter ${MFA_SIM_CHECK_IR} ${out_dir}/${stem}.ll --source ${source}
              --stamp ${checked}
      DEPENDS ${generated} ${MFA_SIM_CHECK_IR}
      COMMENT "metal-sim: checking ${stem}.metal for recursion and function pointers"
      VERBATIM)
    list(APPEND all_generated ${checked})
    if(NOT ARG_NO_ADDRESS_SPACE_CHECK)
      set(typed ${out_dir}/${stem}.address_spaces)
      add_custom_command(
        OUTPUT ${typed}
        COMMAND ${CMAKE_CXX_COMPILER} ${MFA_SIM_PREPROCESS_FLAGS} -DMFA_SIM_ADDRESS_SPACE_CHECK=1
                ${include_flags} ${source} -o ${typed}.ii
        COMMAND Python3::Interpreter ${MFA_SIM_CODEGEN} ${typed}.ii -o ${typed}.cpp
                --source ${source} --address-spaces
        COMMAND ${CMAKE_CXX_COMPILER} -std=c++17 -fsyntax-only ${MFA_SIM_KERNEL_COMPILE_OPTIONS}
                ${typed}.cpp
        COMMAND ${CMAKE_COMMAND} -E touch ${typed}
        DEPENDS ${generated}
        COMMENT "metal-sim: checking address spaces in ${stem}.metal"
        VERBATIM)
      list(APPEND all_generated ${typed})
    endif()
    target_sources(${target} PRIVATE ${generated})
    # Source properties are per directory: set them where <target> lives, which may not be here.
    set_source_files_properties(${generated} TARGET_DIRECTORY ${target} PROPERTIES
      GENERATED TRUE
      COMPILE_OPTIONS
        "${MFA_SIM_KERNEL_COMPILE_OPTIONS};${MFA_SIM_TRACE_OPTIONS};${MFA_SIM_SANITIZER_OPTIONS}")
    list(APPEND all_generated ${generated})
  endforeach()
  set(table ${out_dir}/kernel_table.cpp)
  add_custom_command(
    OUTPUT ${table}
    COMMAND Python3::Interpreter ${MFA_SIM_CODEGEN} --kernel-table ${manifests} -o ${table}
    DEPENDS ${manifests} ${MFA_SIM_CODEGEN}
    COMMENT "metal-sim: the kernel table of ${target}"
    VERBATIM)
  target_sources(${target} PRIVATE ${table})
  set_source_files_properties(${table} TARGET_DIRECTORY ${target} PROPERTIES
    GENERATED TRUE
    INCLUDE_DIRECTORIES ${MFA_SIM_COMPAT_INCLUDE_DIR})
  list(APPEND all_generated ${table})
  # A custom command's rule only reaches targets of its own directory; this target carries it
  # to <target> wherever that is defined.
  add_custom_target(${target}_metal_sim_kernels DEPENDS ${all_generated})
  add_dependencies(${target} ${target}_metal_sim_kernels)
endfunction()
