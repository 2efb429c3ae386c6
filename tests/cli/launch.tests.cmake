# CLI tests of lockstep launch and data-parallel training on ranks that are real processes.
set(LS $<TARGET_FILE:lockstep_cli>)
set(COMPARE ${CMAKE_CURRENT_LIST_DIR}/compare_metrics.py)
set(COMMON "--batch-size 24 --threads 1 --set data.train_subset=480 --set data.test_subset=32 --set model.channels=[8,8] --set train.log_every=3")
set(SMALL "--steps 12 ${COMMON}")
separate_arguments(SMALL_ARGS UNIX_COMMAND "${SMALL}")  # the same flags as separate ARGS
separate_arguments(COMMON_ARGS UNIX_COMMAND "${COMMON}")

lockstep_cli_test(launch_help EXIT 0 OUTPUT "RANK, WORLD_SIZE.*\\[rank r/w\\]" ARGS launch --help)
lockstep_cli_test(launch_needs_a_command EXIT 2 OUTPUT "command is required" ARGS launch -n 2)
# Every rank fails the same way: launch reports the first and exits with its status.
lockstep_cli_test(launch_reports_a_failed_rank EXIT 1
                  OUTPUT "\\[rank [01]/2\\] lockstep: error: .*dataset-fashion-mnist.*rank [01] of 2 failed with exit status 1"
                  TIMEOUT 60 ARGS launch -n 2 -- train --run-dir run --data nowhere)
# G4 end to end: 3 ranks (24 images = 8 each) give the losses of one process on the whole batch,
# with gradients sent in several 8 KiB buckets during backward, a warm-up and cosine decay, and
# gradients clipped to a norm below theirs (every rank clips the mean identically); the run
# directory is written once, by rank 0.
set(SCHEDULED "--set train.warmup_steps=3 --set train.lr_decay=cosine --set train.grad_clip=0.02")
lockstep_cli_test(launch_three_ranks_match_one_process EXIT 0 OUTPUT "step 12.*mse [0-9.]+  psnr" TIMEOUT 240
                  SETUP "${LS} train --run-dir one ${SMALL} ${SCHEDULED} > one.log && ${LS} launch -n 3 -- train --run-dir three ${SMALL} ${SCHEDULED} --set train.grad_bucket_kb=8 > three.log && grep -q 'rank 2/3. trained 12 steps' three.log && python3 ${COMPARE} one/metrics.jsonl three/metrics.jsonl 1e-4"
                  ARGS eval three --limit 32)
# The adversarial side keeps G4: a discriminator (GroupNorm, so nothing per rank), VQGAN's adaptive
# weight from gradients summed over the ranks, and LeCam averages that follow global means give 2
# ranks the losses, discriminator losses included, of one process.
set(ADVERSARIAL "--set loss.l1=1 --set loss.adversarial=0.5 --set loss.gan_start_step=4 --set loss.lecam=0.1 --set loss.disc_channels=8 --set loss.disc_layers=2")
lockstep_cli_test(launch_two_ranks_adversarial_match_one_process EXIT 0 OUTPUT "step 12.*mse [0-9.]+  psnr" TIMEOUT 240
                  SETUP "${LS} train --run-dir one ${SMALL} ${ADVERSARIAL} > one.log && ${LS} launch -n 2 -- train --run-dir two ${SMALL} ${ADVERSARIAL} --set train.grad_bucket_kb=8 > two.log && python3 ${COMPARE} one/metrics.jsonl two/metrics.jsonl 1e-4 loss disc_loss adversarial_factor"
                  ARGS eval two --limit 32)
