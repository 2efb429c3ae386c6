# CLI tests of lockstep launch and data-parallel training on ranks that are real processes.
set(LS $<TARGET_FILE:lockstep_cli>)
set(SMALL_ARGS --config ${CMAKE_CURRENT_LIST_DIR}/small_run.toml --steps 12)  # the shared small run
set(COMMON_ARGS --config ${CMAKE_CURRENT_LIST_DIR}/small_run.toml)

lockstep_cli_test(launch_help EXIT 0 OUTPUT "RANK, WORLD_SIZE.*\\[rank r/w\\]" ARGS launch --help)
lockstep_cli_test(launch_needs_a_command EXIT 2 OUTPUT "command is required" ARGS launch -n 2)
# Every rank fails the same way: launch reports the first and exits with its status.
lockstep_cli_test(launch_reports_a_failed_rank EXIT 1
                  OUTPUT "\\[rank [01]/2\\] lockstep: error: .*dataset-fashion-mnist.*rank [01] of 2 failed with exit status 1"
                  TIMEOUT 60 ARGS launch -n 2 -- train --run-dir run --data nowhere)
# The multi-process runs compared with one process (G4) are scenarios in tests/cli/scenarios.py.
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
lockstep_cli_test(train_rank_beyond_world_size EXIT 2 OUTPUT "--rank 5 must be below --world-size 2"
                  ARGS train --rank 5 --world-size 2)
# Flags that contradict each other are command-line mistakes: exit status 2, the flags named.
lockstep_cli_test(launch_node_rank_beyond_nnodes EXIT 2 OUTPUT "--node-rank 5 must lie in .0, --nnodes 2."
                  ARGS launch -n 2 --node-rank 5 --nnodes 2 -- train)
lockstep_cli_test(launch_any_port_on_several_nodes EXIT 2 OUTPUT "--master-port 0 \\(any free port\\) works on one node"
                  ARGS launch -n 2 --nnodes 2 --node-rank 0 --master-port 0 -- train)
# launch when a rank misbehaves or launch is told to stop (a stalled, silent, killed or crashed rank;
# SIGTERM to launch) is tested by the scenarios of tests/cli/fault_scenarios.py.
