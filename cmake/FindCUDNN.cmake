# FindCUDNN: locates cudnn.h and libcudnn, for libddp's call of cuDNN's fused
# BatchNorm (batchnorm/cudnn_batch_norm.cpp; the rest reaches cuDNN through ATen).
#
# Looks in CUDNN_ROOT (CMake or environment variable), the CUDA toolkit
# prefix, the system paths and the `nvidia.cudnn` package of python3 (what
# PyTorch wheels load). Defines CUDNN_FOUND and the target CUDNN::CUDNN.

include(${CMAKE_CURRENT_LIST_DIR}/PythonPackagePrefix.cmake)
ddp_python_package_prefix(nvidia.cudnn _cudnn_python_prefix)
set(_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${_cudnn_python_prefix})

find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${_cudnn_hints} PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR HINTS ${_cudnn_hints} PATH_SUFFIXES lib lib64)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR)

if(CUDNN_FOUND AND NOT TARGET CUDNN::CUDNN)
  add_library(CUDNN::CUDNN UNKNOWN IMPORTED)
  set_target_properties(CUDNN::CUDNN PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
