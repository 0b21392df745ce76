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
include(${CMAKE_CURRENT_LIST_DIR}/ClparDeps.cmake)
set(CLPAR_HAVE_NCCL OFF)
clpar_dep_mode(CLPAR_NCCL NCCL _clpar_nccl_mode)
if(_clpar_nccl_mode STREQUAL "OFF")
  return()
endif()

set(_clpar_nccl_why "")
if(NOT CLPAR_HAVE_CUDA)
  set(_clpar_nccl_why "the CUDA module is not built (CLPAR_CUDA)")
elseif(NOT CLPAR_HAVE_MPI)
  set(_clpar_nccl_why "MPI is not built (CLPAR_MPI): DistributedDataParallel sends NCCL's id over MPI")
else()
  clpar_find_cuda_header(CLPAR_NCCL_INCLUDE_DIR nccl.h NCCL_ROOT)
  find_library(CLPAR_NCCL_LIBRARY nccl
    HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
    PATH_SUFFIXES lib lib64)
  if(NOT CLPAR_NCCL_INCLUDE_DIR OR NOT CLPAR_NCCL_LIBRARY)
    set(_clpar_nccl_why
      "nccl.h or libnccl not found next to the CUDA toolkit ${CUDAToolkit_VERSION} (set NCCL_ROOT)")
  else()
    clpar_header_version("${CLPAR_NCCL_INCLUDE_DIR}/nccl.h" NCCL CLPAR_NCCL_VERSION
      MAJOR MINOR PATCH)
    if(CLPAR_NCCL_VERSION VERSION_LESS 2.14)
      set(_clpar_nccl_why
        "NCCL ${CLPAR_NCCL_VERSION} (${CLPAR_NCCL_INCLUDE_DIR}) is older than 2.14 (non-blocking communicators)")
    endif()
  endif()
endif()

if(_clpar_nccl_why)
  clpar_dep_unmet(${_clpar_nccl_mode} CLPAR_NCCL NCCL "${_clpar_nccl_why}")
  return()
endif()

target_sources(clpar_backend_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/backends/cuda/cuda_nccl.c)
target_include_directories(clpar_backend_cuda PRIVATE ${CLPAR_NCCL_INCLUDE_DIR})
target_compile_definitions(clpar_objects PUBLIC CLPAR_HAVE_NCCL)
target_link_libraries(clpar_objects PUBLIC ${CLPAR_NCCL_LIBRARY})
set(CLPAR_HAVE_NCCL ON)
message(STATUS "clpar: NCCL ${CLPAR_NCCL_VERSION} (DistributedDataParallel on CUDA devices): "
  "${CLPAR_NCCL_LIBRARY}")
