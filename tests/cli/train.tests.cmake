# CLI tests of train, eval, encode and decode: exit codes and messages a user sees.
set(FMNIST /usr/share/datasets/fashion-mnist)
set(LS $<TARGET_FILE:lockstep_cli>)
set(MAKE_NPY ${CMAKE_CURRENT_LIST_DIR}/make_npy.py)
set(MAKE_LPIPS ${CMAKE_CURRENT_LIST_DIR}/make_lpips_weights.py)
# A few training steps on a slice of the data: the run directory the other tests use.
# (the shared small run, tests/cli/small_run.toml, on fewer images)
set(TINY_RUN "${LS} train --run-dir run --config ${CMAKE_CURRENT_LIST_DIR}/small_run.toml --steps 4 --batch-size 16 --set data.train_subset=64 > /dev/null")

lockstep_cli_test(no_subcommand EXIT 2 OUTPUT "Subcommands:.*train.*doctor.*a subcommand is required" ARGS)
lockstep_cli_test(unknown_subcommand EXIT 2 OUTPUT "unknown subcommand 'trian'; valid: train, eval, encode, decode, doctor" ARGS trian)
lockstep_cli_test(version EXIT 0 OUTPUT "lockstep [0-9]+\\.[0-9]+" ARGS --version)
lockstep_cli_test(train_help EXIT 0 OUTPUT "--set KEY=VALUE.*--resume.*--epochs INT.*Fashion-MNIST.*docs/configuration.md" ARGS train --help)
lockstep_cli_test(train_unknown_key EXIT 1 OUTPUT "unknown key 'train.batch'.*batch_size" ARGS train --set train.batch=3)
lockstep_cli_test(train_bad_value EXIT 1 OUTPUT "train.lr" ARGS train --set train.lr=fast)
lockstep_cli_test(train_out_of_range EXIT 1 OUTPUT "train.batch_size" ARGS train --batch-size 0)
lockstep_cli_test(train_unknown_quantizer EXIT 1 OUTPUT "fsq" ARGS train --quantizer nope)
# The bucket table is checked whatever the dataset: a Fashion-MNIST run refuses it too.
lockstep_cli_test(train_bad_buckets EXIT 1 OUTPUT "data.buckets = \"garbage\" is not valid: .*use WIDTHxHEIGHT"
                  ARGS train --buckets garbage --print-config)
# Every quantizer section is checked, also one the run does not use.
lockstep_cli_test(train_unused_quantizer_section_checked EXIT 1
                  OUTPUT "\\[quantizer.lfq\\] lfq: codebook_size = 1000 must be a power of two"
                  ARGS train --quantizer vq --set quantizer.lfq.codebook_size=1000 --print-config)
lockstep_cli_test(train_bad_device EXIT 1 OUTPUT "train.device = \"gpu\" is not valid.*use cpu, cuda or cuda:N" ARGS train --device gpu)
# An error quoting a 400,000-character value (here a path from a config file) is shown by its two
# ends: the message stays a few KB.
string(REPEAT "d" 4000 LOCKSTEP_MANY_D)
lockstep_cli_test(train_error_quoting_a_huge_value_is_shortened EXIT 1
                  OUTPUT "lockstep: error: Fashion-MNIST directory 'dddd.* \\.\\.\\. \\([0-9]+ characters left out\\) \\.\\.\\. dddd"
                  REJECT "${LOCKSTEP_MANY_D}"
                  SETUP "python3 -c \"print('[data]' + chr(10) + 'dir = ' + chr(34) + 'd' * 400000 + chr(34))\" > huge.toml"
                  ARGS train --config huge.toml --run-dir run)
lockstep_cli_test(train_print_config EXIT 0 OUTPUT "\\[quantizer.fsq\\].*levels = \\[8, 5, 5, 5\\]" ARGS train --print-config)
lockstep_cli_test(train_missing_dataset EXIT 1 OUTPUT "dataset-fashion-mnist" ARGS train --run-dir run --data nowhere)
lockstep_cli_test(train_unwritable_run_dir EXIT 1 OUTPUT "/proc/lockstep-run" ARGS train --run-dir /proc/lockstep-run)
lockstep_cli_test(train_impossible_model EXIT 1 OUTPUT "28x28.*model.channels"
                  ARGS train --run-dir run --set model.channels=[4,4,4,4])
