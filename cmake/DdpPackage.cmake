# Installs libddp as a CMake package: headers, libddp.so, ddprun, and
# ddpConfig.cmake, through which find_package(ddp CONFIG) gives ddp::ddp.
include(CMakePackageConfigHelpers)

set(DDP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/ddp")

# The torch wheel's libraries and its NCCL live outside the system's library
# directories: the installed libddp.so must still find them, when it is loaded
# and when a consumer's linker follows its dependencies.
set_target_properties(ddp PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
# ddprun --doctor runs the probe it finds next to itself; the probe finds
# libddp.so in ../lib.
set_target_properties(ddp_doctor_probe PROPERTIES
  INSTALL_RPATH_USE_LINK_PATH TRUE INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")

install(TARGETS ddp EXPORT ddpTargets
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
install(TARGETS ddprun ddp_doctor_probe RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/ddp" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION "${DDP_INSTALL_CMAKEDIR}")

# The cache entries through which the build found LibTorch and NCCL, written
# into the config as defaults, so that consumers find the same ones.
set(_ddp_locations Torch_DIR Caffe2_DIR)
foreach(_lib c10 c10_cuda torch torch_cpu torch_cuda)
  string(TOUPPER "${_lib}" _upper)
  list(APPEND _ddp_locations ${_lib}_LIBRARY ${_upper}_LIBRARY)
endforeach()
if(DDP_WITH_NCCL)
  list(APPEND _ddp_locations NCCL_INCLUDE_DIR NCCL_LIBRARY)
endif()
set(DDP_PACKAGE_LOCATIONS "")
foreach(_var IN LISTS _ddp_locations)
  if(DEFINED CACHE{${_var}})
    get_property(_type CACHE ${_var} PROPERTY TYPE)
    string(APPEND DDP_PACKAGE_LOCATIONS "set(${_var} \"$CACHE{${_var}}\" CACHE ${_type} \"as libddp was built\")\n")
  endif()
endforeach()

configure_package_config_file(cmake/ddpConfig.cmake.in "${PROJECT_BINARY_DIR}/ddpConfig.cmake"
  INSTALL_DESTINATION "${DDP_INSTALL_CMAKEDIR}")
# 0.x: a new minor version may change the API.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
set(_ddp_package_files "${PROJECT_BINARY_DIR}/ddpConfig.cmake" "${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake")
if(DDP_WITH_NCCL)
  list(APPEND _ddp_package_files "${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake"
                                 "${PROJECT_SOURCE_DIR}/cmake/PythonPackagePrefix.cmake")
endif()
install(FILES ${_ddp_package_files} DESTINATION "${DDP_INSTALL_CMAKEDIR}")
