# Finds UCX 1.22, the one UCX every build uses (CPU and CUDA): the libucx-cu13 wheel that
# tools/install-deps.sh installs into the build venv (headers, CMake config, shared libraries with the
# cuda_copy/cuda_ipc transports, ucx_perftest). Debian 12's libucx (1.13) has no CUDA transports and
# loses its shared-memory RMA paths under UCP_FEATURE_WAKEUP, so it is not accepted.
# K3_UCX_ROOT (the wheel's libucx folder, or any prefix with lib/cmake/ucx) overrides the search;
# the offline kit puts its copy on CMAKE_PREFIX_PATH.
set(K3_UCX_ROOT "" CACHE PATH "UCX 1.22 prefix (holds lib/cmake/ucx); empty = the build venv's libucx-cu13")
set(_k3_ucx_hints ${K3_UCX_ROOT})
if(NOT K3_UCX_ROOT)
  file(GLOB _k3_ucx_hints ${CMAKE_BINARY_DIR}/venv/lib/python3*/site-packages/libucx)
endif()
find_package(ucx 1.22 CONFIG HINTS ${_k3_ucx_hints})
if(ucx_FOUND)
  get_filename_component(K3_UCX_PREFIX "${ucx_DIR}/../../.." ABSOLUTE)
  set(UCX_FOUND TRUE)
  add_library(k3_ucx INTERFACE)
  target_link_libraries(k3_ucx INTERFACE ucx::ucp ucx::ucs)
  # The wheel's ucx_perftest (same UCX, CUDA memory types): k3-bench transfer runs it as its reference.
  find_program(K3_UCX_PERFTEST ucx_perftest HINTS ${K3_UCX_PREFIX}/bin NO_DEFAULT_PATH NO_CACHE)
  message(STATUS "k3serve: UCX ${ucx_VERSION} from ${K3_UCX_PREFIX}")
else()
  set(UCX_FOUND FALSE)
  message(STATUS "k3serve: UCX 1.22 not found (tools/install-deps.sh installs libucx-cu13 into ${CMAKE_BINARY_DIR}/venv)")
endif()
