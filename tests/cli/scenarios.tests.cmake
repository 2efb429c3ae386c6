# The multi-process scenarios of tests/cli/scenarios.py, one ctest entry each (cli.<name>), with the
# time limit each declares. torchrun (PyPI's torch brings one; Debian's 1.13 has a broken one) and
# OpenCV's example images are given when this build has them; a scenario that needs what is missing
# reports itself skipped.
find_program(LOCKSTEP_PYTHON3 python3 REQUIRED)
find_program(LOCKSTEP_TORCHRUN torchrun HINTS "${LOCKSTEP_TORCH_ROOT}/../../../../bin" NO_DEFAULT_PATH)
set(scenarios ${CMAKE_CURRENT_LIST_DIR}/scenarios.py)
execute_process(COMMAND ${LOCKSTEP_PYTHON3} ${scenarios} --list OUTPUT_VARIABLE listed RESULT_VARIABLE listed_rc)
if(NOT listed_rc EQUAL 0)
  message(FATAL_ERROR "${scenarios} --list failed (${listed_rc})")
endif()
# The list changes with any file that registers scenarios (scenarios.py imports them).
file(GLOB scenario_files ${CMAKE_CURRENT_LIST_DIR}/*scenario*.py)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${scenario_files})
string(REPLACE "\n" ";" listed "${listed}")
foreach(line IN LISTS listed)
  if(line STREQUAL "")
    continue()
  endif()
  separate_arguments(fields UNIX_COMMAND "${line}")
  list(GET fields 0 name)
  list(GET fields 1 limit)
  list(GET fields 3 labels)
  set(given "")
  if(LOCKSTEP_TORCHRUN)
    list(APPEND given --torchrun ${LOCKSTEP_TORCHRUN})
  endif()
  if(LOCKSTEP_HAVE_OPENCV)
    list(APPEND given --opencv-images ${CMAKE_BINARY_DIR}/test-data/opencv-images)
  endif()
  add_test(NAME cli.${name}
           COMMAND ${LOCKSTEP_PYTHON3} ${scenarios} ${name} --lockstep $<TARGET_FILE:lockstep_cli>
                   --workdir ${CMAKE_CURRENT_BINARY_DIR}/cli/${name} ${given})
  set_tests_properties(cli.${name} PROPERTIES TIMEOUT ${limit} SKIP_RETURN_CODE 77)
  if(NOT labels STREQUAL "-")
    string(REPLACE "," ";" labels "${labels}")
    set_tests_properties(cli.${name} PROPERTIES LABELS "${labels}")
  endif()
endforeach()
