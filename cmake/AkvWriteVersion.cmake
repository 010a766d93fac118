# Writes OUT from IN with the current git commit (AKV_GIT_COMMIT: 12 hex digits, "-dirty" when
# tracked files differ from it, "unknown" outside a git checkout). Run on every build by the
# akv_version target; configure_file rewrites OUT only when its text changes, so an unchanged
# commit recompiles nothing.
set(AKV_GIT_COMMIT "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
                  WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE _commit OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0 AND _commit)
    set(AKV_GIT_COMMIT "${_commit}")
    execute_process(COMMAND ${GIT_EXECUTABLE} status --porcelain --untracked-files=no
                    WORKING_DIRECTORY ${SRC}
                    OUTPUT_VARIABLE _status OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_status)
      string(APPEND AKV_GIT_COMMIT "-dirty")
    endif()
  endif()
endif()
configure_file(${IN} ${OUT} @ONLY)
