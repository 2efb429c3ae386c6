# `lockstep doctor`: it runs, says what it prints, picks OpenBLAS's kernels and never fails on warnings.
lockstep_cli_test(doctor_runs EXIT 0 OUTPUT "LibTorch +[12]\\.[0-9]+\\.[0-9]+ .*CUDA +(built with CUDA [0-9.]+|not built).*BLAS.*sgemm n=1024 +[0-9.]+ GFLOP/s.*triad bandwidth +[0-9.]+ GB/s.*Gloo transport +built.*NCCL transport +(built \\(NCCL [0-9.]+\\)|not built).*Fashion-MNIST +read from .* \\(60000 training and 10000 test images\\)"
                  ARGS doctor --quick)
lockstep_cli_test(doctor_help EXIT 0 OUTPUT "sgemm GFLOP/s.*--threads.*--data.*--quick" ARGS doctor --help)
lockstep_cli_test(doctor_threads_flag EXIT 0 OUTPUT "intra-op threads +1 \\(--threads\\).*GFLOP/s with 1 thread \\(.*GB/s with 1 thread"
                  ARGS doctor --quick --threads 1)
lockstep_cli_test(doctor_rejects_zero_threads EXIT 2 ARGS doctor --quick --threads 0)
# A missing data directory is a warning, not a failure.
lockstep_cli_test(doctor_missing_data EXIT 0
                  OUTPUT "Fashion-MNIST +missing.*WARNING: Fashion-MNIST is missing.*apt-get install dataset-fashion-mnist"
                  ARGS doctor --quick --data ${CMAKE_CURRENT_BINARY_DIR}/no-such-dir)

# A user's own choice is respected, never overridden.
lockstep_cli_test(doctor_respects_user_coretype EXIT 0
                  OUTPUT "BLAS core +Haswell.*OPENBLAS_CORETYPE +Haswell \\(from the environment\\)"
                  REJECT "set by lockstep" ARGS doctor --quick --threads 1)
set_tests_properties(cli.doctor_respects_user_coretype PROPERTIES ENVIRONMENT_MODIFICATION
                     "OPENBLAS_CORETYPE=set:Haswell;LOCKSTEP_NO_REEXEC=unset:;LOCKSTEP_BLAS_REEXEC=unset:")
# LOCKSTEP_NO_REEXEC opts out: no re-exec, and the variable stays unset.
lockstep_cli_test(doctor_no_reexec EXIT 0 OUTPUT "OPENBLAS_CORETYPE +unset" REJECT "set by lockstep"
                  ARGS doctor --quick --threads 1)
set_tests_properties(cli.doctor_no_reexec PROPERTIES ENVIRONMENT_MODIFICATION
                     "OPENBLAS_CORETYPE=unset:;LOCKSTEP_NO_REEXEC=set:1;LOCKSTEP_BLAS_REEXEC=unset:")

# The reference BLAS (Debian's libblas3, which libtorch's packages pull in) is named as the problem.
set(LOCKSTEP_REFERENCE_BLAS_DIR /usr/lib/x86_64-linux-gnu/blas)
if(EXISTS ${LOCKSTEP_REFERENCE_BLAS_DIR}/libblas.so.3)
  lockstep_cli_test(doctor_warns_about_reference_blas EXIT 0
                    OUTPUT "BLAS vendor +reference.*WARNING: BLAS is the reference implementation.*libopenblas0-openmp"
                    REJECT "OPENBLAS_CORETYPE" ARGS doctor --quick --threads 1)
  set_tests_properties(cli.doctor_warns_about_reference_blas PROPERTIES ENVIRONMENT_MODIFICATION
                       "LD_LIBRARY_PATH=set:${LOCKSTEP_REFERENCE_BLAS_DIR};OPENBLAS_CORETYPE=unset:")
else()
  message(STATUS "cli.doctor_warns_about_reference_blas not defined: no ${LOCKSTEP_REFERENCE_BLAS_DIR}/libblas.so.3")
endif()
# These run against Debian's LibTorch 1.13 too (.ci/run: ctest -L channel), as do the doctor scenarios
# of single_run_scenarios.py (the core-type rule, a damaged data set), labelled so there.
get_property(doctor_tests DIRECTORY PROPERTY TESTS)
list(FILTER doctor_tests INCLUDE REGEX "^cli\\.doctor_")
set_property(TEST ${doctor_tests} APPEND PROPERTY LABELS channel)
