# CLI tests of train, eval, encode and decode: exit codes and messages a user sees. Those that need files
# made first (a small run, a config file) are scenarios: tests/cli/single_run_scenarios.py.
# The shared small run (small_run.toml) on 64 images (scenario_kit.py's TINY, there for 4 steps).
set(TINY --config ${CMAKE_CURRENT_LIST_DIR}/small_run.toml --batch-size 16 --set data.train_subset=64)

lockstep_cli_test(no_subcommand EXIT 2 OUTPUT "Subcommands:.*train.*doctor.*a subcommand is required" ARGS)
lockstep_cli_test(unknown_subcommand EXIT 2 OUTPUT "unknown subcommand 'trian' for lockstep; give one of: train, eval, encode, decode, doctor" ARGS trian)
lockstep_cli_test(unknown_option_before_subcommand EXIT 2 OUTPUT "unknown option '--bogus' for lockstep; give one of: train" ARGS --bogus)
lockstep_cli_test(unknown_bench_subcommand EXIT 2 OUTPUT "unknown subcommand 'nosuch' for lockstep bench; give one of: quantizers, collectives" ARGS bench nosuch)
lockstep_cli_test(version EXIT 0 OUTPUT "lockstep [0-9]+\\.[0-9]+" ARGS --version)
lockstep_cli_test(train_help EXIT 0 OUTPUT "--set KEY=VALUE.*--resume.*--epochs INT.*Fashion-MNIST.*docs/configuration.md" ARGS train --help)
# A value its key refuses, given on the command line, is a bad command line (2), named by its flag.
lockstep_cli_test(train_unknown_key EXIT 2 OUTPUT "--set train.batch=3: unknown key 'train.batch'.*batch_size" ARGS train --set train.batch=3)
lockstep_cli_test(train_bad_value EXIT 2 OUTPUT "--set train.lr=fast: train.lr" ARGS train --set train.lr=fast)
lockstep_cli_test(train_not_an_assignment EXIT 2 OUTPUT "--set train.lr: .*expected key=value" ARGS train --set train.lr)
lockstep_cli_test(train_out_of_range EXIT 2 OUTPUT "--batch-size 0: train.batch_size" ARGS train --batch-size 0)
lockstep_cli_test(train_not_a_number EXIT 2 OUTPUT "--steps abc: train.steps must be an integer" ARGS train --steps abc)
lockstep_cli_test(train_negative_threads EXIT 2 OUTPUT "--threads -1: train.threads" ARGS train --threads -1)
lockstep_cli_test(train_unknown_quantizer EXIT 2 OUTPUT "--quantizer nope: .*fsq" ARGS train --quantizer nope)
lockstep_cli_test(train_world_size_against_launcher EXIT 2 OUTPUT "--world-size 3 contradicts WORLD_SIZE=2"
                  ARGS launch -n 2 -- train --world-size 3)
# The bucket table is checked whatever the dataset: a Fashion-MNIST run refuses it too.
lockstep_cli_test(train_bad_buckets EXIT 2 OUTPUT "--buckets garbage: data.buckets = \"garbage\" is not valid: .*use WIDTHxHEIGHT"
                  ARGS train --buckets garbage --print-config)
# Every quantizer section is checked, also one the run does not use.
lockstep_cli_test(train_unused_quantizer_section_checked EXIT 1
                  OUTPUT "\\[quantizer.lfq\\] lfq: codebook_size = 1000 must be a power of two"
                  ARGS train --quantizer vq --set quantizer.lfq.codebook_size=1000 --print-config)
lockstep_cli_test(train_bad_device EXIT 2 OUTPUT "--device gpu: train.device = \"gpu\" is not valid.*use cpu, cuda or cuda:N" ARGS train --device gpu)
lockstep_cli_test(train_print_config EXIT 0 OUTPUT "\\[quantizer.fsq\\].*levels = \\[8, 5, 5, 5\\]" ARGS train --print-config)
lockstep_cli_test(train_missing_dataset EXIT 1 OUTPUT "dataset-fashion-mnist" ARGS train --run-dir run --data nowhere)
lockstep_cli_test(train_unwritable_run_dir EXIT 1 OUTPUT "/proc/lockstep-run" ARGS train --run-dir /proc/lockstep-run)
lockstep_cli_test(train_impossible_model EXIT 1 OUTPUT "28x28.*model.channels"
                  ARGS train --run-dir run --set model.channels=[4,4,4,4])
lockstep_cli_test(train_missing_config_file EXIT 2 OUTPUT "nothere.toml" ARGS train --config nothere.toml)

