/* ocl_errors.c — names for OpenCL error codes and CLBlast status codes, so that every failure
 * message names the driver's error ("clFinish: CL_OUT_OF_RESOURCES") instead of a number. */
#include <clblast_c.h>
#include <stdio.h>

#include "ocl_internal.h"

typedef struct {
  int code;
  const char *name;
} code_name;

#define CL_NAME_(x) \
  { x, #x }

static const code_name cl_names[] = {
    CL_NAME_(CL_SUCCESS),
    CL_NAME_(CL_DEVICE_NOT_FOUND),
    CL_NAME_(CL_DEVICE_NOT_AVAILABLE),
    CL_NAME_(CL_COMPILER_NOT_AVAILABLE),
    CL_NAME_(CL_MEM_OBJECT_ALLOCATION_FAILURE),
    CL_NAME_(CL_OUT_OF_RESOURCES),
    CL_NAME_(CL_OUT_OF_HOST_MEMORY),
    CL_NAME_(CL_PROFILING_INFO_NOT_AVAILABLE),
    CL_NAME_(CL_MEM_COPY_OVERLAP),
    CL_NAME_(CL_IMAGE_FORMAT_MISMATCH),
    CL_NAME_(CL_IMAGE_FORMAT_NOT_SUPPORTED),
    CL_NAME_(CL_BUILD_PROGRAM_FAILURE),
    CL_NAME_(CL_MAP_FAILURE),
    CL_NAME_(CL_MISALIGNED_SUB_BUFFER_OFFSET),
    CL_NAME_(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST),
    CL_NAME_(CL_COMPILE_PROGRAM_FAILURE),
    CL_NAME_(CL_LINKER_NOT_AVAILABLE),
    CL_NAME_(CL_LINK_PROGRAM_FAILURE),
    CL_NAME_(CL_DEVICE_PARTITION_FAILED),
    CL_NAME_(CL_KERNEL_ARG_INFO_NOT_AVAILABLE),
    CL_NAME_(CL_INVALID_VALUE),
    CL_NAME_(CL_INVALID_DEVICE_TYPE),
    CL_NAME_(CL_INVALID_PLATFORM),
    CL_NAME_(CL_INVALID_DEVICE),
    CL_NAME_(CL_INVALID_CONTEXT),
    CL_NAME_(CL_INVALID_QUEUE_PROPERTIES),
    CL_NAME_(CL_INVALID_COMMAND_QUEUE),
    CL_NAME_(CL_INVALID_HOST_PTR),
    CL_NAME_(CL_INVALID_MEM_OBJECT),
    CL_NAME_(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR),
    CL_NAME_(CL_INVALID_IMAGE_SIZE),
    CL_NAME_(CL_INVALID_SAMPLER),
    CL_NAME_(CL_INVALID_BINARY),
    CL_NAME_(CL_INVALID_BUILD_OPTIONS),
    CL_NAME_(CL_INVALID_PROGRAM),
    CL_NAME_(CL_INVALID_PROGRAM_EXECUTABLE),
    CL_NAME_(CL_INVALID_KERNEL_NAME),
    CL_NAME_(CL_INVALID_KERNEL_DEFINITION),
    CL_NAME_(CL_INVALID_KERNEL),
    CL_NAME_(CL_INVALID_ARG_INDEX),
    CL_NAME_(CL_INVALID_ARG_VALUE),
    CL_NAME_(CL_INVALID_ARG_SIZE),
    CL_NAME_(CL_INVALID_KERNEL_ARGS),
    CL_NAME_(CL_INVALID_WORK_DIMENSION),
    CL_NAME_(CL_INVALID_WORK_GROUP_SIZE),
    CL_NAME_(CL_INVALID_WORK_ITEM_SIZE),
    CL_NAME_(CL_INVALID_GLOBAL_OFFSET),
    CL_NAME_(CL_INVALID_EVENT_WAIT_LIST),
    CL_NAME_(CL_INVALID_EVENT),
    CL_NAME_(CL_INVALID_OPERATION),
    CL_NAME_(CL_INVALID_GL_OBJECT),
    CL_NAME_(CL_INVALID_BUFFER_SIZE),
    CL_NAME_(CL_INVALID_MIP_LEVEL),
    CL_NAME_(CL_INVALID_GLOBAL_WORK_SIZE),
    CL_NAME_(CL_INVALID_PROPERTY),
    CL_NAME_(CL_INVALID_IMAGE_DESCRIPTOR),
    CL_NAME_(CL_INVALID_COMPILER_OPTIONS),
    CL_NAME_(CL_INVALID_LINKER_OPTIONS),
    CL_NAME_(CL_INVALID_DEVICE_PARTITION_COUNT),
    /* Newer than 1.2, but a 2.x or 3.0 driver may return them. */
    {-69, "CL_INVALID_PIPE_SIZE"},
    {-70, "CL_INVALID_DEVICE_QUEUE"},
    {-71, "CL_INVALID_SPEC_ID"},
    {-72, "CL_MAX_SIZE_RESTRICTION_EXCEEDED"},
    /* Extensions that show up from the ICD loader and common drivers. */
    {-1000, "CL_INVALID_GL_SHAREGROUP_REFERENCE_KHR"},
    {-1001, "CL_PLATFORM_NOT_FOUND_KHR"},
    {-1002, "CL_INVALID_D3D10_DEVICE_KHR"},
    {-1057, "CL_DEVICE_PARTITION_FAILED_EXT"},
    {-1058, "CL_INVALID_PARTITION_COUNT_EXT"},
    {-1059, "CL_INVALID_PARTITION_NAME_EXT"},
};

#define CLB_NAME_(x) \
  { x, #x }

static const code_name clblast_names[] = {
    CLB_NAME_(CLBlastSuccess),
    CLB_NAME_(CLBlastOpenCLCompilerNotAvailable),
    CLB_NAME_(CLBlastTempBufferAllocFailure),
    CLB_NAME_(CLBlastOpenCLOutOfResources),
    CLB_NAME_(CLBlastOpenCLOutOfHostMemory),
    CLB_NAME_(CLBlastOpenCLBuildProgramFailure),
    CLB_NAME_(CLBlastInvalidValue),
    CLB_NAME_(CLBlastInvalidCommandQueue),
    CLB_NAME_(CLBlastInvalidMemObject),
    CLB_NAME_(CLBlastInvalidBinary),
    CLB_NAME_(CLBlastInvalidBuildOptions),
    CLB_NAME_(CLBlastInvalidProgram),
    CLB_NAME_(CLBlastInvalidProgramExecutable),
    CLB_NAME_(CLBlastInvalidKernelName),
    CLB_NAME_(CLBlastInvalidKernelDefinition),
    CLB_NAME_(CLBlastInvalidKernel),
    CLB_NAME_(CLBlastInvalidArgIndex),
    CLB_NAME_(CLBlastInvalidArgValue),
    CLB_NAME_(CLBlastInvalidArgSize),
    CLB_NAME_(CLBlastInvalidKernelArgs),
    CLB_NAME_(CLBlastInvalidLocalNumDimensions),
    CLB_NAME_(CLBlastInvalidLocalThreadsTotal),
    CLB_NAME_(CLBlastInvalidLocalThreadsDim),
    CLB_NAME_(CLBlastInvalidGlobalOffset),
    CLB_NAME_(CLBlastInvalidEventWaitList),
    CLB_NAME_(CLBlastInvalidEvent),
    CLB_NAME_(CLBlastInvalidOperation),
    CLB_NAME_(CLBlastInvalidBufferSize),
    CLB_NAME_(CLBlastInvalidGlobalWorkSize),
    CLB_NAME_(CLBlastNotImplemented),
    CLB_NAME_(CLBlastInvalidMatrixA),
    CLB_NAME_(CLBlastInvalidMatrixB),
    CLB_NAME_(CLBlastInvalidMatrixC),
    CLB_NAME_(CLBlastInvalidVectorX),
    CLB_NAME_(CLBlastInvalidVectorY),
    CLB_NAME_(CLBlastInvalidDimension),
    CLB_NAME_(CLBlastInvalidLeadDimA),
    CLB_NAME_(CLBlastInvalidLeadDimB),
    CLB_NAME_(CLBlastInvalidLeadDimC),
    CLB_NAME_(CLBlastInvalidIncrementX),
    CLB_NAME_(CLBlastInvalidIncrementY),
    CLB_NAME_(CLBlastInsufficientMemoryA),
    CLB_NAME_(CLBlastInsufficientMemoryB),
    CLB_NAME_(CLBlastInsufficientMemoryC),
    CLB_NAME_(CLBlastInsufficientMemoryX),
    CLB_NAME_(CLBlastInsufficientMemoryY),
    CLB_NAME_(CLBlastInsufficientMemoryTemp),
    CLB_NAME_(CLBlastInvalidBatchCount),
    CLB_NAME_(CLBlastInvalidOverrideKernel),
    CLB_NAME_(CLBlastMissingOverrideParameter),
    CLB_NAME_(CLBlastInvalidLocalMemUsage),
    CLB_NAME_(CLBlastNoHalfPrecision),
    CLB_NAME_(CLBlastNoDoublePrecision),
    CLB_NAME_(CLBlastInvalidVectorScalar),
    CLB_NAME_(CLBlastInsufficientMemoryScalar),
    CLB_NAME_(CLBlastDatabaseError),
    CLB_NAME_(CLBlastUnknownError),
    CLB_NAME_(CLBlastUnexpectedError),
};

static _Thread_local char unknown_name[48];

static const char *lookup(const code_name *table, size_t n, int code, const char *unknown) {
  for (size_t i = 0; i < n; i++)
    if (table[i].code == code) return table[i].name;
  snprintf(unknown_name, sizeof unknown_name, "%s(%d)", unknown, code);
  return unknown_name;
}

const char *clpar_ocl_error_name(cl_int err) {
  return lookup(cl_names, sizeof cl_names / sizeof cl_names[0], err, "CL_UNKNOWN_ERROR");
}

const char *clpar_ocl_clblast_status_name(int status) {
  return lookup(clblast_names, sizeof clblast_names / sizeof clblast_names[0], status,
                "CLBlastUnknownStatus");
}

clpar_status clpar_ocl_status(cl_int err) {
  switch (err) {
    case CL_SUCCESS:
      return CLPAR_OK;
    case CL_MEM_OBJECT_ALLOCATION_FAILURE:
    case CL_OUT_OF_HOST_MEMORY:
    case CL_OUT_OF_RESOURCES: /* what several drivers answer when device memory runs out */
      return CLPAR_ERROR_OUT_OF_MEMORY;
    case CL_INVALID_BUFFER_SIZE:
      return CLPAR_ERROR_TOO_LARGE;
    default:
      return CLPAR_ERROR_BACKEND;
  }
}