lockstep_cli_test(train_missing_config_file EXIT 2 OUTPUT "nothere.toml" ARGS train --config nothere.toml)
lockstep_cli_test(train_bad_config_file EXIT 1 OUTPUT "bad.toml.*line 2"
                  SETUP "printf '[train]\\nepochz = 3\\n' > bad.toml" ARGS train --config bad.toml)

lockstep_cli_test(train_tiny_run EXIT 0 OUTPUT "step 4/4.*test: mse [0-9.]+  psnr [0-9.]+ dB  codes used"
                  TIMEOUT 120 ARGS train --run-dir run --steps 4 --batch-size 16 --threads 1
                  --set data.train_subset=64 --set data.test_subset=32 --set model.channels=[8,8])
# SimVQ from the CLI: trains (its map learns by gradient), saves, and the saved run evaluates.
lockstep_cli_test(train_simvq_then_eval EXIT 0 OUTPUT "mse [0-9.]+  psnr [0-9.]+ dB  codes used [0-9]+/64" TIMEOUT 120
                  SETUP "${LS} train --run-dir run --quantizer simvq --set quantizer.simvq.codebook_size=64 --steps 4 --batch-size 16 --threads 1 --set data.train_subset=64 --set data.test_subset=32 --set model.channels=[8,8] > train.log"
                  ARGS eval run --limit 32)
lockstep_cli_test(train_residual_simvq EXIT 0 OUTPUT "step 3/3.*codes used" TIMEOUT 120
                  ARGS train --run-dir run --quantizer residual-simvq --set quantizer.simvq.codebook_size=32
                  --set quantizer.residual.num_quantizers=2 --set quantizer.residual.quantize_dropout=true --steps 3
                  --batch-size 16 --threads 1 --set data.train_subset=64 --set data.test_subset=32
                  --set model.channels=[8,8])
lockstep_cli_test(train_latent_quantize EXIT 0 OUTPUT "step 3/3.*codes used [0-9]+/60" TIMEOUT 120
                  ARGS train --run-dir run --quantizer latent --set quantizer.latent.levels=[5,4,3] --steps 3
                  --batch-size 16 --threads 1 --set data.train_subset=64 --set data.test_subset=32
                  --set model.channels=[8,8])
lockstep_cli_test(train_grouped_residual_fsq EXIT 0 OUTPUT "step 3/3.*codes used" TIMEOUT 120
                  ARGS train --run-dir run --quantizer grouped-residual-fsq --set quantizer.fsq.levels=[5,5]
                  --set quantizer.grouped.groups=3 --set quantizer.residual.num_quantizers=2 --steps 3 --batch-size 16
                  --threads 1 --set data.train_subset=64 --set data.test_subset=32 --set model.channels=[8,8])
lockstep_cli_test(train_run_dir_taken EXIT 1 OUTPUT "already holds a run.*--resume" TIMEOUT 120
                  SETUP "${TINY_RUN}" ARGS train --run-dir run)
lockstep_cli_test(train_resume_extends EXIT 0 OUTPUT "resumed at step 4 of 6.*trained 6 steps" TIMEOUT 120
                  SETUP "${TINY_RUN}" ARGS train --resume run --steps 6)
lockstep_cli_test(train_resume_refuses_model_change EXIT 1 OUTPUT "cannot change 'model.channels'" TIMEOUT 120
                  SETUP "${TINY_RUN}" ARGS train --resume run --set model.channels=[4,4])
# config.toml cut before its [train] section: the run's steps and threads would fall back to defaults.
lockstep_cli_test(train_resume_refuses_a_truncated_config EXIT 1
                  OUTPUT "run/config.toml does not set [0-9]+ key\\(s\\) that the checkpoint's configuration sets \\(.*train.steps = 4.*cut short or edited"
                  TIMEOUT 120 SETUP "${TINY_RUN} && sed -i '/^\\[train\\]/,$d' run/config.toml" ARGS train --resume run)