# And with 2 micro-batches: the adaptive weight per micro-batch, the discriminator accumulating too.
lockstep_cli_test(launch_two_ranks_adversarial_accumulating_match_one_process EXIT 0 OUTPUT "step 12" TIMEOUT 240
                  SETUP "${LS} train --run-dir one ${SMALL} ${ADVERSARIAL} --set train.grad_accum=2 > one.log && ${LS} launch -n 2 -- train --run-dir two ${SMALL} ${ADVERSARIAL} --set train.grad_accum=2 > two.log && python3 ${COMPARE} one/metrics.jsonl two/metrics.jsonl 1e-4 loss disc_loss adversarial_factor"
                  ARGS eval two --limit 32)
# Gradient accumulation keeps G4 for a quantizer whose statistics are the batch's (LFQ's entropy):
# each micro-batch is the same 8 images on 1 rank or 2 (4 each), so the losses match.
lockstep_cli_test(launch_two_ranks_accumulating_match_one_process EXIT 0 OUTPUT "step 12" TIMEOUT 240
                  SETUP "${LS} train --run-dir one ${SMALL} --quantizer lfq --set quantizer.lfq.codebook_size=64 --set train.grad_accum=3 > one.log && ${LS} launch -n 2 -- train --run-dir two ${SMALL} --quantizer lfq --set quantizer.lfq.codebook_size=64 --set train.grad_accum=3 > two.log && python3 ${COMPARE} one/metrics.jsonl two/metrics.jsonl 1e-4"
                  ARGS eval two --limit 32)
# G4 for the vqgan architecture (GroupNorm normalises each image alone; attention at 14x14 and in
# the middle): 2 ranks of 12 images give the losses of one process on 24 (measured: 2.5e-8 apart).
set(VQGAN "--set model.channels=[8,16] --set model.architecture=vqgan --set model.norm_groups=4 --set model.attention_levels=1")
lockstep_cli_test(launch_two_ranks_match_one_process_vqgan EXIT 0 OUTPUT "step 12.*mse [0-9.]+  psnr" TIMEOUT 240
                  SETUP "${LS} train --run-dir one ${SMALL} ${VQGAN} > one.log && ${LS} launch -n 2 -- train --run-dir two ${SMALL} ${VQGAN} > two.log && grep -q 'rank 1/2. trained 12 steps' two.log && python3 ${COMPARE} one/metrics.jsonl two/metrics.jsonl 1e-4"
                  ARGS eval two --limit 32)
# bfloat16 autocast keeps G4 within its documented tolerance, 1e-3 (measured 1.2e-5 here; float32
# and bfloat16 runs differ by 1.1e-4 over these steps).
lockstep_cli_test(launch_two_ranks_bfloat16_match_one_process EXIT 0 OUTPUT "step 12" TIMEOUT 240
                  SETUP "${LS} train --run-dir one ${SMALL} --set train.precision=bfloat16 > one.log && ${LS} launch -n 2 -- train --run-dir two ${SMALL} --set train.precision=bfloat16 > two.log && python3 ${COMPARE} one/metrics.jsonl two/metrics.jsonl 1e-3"
                  ARGS eval two --limit 32)
# The perceptual loss (LPIPS from weights a script writes) and the weight average keep G4, and rank 0
# evaluating both alone mid-training (steps 4 and 8) reports one process's figures, LPIPS included
# (random LPIPS weights magnify the runs' rounding differences: 3.7e-5 measured, tolerance 1e-3).
set(PERCEPTUAL_AVERAGE "--set loss.perceptual=1 --set loss.lpips_weights=w.safetensors --set train.ema_decay=0.9 --set train.eval_every=4")
lockstep_cli_test(launch_two_ranks_perceptual_and_weight_average_match_one_process EXIT 0 OUTPUT "step 12" TIMEOUT 300
                  SETUP "python3 ${CMAKE_CURRENT_LIST_DIR}/make_lpips_weights.py w.safetensors && ${LS} train --run-dir one ${SMALL} ${PERCEPTUAL_AVERAGE} > one.log && ${LS} launch -n 2 -- train --run-dir two ${SMALL} ${PERCEPTUAL_AVERAGE} > two.log && grep -q 'rank 0/2. eval at step 4' two.log && python3 ${COMPARE} one/metrics.jsonl two/metrics.jsonl 1e-4 && python3 ${COMPARE} one/metrics.jsonl two/metrics.jsonl 1e-3 eval:psnr_db eval:lpips eval_ema:psnr_db eval_ema:lpips eval_ema:perplexity"
                  ARGS eval two --ema --limit 32)
