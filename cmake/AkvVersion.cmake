# The git commit that --version and benchmark rows report is read at build time, not at
# configure time: akv_version re-runs AkvWriteVersion.cmake on every build (a build directory
# reused across commits would otherwise report the commit it was configured at).
set(AKV_VERSION_CPP ${PROJECT_BINARY_DIR}/generated/version.cpp)
set(_akv_version_args -DSRC=${PROJECT_SOURCE_DIR} -DIN=${PROJECT_SOURCE_DIR}/lib/akv/core/version.cpp.in
    -DOUT=${AKV_VERSION_CPP} -DPROJECT_VERSION=${PROJECT_VERSION})
execute_process(COMMAND ${CMAKE_COMMAND} ${_akv_version_args} -P ${PROJECT_SOURCE_DIR}/cmake/AkvWriteVersion.cmake)
add_custom_target(akv_version
  COMMAND ${CMAKE_COMMAND} ${_akv_version_args} -P ${PROJECT_SOURCE_DIR}/cmake/AkvWriteVersion.cmake
  BYPRODUCTS ${AKV_VERSION_CPP}
  VERBATIM)
