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
include(${CMAKE_CURRENT_LIST_DIR}/ClparDeps.cmake)
set(CLPAR_HAVE_CUDNN OFF)
clpar_dep_mode(CLPAR_CUDNN cuDNN _clpar_cudnn_mode)
if(_clpar_cudnn_mode STREQUAL "OFF")
  return()
endif()

set(_clpar_cudnn_why "")
clpar_find_cuda_header(CLPAR_CUDNN_INCLUDE_DIR cudnn_version.h CUDNN_ROOT)
if(NOT CLPAR_CUDNN_INCLUDE_DIR OR NOT EXISTS "${CLPAR_CUDNN_INCLUDE_DIR}/cudnn.h")
  set(_clpar_cudnn_why "cudnn.h not found next to the CUDA toolkit (set CUDNN_ROOT)")
else()
  clpar_header_version("${CLPAR_CUDNN_INCLUDE_DIR}/cudnn_version.h" CUDNN CLPAR_CUDNN_VERSION
    MAJOR MINOR PATCHLEVEL)
  set(_clpar_cudnn_MAJOR "${CLPAR_CUDNN_VERSION_MAJOR}")
  if(NOT _clpar_cudnn_MAJOR MATCHES "^[0-9]+$" OR _clpar_cudnn_MAJOR LESS 9)
    set(_clpar_cudnn_why "cuDNN ${CLPAR_CUDNN_VERSION} (${CLPAR_CUDNN_INCLUDE_DIR}) is older than 9")
  endif()
endif()

if(_clpar_cudnn_why)
  clpar_dep_unmet(${_clpar_cudnn_mode} CLPAR_CUDNN cuDNN "${_clpar_cudnn_why}")
  return()
endif()

target_sources(clpar_backend_cuda PRIVATE ${_clpar_root}/backends/cuda/cuda_cudnn.c)
target_include_directories(clpar_backend_cuda PRIVATE ${CLPAR_CUDNN_INCLUDE_DIR})
target_compile_definitions(clpar_objects PUBLIC CLPAR_HAVE_CUDNN)
target_link_libraries(clpar_objects PUBLIC ${CMAKE_DL_LIBS})
set(CLPAR_HAVE_CUDNN ON)
message(STATUS "clpar: cuDNN ${CLPAR_CUDNN_VERSION} headers (CUDA convolutions; "
  "libcudnn.so.${_clpar_cudnn_MAJOR} opened at run time): ${CLPAR_CUDNN_INCLUDE_DIR}")
