# ClparNCCL.cmake — NCCL for DistributedDataParallel on CUDA devices (backends/cuda/cuda_nccl.c,
# src/dist/ddp_nccl.c). Included after ClparMPI.cmake. CLPAR_NCCL=AUTO builds it when the CUDA
# module is built, MPI is found (rank 0's NCCL id goes to the other ranks over MPI) and nccl.h
# and libnccl (2.14 or newer) are found next to the CUDA toolkit, or under NCCL_ROOT; ON makes a
# missing piece an error; OFF leaves it out (DDP then reduces CUDA devices over MPI too).
#
# NCCL is a private dependency of the CUDA module: libclpar links it, and neither the exported
# CMake target nor clpar.pc names it (libclpar is a shared library; its users never call NCCL).
#
# Sets CLPAR_HAVE_NCCL ON (seen by tests/) and the PUBLIC definition CLPAR_HAVE_NCCL.
set(CLPAR_HAVE_NCCL OFF)
string(TOUPPER "${CLPAR_NCCL}" _clpar_nccl_mode)
if(_clpar_nccl_mode MATCHES "^(ON|TRUE|YES|Y|1)$")
  set(_clpar_nccl_mode ON)
elseif(_clpar_nccl_mode MATCHES "^(OFF|FALSE|NO|N|0)$")
  message(STATUS "clpar: NCCL off (CLPAR_NCCL=OFF)")
  return()
elseif(NOT _clpar_nccl_mode STREQUAL "AUTO")
  message(FATAL_ERROR "clpar: CLPAR_NCCL is \"${CLPAR_NCCL}\"; it must be AUTO, ON or OFF")
endif()

set(_clpar_nccl_why "")
if(NOT CLPAR_HAVE_CUDA)
  set(_clpar_nccl_why "the CUDA module is not built (CLPAR_CUDA)")
elseif(NOT CLPAR_HAVE_MPI)
  set(_clpar_nccl_why "MPI is not built (CLPAR_MPI): DistributedDataParallel sends NCCL's id over MPI")
else()
  find_path(CLPAR_NCCL_INCLUDE_DIR nccl.h
    HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
    PATH_SUFFIXES include)
  find_library(CLPAR_NCCL_LIBRARY nccl
    HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
    PATH_SUFFIXES lib lib64)
  if(NOT CLPAR_NCCL_INCLUDE_DIR OR NOT CLPAR_NCCL_LIBRARY)
    set(_clpar_nccl_why
      "nccl.h or libnccl not found next to the CUDA toolkit ${CUDAToolkit_VERSION} (set NCCL_ROOT)")
  else()
    file(STRINGS "${CLPAR_NCCL_INCLUDE_DIR}/nccl.h" _clpar_nccl_defs
      REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
    foreach(_part MAJOR MINOR PATCH)
      string(REGEX REPLACE ".*#define NCCL_${_part} +([0-9]+).*" "\\1" _clpar_nccl_${_part}
        "${_clpar_nccl_defs}")
    endforeach()
    set(CLPAR_NCCL_VERSION "${_clpar_nccl_MAJOR}.${_clpar_nccl_MINOR}.${_clpar_nccl_PATCH}")
    if(CLPAR_NCCL_VERSION VERSION_LESS 2.14)
      set(_clpar_nccl_why
        "NCCL ${CLPAR_NCCL_VERSION} (${CLPAR_NCCL_INCLUDE_DIR}) is older than 2.14 (non-blocking communicators)")
    endif()
  endif()
endif()

if(_clpar_nccl_why)
  if(_clpar_nccl_mode STREQUAL "ON")
    message(FATAL_ERROR "clpar: CLPAR_NCCL=ON but ${_clpar_nccl_why}")
  endif()
  message(STATUS "clpar: NCCL not built: ${_clpar_nccl_why}")
  return()
endif()

target_sources(clpar_backend_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/backends/cuda/cuda_nccl.c)
target_include_directories(clpar_backend_cuda PRIVATE ${CLPAR_NCCL_INCLUDE_DIR})
target_compile_definitions(clpar_objects PUBLIC CLPAR_HAVE_NCCL)
target_link_libraries(clpar_objects PUBLIC ${CLPAR_NCCL_LIBRARY})
set(CLPAR_HAVE_NCCL ON)
message(STATUS "clpar: NCCL ${CLPAR_NCCL_VERSION} (DistributedDataParallel on CUDA devices): "
  "${CLPAR_NCCL_LIBRARY}")