# Uneven parts (24 images on 5 ranks: 5, 5, 5, 5, 4) still mean the global batch. VQ's nearest-code
# choices turn float-rounding differences (sums in another order) into occasional code flips, so
# after 12 steps the losses agree to ~1e-6 most steps and 3e-4 at worst (measured): tolerance 1e-3.
# VQ with k-means and dead codes on 5 uneven ranks: the first step within float32 rounding (G4's
# promise, on any CPU); the whole run within 2e-2, since a near-tie nearest-code flip (its step
# depends on the CPU's kernels: 1.2e-3 by step 12 with oneDNN limited to SSE4.1, 3.3e-3 on an AMD
# EPYC) lets runs drift apart, while a wrong weighting or average moves the first steps by far more.
set(VQ_DEAD "--quantizer vq --set quantizer.vq.kmeans_init=true --set quantizer.vq.threshold_ema_dead_code=1 --set train.log_every=1")
lockstep_cli_test(launch_uneven_ranks_match_one_process EXIT 0 OUTPUT "step 12" TIMEOUT 240
                  SETUP "${LS} train --run-dir one ${SMALL} ${VQ_DEAD} > one.log && ${LS} launch -n 5 -- train --run-dir five ${SMALL} ${VQ_DEAD} > five.log && python3 ${COMPARE} --first 1 one/metrics.jsonl five/metrics.jsonl 1e-5 && python3 ${COMPARE} one/metrics.jsonl five/metrics.jsonl 2e-2"
                  ARGS eval five --limit 32)
# Residual SimVQ with quantize dropout: the dropped layers' maps get zero gradients on every rank alike.
set(RSIMVQ "--quantizer residual-simvq --set quantizer.simvq.codebook_size=64 --set quantizer.residual.num_quantizers=3 --set quantizer.residual.quantize_dropout=true")
lockstep_cli_test(launch_two_ranks_residual_simvq_match_one_process EXIT 0 OUTPUT "step 12" TIMEOUT 240
                  SETUP "${LS} train --run-dir one ${SMALL} ${RSIMVQ} > one.log && ${LS} launch -n 2 -- train --run-dir two ${SMALL} ${RSIMVQ} > two.log && python3 ${COMPARE} one/metrics.jsonl two/metrics.jsonl 1e-4"
                  ARGS eval two --limit 32)
# Grouped residual VQ with quantize dropout: every group keeps the same layers, on every rank alike.
set(GRVQ "--quantizer grouped-residual-vq --set quantizer.vq.dim=4 --set quantizer.vq.codebook_size=32 --set quantizer.residual.num_quantizers=2 --set quantizer.residual.quantize_dropout=true")
lockstep_cli_test(launch_two_ranks_grouped_residual_vq_match_one_process EXIT 0 OUTPUT "step 12" TIMEOUT 240
                  SETUP "${LS} train --run-dir one ${SMALL} ${GRVQ} > one.log && ${LS} launch -n 2 -- train --run-dir two ${SMALL} ${GRVQ} > two.log && python3 ${COMPARE} one/metrics.jsonl two/metrics.jsonl 1e-4"
                  ARGS eval two --limit 32)
# Failure mode a: rank 0 alone evaluates mid-training (its forwards issue no collective); training
# completes and the replica check at every checkpoint finds all ranks' parameters and codebooks equal.
lockstep_cli_test(launch_rank0_evaluates_midway_vq EXIT 0
                  OUTPUT "\\[rank 0/2\\] eval at step 3:.*\\[rank 0/2\\] test: mse"
                  TIMEOUT 240 ARGS launch -n 2 -- train --run-dir run ${SMALL_ARGS} --quantizer vq
                  --set quantizer.vq.kmeans_init=true --set quantizer.vq.threshold_ema_dead_code=1
                  --set train.eval_every=3 --set train.checkpoint_every=4)
