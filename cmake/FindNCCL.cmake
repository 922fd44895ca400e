# FindNCCL: locates nccl.h and libnccl.
#
# Looks in, in this order: NCCL_ROOT (CMake or environment variable), the CUDA
# toolkit prefix, and the `nvidia.nccl` package of python3 (what PyTorch wheels
# load at run time). Defines NCCL_FOUND, NCCL_VERSION and the target NCCL::NCCL.

set(_nccl_hints)
if(NCCL_ROOT)
  list(APPEND _nccl_hints "${NCCL_ROOT}")
endif()
if(DEFINED ENV{NCCL_ROOT})
  list(APPEND _nccl_hints "$ENV{NCCL_ROOT}")
endif()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    get_filename_component(_parent "${_dir}" DIRECTORY)
    list(APPEND _nccl_hints "${_parent}")
  endforeach()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/PythonPackagePrefix.cmake)
ddp_python_package_prefix(nvidia.nccl _nccl_python_prefix)
if(_nccl_python_prefix)
  list(APPEND _nccl_hints "${_nccl_python_prefix}")
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} ([0-9]+).*" "\\1" NCCL_VERSION_${_part} "${_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  get_filename_component(_nccl_library_dir "${NCCL_LIBRARY}" DIRECTORY)
  # Libraries that need NCCL (LibTorch's CUDA part) must resolve it here at
  # link time too, not in whatever directory the linker meets first.
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}"
    INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${_nccl_library_dir}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
