# CLI tests of lockstep bench: it runs what it is asked and refuses a filter that matches nothing.
lockstep_cli_test(bench_quantizers_one_case EXIT 0
                  OUTPUT "limits measured now: sgemm.*fsq fwd\\+bwd +16x1024 levels 8,5,5,5.*GB/s.*<= 0.3 ms"
                  REJECT "vq search" TIMEOUT 120
                  ARGS bench quantizers --filter "fsq fwd+bwd" --min-time 0.05)
lockstep_cli_test(bench_quantizers_no_match EXIT 2 OUTPUT "no benchmark case matches 'nothing'" TIMEOUT 120
                  ARGS bench quantizers --filter nothing --min-time 0.05)
lockstep_cli_test(bench_collectives_runs EXIT 0 OUTPUT "barrier +[0-9.]+ +[0-9.]+.*all_reduce 1M floats" TIMEOUT 120
                  ARGS bench collectives --iterations 20 --port 29781)
lockstep_cli_test(bench_quantizers_bad_device EXIT 2 OUTPUT "--device = 'gpu' is not a device: use cpu, cuda" TIMEOUT 60
                  ARGS bench quantizers --device gpu)
# bench/gpu_check.sh runs only where there are GPUs; here it must at least parse and explain itself.
add_test(NAME cli.gpu_check_parses_and_explains_itself
         COMMAND sh -c "bash -n '${PROJECT_SOURCE_DIR}/bench/gpu_check.sh' && bash '${PROJECT_SOURCE_DIR}/bench/gpu_check.sh' --help")
set_tests_properties(cli.gpu_check_parses_and_explains_itself PROPERTIES TIMEOUT 30
                     PASS_REGULAR_EXPRESSION "nccl-killed.*--deps: what scripts/gpu-deps prepared")