lockstep_cli_test(launch_rank0_evaluates_midway_residual_lfq EXIT 0
                  OUTPUT "\\[rank 0/2\\] eval at step 6:.*\\[rank 0/2\\] test: mse"
                  TIMEOUT 240 ARGS launch -n 2 -- train --run-dir run ${SMALL_ARGS}
                  --quantizer residual-lfq --set quantizer.lfq.codebook_size=64 --set train.eval_every=6)
# A 2-rank run resumed on 3 ranks (the same global batch) continues the single-process sequence.
lockstep_cli_test(launch_resume_onto_more_ranks_matches_one_process EXIT 0 OUTPUT "step 12" TIMEOUT 300
                  SETUP "${LS} train --run-dir one ${SMALL} > one.log && ${LS} launch -n 2 -- train --run-dir run --steps 6 ${COMMON} > part1.log && ${LS} launch -n 3 -- train --resume run --steps 12 > part2.log && grep -q 'resumed at step 6 of 12' part2.log && python3 ${COMPARE} one/metrics.jsonl run/metrics.jsonl 1e-4"
                  ARGS eval run --limit 16)
# Failure mode c: codebook sync (VQ's EMA, k-means, dead codes) and gradient sync together for
# hundreds of steps: no hang, and the replicas stay identical (checked at every checkpoint).
lockstep_cli_test(launch_hundreds_of_steps_vq EXIT 0 OUTPUT "\\[rank 0/2\\] trained 300 steps" TIMEOUT 300
                  ARGS launch -n 2 -- train --run-dir run --steps 300 --batch-size 16
                  --threads 1 --set data.train_subset=1600 --set data.test_subset=16 --set model.channels=[4,4]
                  --set train.log_every=100 --set train.checkpoint_every=50 --quantizer vq
                  --set quantizer.vq.kmeans_init=true --set quantizer.vq.threshold_ema_dead_code=0.5)
# Failure mode d: a model with buffers (BatchNorm), evaluated by rank 0 alone between steps;
# training goes on, and the replica check at every checkpoint finds the buffers in sync.
lockstep_cli_test(launch_batch_norm_buffers_stay_in_sync EXIT 0
                  OUTPUT "\\[rank 0/2\\] eval at step 4:.*\\[rank 0/2\\] test: mse"
                  TIMEOUT 240 ARGS launch -n 2 -- train --run-dir run ${SMALL_ARGS}
                  --set model.batch_norm=true --set train.eval_every=4 --set train.checkpoint_every=2)
# Ranks from flags instead of the environment: rank 0 takes any free port (--master-port 0) and
# says which; rank 1 is started with it (tests/cli/two_ranks.sh).
lockstep_cli_test(train_ranks_from_flags EXIT 0 OUTPUT "store listens on 127.0.0.1:[0-9]+.*trained 6 steps.*test: mse"
                  TIMEOUT 120 RUNNER bash ${CMAKE_CURRENT_LIST_DIR}/two_ranks.sh -
                  ARGS train --run-dir run --steps 6 ${COMMON_ARGS})
lockstep_cli_test(train_rank_beyond_world_size EXIT 1 OUTPUT "--rank 5 must be below --world-size 2"
                  ARGS train --rank 5 --world-size 2)
# Failure mode f end to end (tests/cli/kill_a_rank.sh): a SIGKILLed rank is named within 2 s, and
# the run resumes exactly; `eval` then reads the resumed run.
lockstep_cli_test(kill_a_rank_then_resume EXIT 0 OUTPUT "step 100" TIMEOUT 300
                  SETUP "bash ${CMAKE_CURRENT_LIST_DIR}/kill_a_rank.sh ${LS} ${COMPARE} > kill.log 2>&1 || (cat kill.log && false)"
                  ARGS eval run --limit 16)
