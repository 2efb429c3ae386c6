# Runs one CLI test: cmake -DCOMMAND=a|b|c -DEXPECT_EXIT=n -DEXPECT_OUTPUT=regex [-DREJECT_OUTPUT=regex]
#   [-DWORKDIR=dir] -P run_cli.cmake
# Arguments in COMMAND are separated by '|'. The test fails when the exit code differs, when the
# combined output does not match EXPECT_OUTPUT, or when it matches REJECT_OUTPUT.
string(REPLACE "|" ";" command "${COMMAND}")
if(DEFINED WORKDIR)
  file(REMOVE_RECURSE "${WORKDIR}")
  file(MAKE_DIRECTORY "${WORKDIR}")
endif()
execute_process(COMMAND ${command} WORKING_DIRECTORY "${WORKDIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_EXIT}\n--- output ---\n${all}")
endif()
if(DEFINED EXPECT_OUTPUT AND NOT all MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "output does not match '${EXPECT_OUTPUT}'\n--- output ---\n${all}")
endif()
if(DEFINED REJECT_OUTPUT AND NOT REJECT_OUTPUT STREQUAL "" AND all MATCHES "${REJECT_OUTPUT}")
  message(FATAL_ERROR "output matches '${REJECT_OUTPUT}', which it must not\n--- output ---\n${all}")
endif()
message(STATUS "ok: exit ${rc}")
