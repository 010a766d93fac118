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

# The AVX-512 variants of the vector kernels are compiled on x86-64 with GCC or Clang
# (core/isa.cpp then lets best_isa() choose them at run time); elsewhere only AVX2 and scalar code.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(AKV_AVX512_KERNELS ON)
else()
  set(AKV_AVX512_KERNELS OFF)
endif()

# akv_avx512_source(TARGET SOURCE FEATURES f vl ... [OPTIONS opt ...]): adds SOURCE, an AVX-512
# variant of a kernel, to TARGET, compiled with -mavx512<feature> for each feature and OPTIONS.
# GCC 12 reports the undefined upper lanes of its AVX-512 casts and inserts (_mm512_undefined_* in
# its headers) as uninitialized, a false positive: those warnings are off for these files.
function(akv_avx512_source target source)
  cmake_parse_arguments(PARSE_ARGV 2 ARG "" "" "FEATURES;OPTIONS")
  set(flags ${ARG_OPTIONS})
  foreach(feature IN LISTS ARG_FEATURES)
    list(APPEND flags -mavx512${feature})
  endforeach()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(APPEND flags -Wno-uninitialized -Wno-maybe-uninitialized)
  endif()
  target_sources(${target} PRIVATE ${source})
  set_source_files_properties(${source} PROPERTIES COMPILE_OPTIONS "${flags}")
endfunction()
