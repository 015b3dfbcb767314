# What the same-node GPU->GPU handoff (pd/, issue 6 item 4) needs: the CUDA runtime (found as
# CUDAToolkit; the handoff is host code calling cudart, so no nvcc is needed) and NCCL. Either
# may be absent -- a cache-only or CI machine has neither -- and configure says what it skips.
# Sets OSCARKV_PD_GPU_CUDA and OSCARKV_PD_GPU_NCCL; defines the imported target oscarkv::nccl.
# NCCL is searched in NCCL_ROOT, then next to the CUDA toolkit (Debian's / NVIDIA's packages).
option(OSCARKV_PD_GPU "Build the same-node GPU handoff's CUDA IPC / NCCL paths when found" ON)
set(OSCARKV_PD_GPU_CUDA OFF)
set(OSCARKV_PD_GPU_NCCL OFF)
if(NOT OSCARKV_PD_GPU)
  message(STATUS "pd: OSCARKV_PD_GPU=OFF; the GPU handoff's CUDA IPC / NCCL paths are SKIPPED")
  return()
endif()
if(NOT TARGET CUDA::cudart_static)
  find_package(CUDAToolkit QUIET)
endif()
if(NOT TARGET CUDA::cudart_static)
  message(STATUS "pd: no CUDA runtime found; the GPU handoff is SKIPPED (its CPU parts build)")
  return()
endif()
set(OSCARKV_PD_GPU_CUDA ON)
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  if(NOT TARGET oscarkv::nccl)
    add_library(oscarkv::nccl UNKNOWN IMPORTED)
    set_target_properties(oscarkv::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
  set(OSCARKV_PD_GPU_NCCL ON)
  message(STATUS "pd: GPU handoff with CUDA IPC and NCCL (${NCCL_LIBRARY})")
else()
  message(STATUS "pd: NCCL not found (set NCCL_ROOT); the GPU handoff's NCCL path is SKIPPED, "
                 "CUDA IPC builds")
endif()