# launch when a rank misbehaves or launch is told to stop (tests/cli/launch_faults.sh): a rank
# stopped with SIGSTOP is reported by the others and launch exits non-zero; a rank that prints
# nothing never blocks the output of one that logs every step; SIGTERM reaches every rank. No
# process is left behind in any case.
lockstep_cli_test(launch_reports_a_stalled_rank EXIT 0 OUTPUT "ok: stalled rank 1 reported" TIMEOUT 240
                  RUNNER bash ${CMAKE_CURRENT_LIST_DIR}/launch_faults.sh ARGS stall)
lockstep_cli_test(launch_never_blocks_on_a_silent_rank EXIT 0 OUTPUT "ok: [0-9]+ step lines" TIMEOUT 300
                  RUNNER bash ${CMAKE_CURRENT_LIST_DIR}/launch_faults.sh ARGS chatty)
lockstep_cli_test(launch_passes_sigterm_to_its_ranks EXIT 0 OUTPUT "ok: SIGTERM passed" TIMEOUT 240
                  RUNNER bash ${CMAKE_CURRENT_LIST_DIR}/launch_faults.sh ARGS sigterm)
# A rank killed or crashed (a signal, not an exit status) is a lost rank: launch exits 3, as the
# README's table says, not 1 (bad input).
lockstep_cli_test(launch_exits_3_when_a_rank_is_killed EXIT 0 OUTPUT "ok: rank 1 ended by SIGKILL" TIMEOUT 240
                  RUNNER bash ${CMAKE_CURRENT_LIST_DIR}/launch_faults.sh ARGS killed KILL)
lockstep_cli_test(launch_exits_3_when_a_rank_crashes EXIT 0 OUTPUT "ok: rank 1 ended by SIGSEGV" TIMEOUT 240
                  RUNNER bash ${CMAKE_CURRENT_LIST_DIR}/launch_faults.sh ARGS killed SEGV)
# torchrun (PyPI's torch brings one): its agent hosts the store (TORCHELASTIC_USE_AGENT_STORE), so
# rank 0 connects as a client. 2 ranks under torchrun give exactly what `lockstep launch -n 2` gives,
# and one process's losses. Builds without torchrun beside LibTorch (Debian's 1.13 has a broken
# one) show the test as skipped.
find_program(LOCKSTEP_TORCHRUN torchrun HINTS "${LOCKSTEP_TORCH_ROOT}/../../../../bin" NO_DEFAULT_PATH)
if(LOCKSTEP_TORCHRUN)
  lockstep_cli_test(torchrun_two_ranks_match_launch_and_one_process EXIT 0 OUTPUT "step 12" TIMEOUT 300
                    SETUP "${LS} train --run-dir one ${SMALL} > one.log && ${LS} launch -n 2 -- train --run-dir launched ${SMALL} > launched.log && (${LOCKSTEP_TORCHRUN} --standalone --nproc-per-node 2 --no-python ${LS} train --run-dir torchrun ${SMALL} > torchrun.log 2>&1 || (cat torchrun.log && false)) && [ $(grep -c 'trained 12 steps' torchrun.log) = 2 ] && python3 ${COMPARE} one/metrics.jsonl torchrun/metrics.jsonl 1e-4 && python3 ${COMPARE} launched/metrics.jsonl torchrun/metrics.jsonl 0"
                    ARGS eval torchrun --limit 32)
else()
  add_test(NAME cli.torchrun_two_ranks_match_launch_and_one_process
           COMMAND sh -c "echo 'skipped: no torchrun beside this LibTorch (${LOCKSTEP_TORCH_ROOT})'; exit 77")
  set_tests_properties(cli.torchrun_two_ranks_match_launch_and_one_process PROPERTIES SKIP_RETURN_CODE 77)
endif()
