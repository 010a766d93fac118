# Compiler flags shared by every akv target, through the akv_options interface target.
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()

add_library(akv_options INTERFACE)
target_compile_options(akv_options INTERFACE -Wall -Wextra -Wpedantic)
# GCC 12 reports false -Wrestrict positives inside libstdc++ string concatenation at -O3
# (GCC bug 105329).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(akv_options INTERFACE -Wno-restrict)
endif()
if(AKV_WERROR)
  target_compile_options(akv_options INTERFACE -Werror)
endif()

if(AKV_NATIVE)
  target_compile_options(akv_options INTERFACE -march=native)
else()
  # x86-64-v3: AVX2, FMA, F16C, BMI2 (Haswell and later, Zen and later).
  target_compile_options(akv_options INTERFACE -march=x86-64-v3)
endif()
target_compile_options(akv_options INTERFACE $<$<CONFIG:Release>:-O3>)

if(AKV_SANITIZE)
  string(REPLACE "," ";" _akv_san_list "${AKV_SANITIZE}")
  foreach(_san IN LISTS _akv_san_list)
    if(NOT _san MATCHES "^(address|undefined)$")
      message(FATAL_ERROR "AKV_SANITIZE: unsupported sanitizer '${_san}' (use address,undefined)")
    endif()
  endforeach()
  target_compile_options(akv_options INTERFACE -fsanitize=${AKV_SANITIZE} -fno-omit-frame-pointer
                                               -fno-sanitize-recover=all)
  target_link_options(akv_options INTERFACE -fsanitize=${AKV_SANITIZE})
  # GCC documents that sanitizers make -Wmaybe-uninitialized report false positives (seen in
  # libstdc++'s <regex> inside Catch2).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(akv_options INTERFACE -Wno-maybe-uninitialized)
  endif()
endif()

# libFuzzer harnesses (tests/fuzz, clang only): every akv target gets the fuzzer's coverage
# instrumentation; the harness executables link the fuzzer's main.
if(AKV_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "AKV_FUZZ needs clang++ (libFuzzer); configure with CMAKE_CXX_COMPILER=clang++")
  endif()
  target_compile_options(akv_options INTERFACE -fsanitize=fuzzer-no-link)
endif()
