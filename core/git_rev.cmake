# tg_git_rev(SOURCE_DIR OUT): sets OUT to the short (12-digit) git revision of the checkout
# whose top is SOURCE_DIR, or to "unknown" without git, outside a git checkout (a source
# tarball, a copy without .git) or when SOURCE_DIR is only a folder inside another
# checkout. In a configure run it also makes a commit or checkout in that work tree
# (its HEAD and HEAD's reflog change) configure the build again, so the revision stays
# true. Script mode, for the test integration.newcomer_cli:
#   cmake -DSRC=DIR -P core/git_rev.cmake      prints the revision
function(tg_git_rev src out)
  set(rev unknown)
  find_package(Git QUIET)
  if(GIT_FOUND)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
      WORKING_DIRECTORY ${src} OUTPUT_VARIABLE head RESULT_VARIABLE rc
      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --show-toplevel
      WORKING_DIRECTORY ${src} OUTPUT_VARIABLE top
      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --absolute-git-dir
      WORKING_DIRECTORY ${src} OUTPUT_VARIABLE gitdir
      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    get_filename_component(src_real ${src} REALPATH)
    if(top)
      get_filename_component(top ${top} REALPATH)
    endif()
    if(rc EQUAL 0 AND head MATCHES "^[0-9a-f]+$" AND top STREQUAL src_real)
      set(rev ${head})
      if(NOT CMAKE_SCRIPT_MODE_FILE)
        foreach(f HEAD logs/HEAD)
          if(EXISTS ${gitdir}/${f})
            set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${gitdir}/${f})
          endif()
        endforeach()
      endif()
    endif()
  endif()
  set(${out} ${rev} PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND DEFINED SRC)
  tg_git_rev(${SRC} rev)
  message(${rev})
endif()
