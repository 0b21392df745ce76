# ClparDeps.cmake — what the find modules of the CUDA module's optional libraries
# (ClparNCCL.cmake, ClparCUDNN.cmake) share: the AUTO/ON/OFF option, the header search next to
# the CUDA toolkit, the version from the header's #defines, and what a missing piece does.
include_guard(GLOBAL)

# clpar_dep_mode(<option> <label> <out>): <out> = ON, AUTO or OFF from the option's value
# (TRUE/YES/Y/1 are ON, FALSE/NO/N/0 OFF, any case); OFF says "<label> off"; any other value
# is an error naming the option.
function(clpar_dep_mode option label out)
  string(TOUPPER "${${option}}" _mode)
  if(_mode MATCHES "^(ON|TRUE|YES|Y|1)$")
    set(_mode ON)
  elseif(_mode MATCHES "^(OFF|FALSE|NO|N|0)$")
    set(_mode OFF)
    message(STATUS "clpar: ${label} off (${option}=OFF)")
  elseif(NOT _mode STREQUAL "AUTO")
    message(FATAL_ERROR "clpar: ${option} is \"${${option}}\"; it must be AUTO, ON or OFF")
  endif()
  set(${out} ${_mode} PARENT_SCOPE)
endfunction()

# clpar_find_cuda_header(<var> <header> <root>): find_path of header into the cache variable
# <var>, under <root> (a variable or environment variable such as NCCL_ROOT) or next to the
# CUDA toolkit.
function(clpar_find_cuda_header var header root)
  find_path(${var} ${header}
    HINTS ${${root}} ENV ${root} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
    PATH_SUFFIXES include)
endfunction()

# clpar_header_version(<header> <prefix> <out> <part>...): <out> = the parts joined by dots,
# read from the header's lines "#define <prefix>_<part> <number>", and <out>_<part> each one.
function(clpar_header_version header prefix out)
  string(JOIN "|" _alternatives ${ARGN})
  file(STRINGS "${header}" _defs REGEX "^#define ${prefix}_(${_alternatives}) +[0-9]+")
  set(_parts "")
  foreach(_part ${ARGN})
    string(REGEX REPLACE ".*#define ${prefix}_${_part} +([0-9]+).*" "\\1" _value "${_defs}")
    set(${out}_${_part} "${_value}" PARENT_SCOPE)
    list(APPEND _parts "${_value}")
  endforeach()
  string(JOIN "." _version ${_parts})
  set(${out} "${_version}" PARENT_SCOPE)
endfunction()

# clpar_dep_unmet(<mode> <option> <label> <why>): a missing piece is an error when the option
# is ON, else said ("<label> not built: <why>"); the caller then returns.
function(clpar_dep_unmet mode option label why)
  if(mode STREQUAL "ON")
    message(FATAL_ERROR "clpar: ${option}=ON but ${why}")
  endif()
  message(STATUS "clpar: ${label} not built: ${why}")
endfunction()
