# Run by ctest when it starts (tests/CMakeLists.txt: TEST_INCLUDE_FILES), with LOCKSTEP (the CLI) set by the
# generated file that includes this one. A CLI whose OpenBLAS chose other kernels than this CPU should use
# re-executes itself with OPENBLAS_CORETYPE set (apps/lockstep/blas_env.cpp): a second start of every CLI
# process, hundreds in this suite. Asked once here, the recommended core goes into ctest's environment, as a
# user who exports it would have it, so every test's processes start once; the tests of that rule set or
# unset the variable themselves. A variable the caller set is left alone.
if(NOT EXISTS "${LOCKSTEP}" OR DEFINED ENV{OPENBLAS_CORETYPE} OR DEFINED ENV{LOCKSTEP_NO_REEXEC})
  return()
endif()
execute_process(COMMAND "${LOCKSTEP}" doctor --quick --threads 1 OUTPUT_VARIABLE doctor_out ERROR_QUIET
                RESULT_VARIABLE doctor_rc TIMEOUT 120)
if(doctor_rc EQUAL 0 AND doctor_out MATCHES "recommended for this CPU: ([A-Za-z0-9_]+)")
  set(ENV{OPENBLAS_CORETYPE} "${CMAKE_MATCH_1}")
endif()
