# ClparMPI.cmake — distributed training over MPI (include/clpar/dist.h). CLPAR_MPI=AUTO
# builds it when MPI is found, ON makes a missing MPI an error, OFF leaves it out (dist.h's
# functions then return CLPAR_ERROR_UNSUPPORTED). MPI is a private dependency of the shared
# library (no public header includes mpi.h): the exported CMake target does not name it, and
# clpar.pc lists it in Libs.private only (what a static link would need), so that neither
# find_package(clpar) nor pkg-config --cflags clpar asks a user's program for MPI.
set(CLPAR_HAVE_MPI OFF)
if(NOT CLPAR_MPI STREQUAL "OFF")
  if(CLPAR_MPI STREQUAL "ON")
    find_package(MPI REQUIRED COMPONENTS C)
  else()
    find_package(MPI QUIET COMPONENTS C)
  endif()
  if(MPI_C_FOUND)
    set(CLPAR_HAVE_MPI ON)
    target_sources(clpar_objects PRIVATE src/dist/ddp.c src/dist/ddp_comm.c src/dist/ddp_buckets.c
      src/dist/ddp_unused.c src/dist/ddp_uneven.c src/dist/ddp_nccl.c src/dist/ddp_graph.c)
    target_compile_definitions(clpar_objects PUBLIC CLPAR_HAVE_MPI)
    target_sources(clpar_objects PRIVATE src/dist/ddp_buffers.c)
    target_link_libraries(clpar_objects PUBLIC MPI::MPI_C)
    find_package(PkgConfig QUIET)
    if(PKG_CONFIG_FOUND)
      pkg_check_modules(CLPAR_PC_MPI QUIET mpi-c)
    endif()
    if(CLPAR_PC_MPI_FOUND)
      list(APPEND CLPAR_PC_LIBS_PRIVATE ${CLPAR_PC_MPI_LDFLAGS})
    else()
      list(APPEND CLPAR_PC_LIBS_PRIVATE ${MPI_C_LIBRARIES})
    endif()
    message(STATUS "clpar: MPI ${MPI_C_VERSION} (DistributedDataParallel); mpiexec: ${MPIEXEC_EXECUTABLE}")
  elseif(CLPAR_MPI STREQUAL "AUTO")
    message(STATUS "clpar: MPI not found; DistributedDataParallel not built (CLPAR_MPI=AUTO)")
  endif()
else()
  message(STATUS "clpar: MPI off (CLPAR_MPI=OFF)")
endif()
