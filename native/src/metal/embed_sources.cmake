# Embeds the kernel sources into libmfa for run-time compilation, and stamps mfa.metallib.
#
#   cmake -DKERNEL_DIR=<metal/> -DOUTPUT_DIR=<dir> -P embed_sources.cmake
#
# Writes into OUTPUT_DIR:
#   embedded_sources.c   the table declared by embedded_sources.h: every KERNEL_DIR/*.metal with
#                        its #include "..." directives resolved (each header once per source,
#                        #line directives keeping compiler messages pointed at the real files),
#                        as NUL-terminated byte arrays;
#   source_stamp.metal   one empty kernel named after a digest of those resolved sources. It is
#                        linked into mfa.metallib so that the host can tell a metallib built
#                        from these sources from a stale one;
#   resolved/<name>      the resolved sources themselves, for reading compiler messages.
# Files are rewritten only when their content changes. A quoted #include that resolves to no
# file (relative to the including file, then to KERNEL_DIR) is an error; <...> includes stay.
cmake_minimum_required(VERSION 3.21)

foreach(required KERNEL_DIR OUTPUT_DIR)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "embed_sources.cmake: -D${required}=... is required")
  endif()
endforeach()
get_filename_component(KERNEL_DIR "${KERNEL_DIR}" REALPATH)

function(mfa_write_if_changed path content)
  if(EXISTS "${path}")
    file(READ "${path}" existing)
    if(existing STREQUAL content)
      return()
    endif()
  endif()
  file(WRITE "${path}" "${content}")
endfunction()

function(mfa_count_lines text out_var)
  string(REGEX MATCHALL "\n" newlines "${text}")
  list(LENGTH newlines count)
  set(${out_var} ${count} PARENT_SCOPE)
endfunction()

# Sets out_var to the text of `file` with its quoted includes inlined. Headers already inlined
# into the current source (global property MFA_EMBED_SEEN) are skipped: they are guarded.
function(mfa_resolve file out_var)
  get_filename_component(directory "${file}" DIRECTORY)
  file(RELATIVE_PATH display "${KERNEL_DIR}" "${file}")
  file(READ "${file}" text)
  # A leading newline lets one pattern find directives on the first line too.
  set(rest "\n${text}")
  set(result "")
  set(line 0)
  while(TRUE)
    string(REGEX MATCH "\n[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"[^\n]*" directive "${rest}")
    if(directive STREQUAL "")
      break()
    endif()
    set(name "${CMAKE_MATCH_1}")
    string(FIND "${rest}" "${directive}" at)
    string(SUBSTRING "${rest}" 0 ${at} before)
    string(LENGTH "${directive}" directive_length)
    math(EXPR after_start "${at} + ${directive_length}")
    string(SUBSTRING "${rest}" ${after_start} -1 rest)
    mfa_count_lines("${before}\n" before_lines)
    math(EXPR line "${line} + ${before_lines}") # the directive's own line number

    set(included "")
    foreach(candidate "${directory}/${name}" "${KERNEL_DIR}/${name}")
      if(EXISTS "${candidate}" AND NOT IS_DIRECTORY "${candidate}")
        get_filename_component(included "${candidate}" REALPATH)
        break()
      endif()
    endforeach()
    if(included STREQUAL "")
      message(FATAL_ERROR "embed_sources.cmake: ${display}:${line}: cannot resolve "
                          "#include \"${name}\" (looked beside it and in ${KERNEL_DIR})")
    endif()

    get_property(seen GLOBAL PROPERTY MFA_EMBED_SEEN)
    math(EXPR next_line "${line} + 1")
    if(included IN_LIST seen)
      string(APPEND result "${before}\n// #include \"${name}\": already included above")
    else()
      set_property(GLOBAL APPEND PROPERTY MFA_EMBED_SEEN "${included}")
      mfa_resolve("${included}" inlined)
      file(RELATIVE_PATH included_display "${KERNEL_DIR}" "${included}")
      string(APPEND result "${before}\n#line 1 \"${included_display}\"\n${inlined}\n"
                           "#line ${next_line} \"${display}\"")
    endif()
  endwhile()
  string(APPEND result "${rest}")
  string(SUBSTRING "${result}" 1 -1 result) # the leading newline added above
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

file(GLOB sources LIST_DIRECTORIES false "${KERNEL_DIR}/*.metal")
list(SORT sources)
if(NOT sources)
  message(FATAL_ERROR "embed_sources.cmake: no .metal files in ${KERNEL_DIR}")
endif()

file(MAKE_DIRECTORY "${OUTPUT_DIR}/resolved")
set(arrays "")
set(table "")
set(everything "")
set(index 0)
foreach(source IN LISTS sources)
  get_filename_component(name "${source}" NAME)
  get_filename_component(real "${source}" REALPATH)
  set_property(GLOBAL PROPERTY MFA_EMBED_SEEN "${real}")
  mfa_resolve("${real}" resolved)
  set(resolved_path "${OUTPUT_DIR}/resolved/${name}")
  mfa_write_if_changed("${resolved_path}" "${resolved}")
  string(APPEND everything "${name}\n${resolved}\n")

  file(READ "${resolved_path}" hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f])"
         "\\1\n    " hex "${hex}")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(APPEND arrays "static const char source_${index}[] = {\n    ${bytes}0x00};\n\n")
  string(APPEND table "    {\"${name}\", source_${index}},\n")
  math(EXPR index "${index} + 1")
endforeach()

string(SHA256 digest "${everything}")
string(SUBSTRING "${digest}" 0 16 digest)
set(stamp "kernel_source_stamp_${digest}")

mfa_write_if_changed("${OUTPUT_DIR}/embedded_sources.c"
"/* Generated by native/src/metal/embed_sources.cmake from the .metal files of ${KERNEL_DIR}. Do not edit. */
#include \"metal/embedded_sources.h\"

${arrays}const mfa_metal_embedded_source mfa_metal_embedded_sources[] = {
${table}};

const size_t mfa_metal_embedded_source_count = ${index};

const char mfa_metal_source_stamp[] = \"${stamp}\";
")

mfa_write_if_changed("${OUTPUT_DIR}/source_stamp.metal"
"// Generated by native/src/metal/embed_sources.cmake. Linked into mfa.metallib, this kernel's
// name tells the host which kernel sources the metallib was built from.
kernel void ${stamp}() {}
")
