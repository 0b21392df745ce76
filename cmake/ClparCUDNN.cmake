# ClparCUDNN.cmake — the CUDA module's convolutions through cuDNN (backends/cuda/cuda_cudnn.c).
# Included by backends/cuda/cuda.cmake once the module is built. CLPAR_CUDNN=AUTO builds it when
# cudnn.h (cuDNN 9 or newer) is found next to the CUDA toolkit or under CUDNN_ROOT; ON makes a
# missing or older cuDNN an error; OFF leaves it out.
#
# Only the headers are needed to build: cuda_cudnn.c opens libcudnn.so.<major> with dlopen at
# run time (through LD_LIBRARY_PATH and the loader's cache), so libclpar does not depend on
# cuDNN and runs, with the plain convolutions, where it is missing.
#
# Sets CLPAR_HAVE_CUDNN ON (seen by tests/) and the PUBLIC definition CLPAR_HAVE_CUDNN.
set(CLPAR_HAVE_CUDNN OFF)
string(TOUPPER "${CLPAR_CUDNN}" _clpar_cudnn_mode)
if(_clpar_cudnn_mode MATCHES "^(ON|TRUE|YES|Y|1)$")
  set(_clpar_cudnn_mode ON)
elseif(_clpar_cudnn_mode MATCHES "^(OFF|FALSE|NO|N|0)$")
  message(STATUS "clpar: cuDNN off (CLPAR_CUDNN=OFF)")
  return()
elseif(NOT _clpar_cudnn_mode STREQUAL "AUTO")
  message(FATAL_ERROR "clpar: CLPAR_CUDNN is \"${CLPAR_CUDNN}\"; it must be AUTO, ON or OFF")
endif()

set(_clpar_cudnn_why "")
find_path(CLPAR_CUDNN_INCLUDE_DIR cudnn_version.h
  HINTS ${CUDNN_ROOT} ENV CUDNN_ROOT ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES include)
if(NOT CLPAR_CUDNN_INCLUDE_DIR OR NOT EXISTS "${CLPAR_CUDNN_INCLUDE_DIR}/cudnn.h")
  set(_clpar_cudnn_why "cudnn.h not found next to the CUDA toolkit (set CUDNN_ROOT)")
else()
  file(STRINGS "${CLPAR_CUDNN_INCLUDE_DIR}/cudnn_version.h" _clpar_cudnn_defs
    REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(_part MAJOR MINOR PATCHLEVEL)
    string(REGEX REPLACE ".*#define CUDNN_${_part} +([0-9]+).*" "\\1" _clpar_cudnn_${_part}
      "${_clpar_cudnn_defs}")
  endforeach()
  set(CLPAR_CUDNN_VERSION "${_clpar_cudnn_MAJOR}.${_clpar_cudnn_MINOR}.${_clpar_cudnn_PATCHLEVEL}")
  if(NOT _clpar_cudnn_MAJOR MATCHES "^[0-9]+$" OR _clpar_cudnn_MAJOR LESS 9)
    set(_clpar_cudnn_why "cuDNN ${CLPAR_CUDNN_VERSION} (${CLPAR_CUDNN_INCLUDE_DIR}) is older than 9")
  endif()
endif()

if(_clpar_cudnn_why)
  if(_clpar_cudnn_mode STREQUAL "ON")
    message(FATAL_ERROR "clpar: CLPAR_CUDNN=ON but ${_clpar_cudnn_why}")
  endif()
  message(STATUS "clpar: cuDNN not built: ${_clpar_cudnn_why}")
  return()
endif()

target_sources(clpar_backend_cuda PRIVATE ${_clpar_root}/backends/cuda/cuda_cudnn.c)
target_include_directories(clpar_backend_cuda PRIVATE ${CLPAR_CUDNN_INCLUDE_DIR})
target_compile_definitions(clpar_objects PUBLIC CLPAR_HAVE_CUDNN)
target_link_libraries(clpar_objects PUBLIC ${CMAKE_DL_LIBS})
set(CLPAR_HAVE_CUDNN ON)
message(STATUS "clpar: cuDNN ${CLPAR_CUDNN_VERSION} headers (CUDA convolutions; "
  "libcudnn.so.${_clpar_cudnn_MAJOR} opened at run time): ${CLPAR_CUDNN_INCLUDE_DIR}")
