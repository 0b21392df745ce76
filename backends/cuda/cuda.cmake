# cuda.cmake — builds clpar's CUDA backend module (backends/cuda/*.c, kernels/cuda/*.cu) as the
# backend library clpar_backend_cuda. Included by the top-level CMakeLists.txt, in its scope, unless CLPAR_CUDA is
# OFF. CLPAR_CUDA=AUTO builds the module when nvcc and the toolkit (with cuBLAS) are found and
# says why not otherwise; CLPAR_CUDA=ON makes a missing toolkit an error. The module needs no
# GPU to build: without one, it reports no devices at run time.
#
# Sets CLPAR_HAVE_CUDA ON (seen by tests/) and the PUBLIC definition CLPAR_HAVE_CUDA.

string(TOUPPER "${CLPAR_CUDA}" _clpar_cuda_mode)
if(_clpar_cuda_mode MATCHES "^(ON|TRUE|YES|Y|1)$")
  set(_clpar_cuda_mode ON)
elseif(_clpar_cuda_mode MATCHES "^(OFF|FALSE|NO|N|0)$")
  return()
elseif(NOT _clpar_cuda_mode STREQUAL "AUTO")
  message(FATAL_ERROR "clpar: CLPAR_CUDA is \"${CLPAR_CUDA}\"; it must be AUTO, ON or OFF")
endif()

# check_language() tries nvcc in a separate project, so a missing or broken compiler is
# reported here instead of failing enable_language() below.
set(_clpar_cuda_why "")
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  set(_clpar_cuda_why "no working CUDA compiler (nvcc); put it on PATH or set CMAKE_CUDA_COMPILER")
endif()

if(NOT _clpar_cuda_why AND NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  # SASS for Ampere (sm_80, which also runs on sm_86/sm_89) and Hopper (sm_90), and PTX of
  # sm_90 that the driver compiles for newer GPUs. Two architectures keep nvcc's compile time
  # down. Toolkits older than 11.8 know no sm_90, so the list follows what nvcc supports.
  execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --list-gpu-arch
    OUTPUT_VARIABLE _clpar_nvcc_archs ERROR_QUIET RESULT_VARIABLE _clpar_nvcc_rc)
  if(_clpar_nvcc_rc EQUAL 0 AND _clpar_nvcc_archs MATCHES "compute_90")
    set(_clpar_cuda_archs "80-real;90")
  else()
    set(_clpar_cuda_archs "80")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${_clpar_cuda_archs}" CACHE STRING
    "CUDA architectures clpar's kernels are compiled for")
endif()

if(NOT _clpar_cuda_why)
  enable_language(CUDA)
  # After enable_language, FindCUDAToolkit takes the toolkit of the compiler just enabled, so
  # headers, libraries and nvcc agree.
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    set(_clpar_cuda_why "CUDA toolkit not found (set CUDAToolkit_ROOT)")
  elseif(NOT TARGET CUDA::cudart OR NOT TARGET CUDA::cublas OR NOT TARGET CUDA::cublasLt)
    set(_clpar_cuda_why "the CUDA toolkit ${CUDAToolkit_VERSION} has no cudart, cuBLAS or cuBLASLt")
  endif()
endif()

if(_clpar_cuda_why)
  if(_clpar_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "clpar: CLPAR_CUDA=ON but ${_clpar_cuda_why}")
  endif()
  message(STATUS "clpar: CUDA module not built: ${_clpar_cuda_why}")
  return()
endif()

get_filename_component(_clpar_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
file(GLOB _clpar_cuda_sources CONFIGURE_DEPENDS
  ${_clpar_root}/backends/cuda/*.c ${_clpar_root}/kernels/cuda/*.cu)
# cuda_nccl.c is added by cmake/ClparNCCL.cmake when NCCL is built (after MPI is found).
list(FILTER _clpar_cuda_sources EXCLUDE REGEX "/cuda_nccl\\.c$")
# cuda_cudnn.c is added by cmake/ClparCUDNN.cmake when cuDNN's headers are found.
list(FILTER _clpar_cuda_sources EXCLUDE REGEX "/cuda_cudnn\\.c$")

clpar_backend_library(clpar_backend_cuda ${_clpar_cuda_sources})
target_compile_options(clpar_backend_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
target_compile_definitions(clpar_objects PUBLIC CLPAR_HAVE_CUDA)
# cuBLASLt: a Linear's bias and ReLU in the GEMM's epilogue (cuda_lt.c, CLPAR_CUDA_LT=1).
target_link_libraries(clpar_objects PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt)
target_link_libraries(clpar_backend_cuda PRIVATE CUDA::cudart CUDA::cublas CUDA::cublasLt)
# The shared runtime, as CUDA::cudart links it: one runtime per process. clpar and
# clpar_internal are made after this file runs and take the variable's value.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
# Set explicitly: a target made before CMAKE_CUDA_ARCHITECTURES had a value (on a first
# configure) takes none.
set_target_properties(clpar_backend_cuda PROPERTIES
  CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_VISIBILITY_PRESET hidden
  CUDA_RUNTIME_LIBRARY Shared)

set(CLPAR_HAVE_CUDA ON)
include(${_clpar_root}/cmake/ClparCUDNN.cmake)
message(STATUS
  "clpar: CUDA module built (toolkit ${CUDAToolkit_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")