# config.toml without train.batch_size, whose default (64) train.grad_accum = 3 does not divide: the
# lost key is named, before any check across keys would blame the default.
lockstep_cli_test(train_resume_names_a_lost_key_before_checking_across_keys EXIT 1
                  OUTPUT "run/config.toml does not set 1 key\\(s\\) that the checkpoint's configuration sets \\(train.batch_size = 24\\)"
                  TIMEOUT 120
                  SETUP "${LS} train --run-dir run --config ${CMAKE_CURRENT_LIST_DIR}/small_run.toml --steps 2 --set train.grad_accum=3 --set data.train_subset=64 > /dev/null && sed -i '0,/^batch_size = /{/^batch_size = /d}' run/config.toml"
                  ARGS train --resume run)
lockstep_cli_test(train_resume_nothing EXIT 1 OUTPUT "not a directory" ARGS train --resume nowhere)

lockstep_cli_test(eval_run EXIT 0 OUTPUT "step 4.*mse [0-9.]+  psnr" TIMEOUT 120
                  SETUP "${TINY_RUN}" ARGS eval run --limit 50 --grid grid.png)
lockstep_cli_test(eval_corrupt_checkpoint EXIT 1 OUTPUT "bad.safetensors"
                  SETUP "head -c 300 /dev/urandom > bad.safetensors" ARGS eval bad.safetensors)
lockstep_cli_test(eval_missing_checkpoint EXIT 1 OUTPUT "no checkpoint at nowhere" ARGS eval nowhere)
# A run keeping a moving average of its weights reports both; eval, encode and decode take it with --ema.
lockstep_cli_test(train_weight_average EXIT 0
                  OUTPUT "test: mse [0-9.]+ .*test, weight average: mse [0-9.]+  psnr" TIMEOUT 120
                  ARGS train --run-dir run --steps 4 --batch-size 16 --threads 1 --set data.train_subset=64
                  --set data.test_subset=32 --set model.channels=[8,8] --set train.ema_decay=0.9)
lockstep_cli_test(eval_weight_average EXIT 0 OUTPUT "step 4.*mse [0-9.]+  psnr" TIMEOUT 120
                  SETUP "${TINY_RUN} --set train.ema_decay=0.9" ARGS eval run --ema --limit 32)
lockstep_cli_test(eval_weight_average_of_a_run_without_one EXIT 1
                  OUTPUT "holds no moving average of the weights: its run had train.ema_decay = 0" TIMEOUT 120
                  SETUP "${TINY_RUN}" ARGS eval run --ema --limit 32)
# LPIPS from the user's weights: eval --lpips measures any run; a missing file or a perceptual loss
# without weights is named before anything runs.
lockstep_cli_test(eval_lpips EXIT 0 OUTPUT "step 4.*ssim [0-9.]+  lpips [0-9]+\\.[0-9]+" TIMEOUT 120
                  SETUP "${TINY_RUN} && python3 ${MAKE_LPIPS} w.safetensors" ARGS eval run --lpips w.safetensors --limit 32)
lockstep_cli_test(eval_lpips_missing_weights EXIT 1 OUTPUT "--lpips = nowhere.safetensors: no such file" TIMEOUT 120
                  SETUP "${TINY_RUN}" ARGS eval run --lpips nowhere.safetensors --limit 32)
lockstep_cli_test(train_perceptual_needs_weights EXIT 1 OUTPUT "loss.perceptual = 1.* needs loss.lpips_weights"
                  ARGS train --run-dir run --steps 1 --set loss.perceptual=1)
lockstep_cli_test(train_perceptual_with_weights EXIT 0 OUTPUT "test: mse [0-9.]+ .*lpips [0-9]+\\.[0-9]+" TIMEOUT 180
                  SETUP "python3 ${MAKE_LPIPS} w.safetensors"
                  ARGS train --run-dir run --steps 2 --batch-size 8 --threads 1 --set data.train_subset=16
                  --set data.test_subset=16 --set model.channels=[8,8] --set loss.perceptual=1
                  --set loss.lpips_weights=w.safetensors)
lockstep_cli_test(train_fid_weights_missing EXIT 1 OUTPUT "eval.fid_weights = nowhere.safetensors: no such file"
                  ARGS train --run-dir run --steps 1 --set eval.fid_weights=nowhere.safetensors)
lockstep_cli_test(eval_fid_missing_weights EXIT 1 OUTPUT "--fid = nowhere.safetensors: no such file" TIMEOUT 120
                  SETUP "${TINY_RUN}" ARGS eval run --fid nowhere.safetensors --limit 32)
