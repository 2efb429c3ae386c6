# CLI tests: run the real `lockstep` binary and check its exit code and messages.
# lockstep_cli_test(<name> EXIT <code> [OUTPUT <regex>] [REJECT <regex>] [TIMEOUT <s>] ARGS <arg>...)
# Each test runs in its own empty directory under the build tree. A test that needs files made first (a
# run, a damaged file) or more than one command is a scenario: tests/cli/scenarios.py.
function(lockstep_cli_test name)
  cmake_parse_arguments(T "" "EXIT;OUTPUT;REJECT;TIMEOUT" "ARGS" ${ARGN})
  if(NOT DEFINED T_TIMEOUT)
    set(T_TIMEOUT 60)
  endif()
  list(JOIN T_ARGS "|" joined)
  set(workdir ${CMAKE_CURRENT_BINARY_DIR}/cli/${name})
  add_test(NAME cli.${name}
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:lockstep_cli>|${joined}"
                   -DEXPECT_EXIT=${T_EXIT} "-DEXPECT_OUTPUT=${T_OUTPUT}" "-DREJECT_OUTPUT=${T_REJECT}"
                   -DWORKDIR=${workdir}
                   -P ${CMAKE_CURRENT_LIST_DIR}/run_cli.cmake)
  set_tests_properties(cli.${name} PROPERTIES TIMEOUT ${T_TIMEOUT})
endfunction()

file(GLOB LOCKSTEP_CLI_TEST_FILES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.tests.cmake)
foreach(f IN LISTS LOCKSTEP_CLI_TEST_FILES)
  include(${f})
endforeach()
