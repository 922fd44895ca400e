# Finds LibTorch in the order users expect:
#   1. CMAKE_PREFIX_PATH / Torch_DIR (an explicit choice always wins),
#   2. the system package (Debian's libtorch-dev, CPU only),
#   3. the torch package of `python3` (PyPI wheels carry a CMake config).
# DDP_TORCH_FROM_PYTHON=ON skips step 2, so a machine that has both can pick
# the CUDA build without knowing where pip put it.

option(DDP_TORCH_FROM_PYTHON "Prefer the torch package of python3 over the system LibTorch" OFF)

if(NOT DDP_TORCH_FROM_PYTHON)
  find_package(Torch CONFIG QUIET)
endif()

if(NOT Torch_FOUND)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _ddp_python_torch_prefix
      OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET
      RESULT_VARIABLE _ddp_python_torch_result)
    if(_ddp_python_torch_result EQUAL 0 AND EXISTS "${_ddp_python_torch_prefix}")
      # TorchConfig looks for its Caffe2 part with a plain find_package, which
      # would pick a system LibTorch's Caffe2 over the wheel's own: pin it.
      set(Caffe2_DIR "${_ddp_python_torch_prefix}/Caffe2" CACHE PATH "Caffe2 of the python3 torch package" FORCE)
      # Likewise its find_library calls search system paths before the wheel's lib/.
      get_filename_component(_ddp_wheel_lib "${_ddp_python_torch_prefix}/../../lib" ABSOLUTE)
      foreach(_lib c10 c10_cuda torch torch_cpu torch_cuda)
        string(TOUPPER "${_lib}" _upper)
        foreach(_var ${_lib}_LIBRARY ${_upper}_LIBRARY)
          if(EXISTS "${_ddp_wheel_lib}/lib${_lib}.so")
            set(${_var} "${_ddp_wheel_lib}/lib${_lib}.so" CACHE FILEPATH "" FORCE)
          endif()
        endforeach()
      endforeach()
      find_package(Torch CONFIG QUIET PATHS "${_ddp_python_torch_prefix}" NO_DEFAULT_PATH)
    endif()
  endif()
endif()

if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "LibTorch was not found. Either\n"
    "  - pass -DCMAKE_PREFIX_PATH=/path/to/libtorch (or -DTorch_DIR=.../share/cmake/Torch),\n"
    "  - install Debian's CPU build: apt-get install libtorch-dev libgloo-dev, or\n"
    "  - install the CUDA build for python3: python3 -m pip install torch")
endif()

# Read the version from the headers: TorchConfig of older releases has none.
# Newer releases keep the numbers in torch/headeronly/version.h.
find_file(DDP_TORCH_VERSION_HEADER NAMES torch/headeronly/version.h torch/version.h
  PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH NO_CACHE)
file(STRINGS "${DDP_TORCH_VERSION_HEADER}" _ddp_torch_version_lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX REPLACE ".*#define TORCH_VERSION_${_part} ([0-9]+).*" "\\1" DDP_TORCH_VERSION_${_part} "${_ddp_torch_version_lines}")
endforeach()
set(DDP_TORCH_VERSION "${DDP_TORCH_VERSION_MAJOR}.${DDP_TORCH_VERSION_MINOR}.${DDP_TORCH_VERSION_PATCH}")

set(DDP_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(DDP_TORCH_HAS_CUDA ON)
endif()
message(STATUS "libddp: LibTorch ${DDP_TORCH_VERSION} from ${Torch_DIR} (CUDA: ${DDP_TORCH_HAS_CUDA})")
