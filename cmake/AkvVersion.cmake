# Records the git commit at configure time (re-run cmake to refresh it).
set(AKV_GIT_COMMIT "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
                  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                  OUTPUT_VARIABLE _akv_commit OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET RESULT_VARIABLE _akv_git_rc)
  if(_akv_git_rc EQUAL 0 AND _akv_commit)
    set(AKV_GIT_COMMIT "${_akv_commit}")
  endif()
endif()