lockstep_cli_test(encode_decode_round_trip EXIT 0 OUTPUT "wrote 10 PNG images to out \\([0-9]+ images/s\\)" TIMEOUT 120
                  SETUP "${TINY_RUN} && ${LS} encode run --limit 10 -o tokens.npy | grep -q 'tokens of shape \\[10, 14, 14\\]'"
                  ARGS decode run --tokens tokens.npy -o out --grid grid.png)
lockstep_cli_test(encode_png_inputs EXIT 0 OUTPUT "encoded 3 images of 28x28" TIMEOUT 120
                  SETUP "${TINY_RUN} && ${LS} encode run --limit 3 -o t.npy && ${LS} decode run --tokens t.npy -o imgs"
                  ARGS encode run --images imgs/000000.png imgs/000001.png imgs/000002.png -o again.npy)
lockstep_cli_test(decode_rejects_float_tokens EXIT 1 OUTPUT "must be integers" TIMEOUT 120
                  SETUP "${TINY_RUN} && python3 ${MAKE_NPY} f.npy '<f4' 1,14,14 0"
                  ARGS decode run --tokens f.npy -o out)
lockstep_cli_test(decode_rejects_out_of_range EXIT 1 OUTPUT "f.npy: token id 2139062143 at \\[0, 0, 0\\] is outside .0, 1000. \\(196 of the 196 ids are\\)" TIMEOUT 120
                  SETUP "${TINY_RUN} && python3 ${MAKE_NPY} f.npy '<i4' 1,14,14 127"
                  ARGS decode run --tokens f.npy -o out)
lockstep_cli_test(decode_rejects_an_empty_grid EXIT 1 OUTPUT "with no side of length 0, got \\[2, 0, 7\\]" TIMEOUT 120
                  REJECT "frame #" SETUP "${TINY_RUN} && python3 ${MAKE_NPY} e.npy '<i4' 2,0,7 0"
                  ARGS decode run --tokens e.npy -o out)
lockstep_cli_test(train_resume_print_config EXIT 2 OUTPUT "run being resumed keeps its own in nowhere/config.toml"
                  ARGS train --resume nowhere --print-config)
lockstep_cli_test(train_resume_with_run_dir EXIT 2 OUTPUT "do not combine it with --config or --run-dir"
                  ARGS train --resume nowhere --run-dir elsewhere)
lockstep_cli_test(decode_without_a_destination EXIT 2 OUTPUT "say where to write: --output DIR and/or --grid FILE.png"
                  SETUP "touch t.npy" ARGS decode nowhere --tokens t.npy)
# An empty argument does not survive ARGS (a CMake list): bash passes it.
lockstep_cli_test(decode_empty_output EXIT 2 OUTPUT "--output: must name a file or directory, not an empty string"
                  SETUP "touch t.npy" RUNNER bash -c [["$0" decode nowhere --tokens t.npy -o '']])
lockstep_cli_test(encode_empty_output EXIT 2 OUTPUT "--output: must name a file or directory, not an empty string"
                  REJECT "write_file_atomic" RUNNER bash -c [["$0" encode nowhere -o '']])
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
# Ctrl-C twice: the second ends the process at once (exit 130), the first run's checkpoint untouched.
lockstep_cli_test(train_second_interrupt_stops_at_once EXIT 130
                  OUTPUT "stopping after the step under way.*stopped at once \\(a second interrupt\\)"
                  REJECT "interrupted at step" TIMEOUT 180 RUNNER bash ${CMAKE_CURRENT_LIST_DIR}/second_interrupt.sh
                  ARGS train --run-dir run --config ${CMAKE_CURRENT_LIST_DIR}/small_run.toml --steps 100000
                       --batch-size 480 --set train.grad_accum=480 --set model.channels=[32,32]
                       --set train.log_every=1)
lockstep_cli_test(train_one_interrupt_delivered_twice_stops_after_the_step EXIT 130
                  OUTPUT "interrupted at step [0-9]+; checkpoint saved" REJECT "stopped at once" TIMEOUT 180
                  RUNNER env SECOND_AFTER=0 bash ${CMAKE_CURRENT_LIST_DIR}/second_interrupt.sh
                  ARGS train --run-dir run --config ${CMAKE_CURRENT_LIST_DIR}/small_run.toml --steps 100000
                       --batch-size 480 --set train.grad_accum=480 --set model.channels=[32,32]
                       --set train.log_every=1)