lockstep_cli_test(train_tiny_run EXIT 0 OUTPUT "step 4/4.*test: mse [0-9.]+  psnr [0-9.]+ dB  codes used"
                  TIMEOUT 120 ARGS train --run-dir run ${TINY} --steps 4)
lockstep_cli_test(train_residual_simvq EXIT 0 OUTPUT "step 3/3.*codes used" TIMEOUT 120
                  ARGS train --run-dir run --quantizer residual-simvq --set quantizer.simvq.codebook_size=32
                  --set quantizer.residual.num_quantizers=2 --set quantizer.residual.quantize_dropout=true ${TINY}
                  --steps 3)
lockstep_cli_test(train_latent_quantize EXIT 0 OUTPUT "step 3/3.*codes used [0-9]+/60" TIMEOUT 120
                  ARGS train --run-dir run --quantizer latent --set quantizer.latent.levels=[5,4,3] ${TINY} --steps 3)
lockstep_cli_test(train_grouped_residual_fsq EXIT 0 OUTPUT "step 3/3.*codes used" TIMEOUT 120
                  ARGS train --run-dir run --quantizer grouped-residual-fsq --set quantizer.fsq.levels=[5,5]
                  --set quantizer.grouped.groups=3 --set quantizer.residual.num_quantizers=2 ${TINY} --steps 3)
lockstep_cli_test(train_resume_nothing EXIT 1 OUTPUT "not a directory" ARGS train --resume nowhere)

lockstep_cli_test(eval_missing_checkpoint EXIT 1 OUTPUT "no checkpoint at nowhere" ARGS eval nowhere)
# A run keeping a moving average of its weights reports both; eval, encode and decode take it with --ema.
lockstep_cli_test(train_weight_average EXIT 0
                  OUTPUT "test: mse [0-9.]+ .*test, weight average: mse [0-9.]+  psnr" TIMEOUT 120
                  ARGS train --run-dir run ${TINY} --steps 4 --set train.ema_decay=0.9)
lockstep_cli_test(train_perceptual_needs_weights EXIT 1 OUTPUT "loss.perceptual = 1.* needs loss.lpips_weights"
                  ARGS train --run-dir run --steps 1 --set loss.perceptual=1)
lockstep_cli_test(train_fid_weights_missing EXIT 1 OUTPUT "eval.fid_weights = nowhere.safetensors: no such file"
                  ARGS train --run-dir run --steps 1 --set eval.fid_weights=nowhere.safetensors)
lockstep_cli_test(train_resume_print_config EXIT 2 OUTPUT "run being resumed keeps its own in nowhere/config.toml"
                  ARGS train --resume nowhere --print-config)
lockstep_cli_test(train_resume_with_run_dir EXIT 2 OUTPUT "do not combine it with --config or --run-dir"
                  ARGS train --resume nowhere --run-dir elsewhere)
# Numbers out of range are named in plain words: no 309-digit bound, no silent clamping.
lockstep_cli_test(train_world_size_zero EXIT 2 OUTPUT "--world-size: must be a whole number >= 1 .*not '0'"
                  REJECT "179769" ARGS train --world-size 0)
lockstep_cli_test(train_timeout_zero EXIT 2 OUTPUT "--collective-timeout: must be a finite number > 0, not '0'"
                  REJECT "179769" ARGS train --collective-timeout 0)
lockstep_cli_test(eval_limit_beyond_64_bits EXIT 2
                  OUTPUT "--limit: must be a whole number >= 0 \\(at most 9223372036854775807\\), not '99999999999999999999'"
                  ARGS eval run --limit 99999999999999999999)
# A training run whose loss becomes nan stops with an error naming the step, keeping its checkpoint
# (exit 5: diverged).
lockstep_cli_test(train_divergence_is_an_error EXIT 5
                  OUTPUT "step [0-9]+: the loss is (-?nan|-?inf): training diverged \\(train.lr is 10"
                  ARGS train --run-dir run --steps 20 --lr 10 --quantizer vq --threads 1 --batch-size 32
                  --set data.train_subset=640 --set data.test_subset=64 --set model.channels=[8,16])
lockstep_cli_test(help_lists_exit_statuses EXIT 0 OUTPUT "Exit status: 0 done.*3 a rank died or stalled.*4 ranks disagreed" ARGS --help)
# --images names encode's input: a data set given beside it would be ignored, so it is refused.
lockstep_cli_test(encode_images_with_data EXIT 2 OUTPUT "--images excludes --data"
                  ARGS encode nowhere -o out.npy --images ${CMAKE_CURRENT_LIST_DIR}/small_run.toml --data somewhere)
