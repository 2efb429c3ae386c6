#!/usr/bin/env python3
"""The CLI scenarios, as code: each runs the real `lockstep` binary (one process,
`lockstep launch -n W`, torchrun) in its own directory and checks what the runs printed and wrote,
most often that W ranks log the losses of one process (G4); single_run_scenarios.py holds those of one
small run (train, resume, eval, encode, decode), folder_scenarios.py those of an image folder,
fault_scenarios.py a rank killed, stalled or crashed and launch told to stop, signal_scenarios.py every signal
that stops a run (each saving its checkpoint) and launch restarting a lost rank. ctest runs each as
`cli.<name>` (tests/cli/scenarios.tests.cmake); a scenario never outlives its time limit: every process it starts
is killed at the deadline and the scenario fails naming the command.

    scenarios.py --list                    one line per scenario: name, time limit (s), needs, ctest labels
    scenarios.py NAME --lockstep PATH --workdir DIR [--torchrun PATH] [--opencv-images DIR]

Exit status 0: passed; 1: failed (the reason on stderr); 77: skipped (a tool it needs is missing, or this
machine cannot run it: two_hosts_link_cut_is_reported_and_resumes needs root and network namespaces)."""
import argparse
import re
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fault_scenarios  # noqa: E402,F401  (registers its scenarios)
import folder_scenarios  # noqa: E402,F401  (registers its scenarios)
import signal_scenarios  # noqa: E402,F401  (registers its scenarios)
import single_run_scenarios  # noqa: E402,F401  (registers its scenarios)
from scenario_kit import (HERE, SCENARIOS, SKIPPED, SMALL, Failure, Run, Skipped, evaluate,  # noqa: E402
                          one_and_ranks, scenario)


# The scenarios that compare whole runs' numbers (W ranks against one process, resumed against uninterrupted)
# carry the ctest label `parity`: CI's AddressSanitizer run leaves them out (-LE parity), as they take minutes
# there and run no code the others do not; launch_three_ranks_match_one_process stays as their sample.
PARITY = ("parity",)


@scenario(240)
def launch_three_ranks_match_one_process(run):
    # 3 ranks (24 images = 8 each) give the losses of one process on the whole batch, with gradients
    # sent in several 8 KiB buckets during backward, a warm-up and cosine decay, and gradients clipped
    # to a norm below theirs (every rank clips the mean identically); rank 0 alone writes the run.
    scheduled = ("--set", "train.warmup_steps=3", "--set", "train.lr_decay=cosine", "--set", "train.grad_clip=0.02")
    run.train("one", *SMALL, *scheduled)
    log = run.launch(3, "three", *SMALL, *scheduled, "--set", "train.grad_bucket_kb=8")
    run.expect(log, r"rank 2/3\] trained 12 steps", "rank 2 finished")
    run.compare("one", "three", 1e-4)
    evaluate(run, "three", "step 12", "--limit", "32")


ADVERSARIAL = ("--set", "loss.l1=1", "--set", "loss.adversarial=0.5", "--set", "loss.gan_start_step=4",
               "--set", "loss.lecam=0.1", "--set", "loss.disc_channels=8", "--set", "loss.disc_layers=2")


@scenario(240, labels=PARITY)
def launch_two_ranks_adversarial_match_one_process(run):
    # A discriminator with GroupNorm (nothing per rank), VQGAN's adaptive weight from gradients summed
    # over the ranks, and LeCam averages that follow global means: one process's losses.
    one_and_ranks(run, 2, *ADVERSARIAL, "--set", "train.grad_bucket_kb=8",
                  names=("loss", "disc_loss", "adversarial_factor"))


@scenario(240, labels=PARITY)
def launch_two_ranks_adversarial_accumulating_match_one_process(run):
    # The same over 2 micro-batches: the adaptive weight per micro-batch, the discriminator accumulating too.
    one_and_ranks(run, 2, *ADVERSARIAL, "--set", "train.grad_accum=2", names=("loss", "disc_loss", "adversarial_factor"))


@scenario(240, labels=PARITY)
def launch_two_ranks_accumulating_match_one_process(run):
    # LFQ's entropy is the batch's: each micro-batch is the same 8 images on 1 rank or 2 (4 each).
    one_and_ranks(run, 2, "--quantizer", "lfq", "--set", "quantizer.lfq.codebook_size=64", "--set",
                  "train.grad_accum=3")


@scenario(240, labels=PARITY)
def launch_two_ranks_match_one_process_vqgan(run):
    # GroupNorm normalises each image alone; attention at 14x14 and in the middle (measured 2.5e-8 apart).
    one_and_ranks(run, 2, "--set", "model.channels=[8,16]", "--set", "model.architecture=vqgan", "--set",
                  "model.norm_groups=4", "--set", "model.attention_levels=1")


@scenario(240, labels=PARITY)
def launch_two_ranks_bfloat16_match_one_process(run):
    # bfloat16 autocast keeps G4 within its documented 1e-3 (measured 1.2e-5; float32 and bfloat16
    # runs differ by 1.1e-4 over these steps).
    one_and_ranks(run, 2, "--set", "train.precision=bfloat16", tolerance=1e-3)


@scenario(300, labels=PARITY)
def launch_two_ranks_perceptual_and_weight_average_match_one_process(run):
    # LPIPS (random weights a script writes) and the weight average keep G4, and rank 0 evaluating
    # alone at steps 4 and 8 reports one process's figures (random LPIPS weights magnify rounding:
    # 3.7e-5 measured, tolerance 1e-3).
    run.python("make_lpips_weights.py", "w.safetensors", log="weights.log")
    args = ("--set", "loss.perceptual=1", "--set", "loss.lpips_weights=w.safetensors", "--set",
            "train.ema_decay=0.9", "--set", "train.eval_every=4")
    log = one_and_ranks(run, 2, *args, eval_args=("--ema",))
    run.expect(log, r"rank 0/2\] eval at step 4", "rank 0's evaluation mid-training")
    run.compare("one", "two", 1e-3, "eval:psnr_db", "eval:lpips", "eval_ema:psnr_db", "eval_ema:lpips",
                "eval_ema:perplexity")


# What other x86 CPUs of this kind run, forced on this one: ATen's kernels and oneDNN's instruction
# set for AVX2 without AVX-512 (an AMD EPYC of family 25), and for SSE4.1 at most.
KERNEL_PATHS = ({}, {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
                {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"})
UNEVEN_VQ = ("--quantizer", "vq", "--set", "quantizer.vq.kmeans_init=true", "--set",
             "quantizer.vq.threshold_ema_dead_code=1", "--set", "train.log_every=1")


@scenario(300, labels=PARITY)
def launch_uneven_ranks_in_shards_are_one_process_bitwise(run):
    # G4 over whole runs: with train.shard_size = 1, 24 images on 5 ranks (5, 5, 5, 5, 4), VQ with
    # k-means and dead codes, give one process's run bit for bit (every logged loss, and every
    # tensor of the checkpoint), under each kernel path. Without shards the runs differ by 1.6e-3 by
    # step 12 here (a near-tie nearest-code flip after float32 sums over ranks).
    for i, env in enumerate(KERNEL_PATHS):
        args = (*SMALL, *UNEVEN_VQ, "--set", "train.shard_size=1")
        run.train(f"one{i}", *args, env=env)
        run.launch(5, f"five{i}", *args, env=env)
        run.compare(f"one{i}", f"five{i}", 0)
        run.same_checkpoint(f"one{i}", f"five{i}")
    # VQ's affine_param: the statistics it moves the codebook to are sums of squares (float64).
    affine = (*SMALL, *UNEVEN_VQ, "--set", "train.shard_size=1", "--set", "quantizer.vq.affine_param=true")
    run.train("one_affine", *affine)
    run.launch(5, "five_affine", *affine)
    run.compare("one_affine", "five_affine", 0)
    run.same_checkpoint("one_affine", "five_affine")
    evaluate(run, "five0", "step 12", "--limit", "32")


@scenario(240, labels=PARITY)
def launch_resume_in_shards_onto_other_ranks_is_one_process_bitwise(run):
    # G5 and G6 together: in shards, a run on 2 ranks for 5 steps, resumed on 5 ranks to step 9 and
    # then on one process to step 12, is the uninterrupted one-process run bit for bit.
    args = ("--config", HERE / "small_run.toml", *UNEVEN_VQ, "--set", "train.shard_size=1")
    run.train("one", *args, "--steps", 12)
    run.launch(2, "run", *args, "--steps", 5, log="part1.log")
    log = run.lockstep("launch", "-n", 5, "--", "train", "--resume", "run", "--steps", 9, log="part2.log")
    run.expect(log, r"rank 4/5\] resumed at step 5 of 9", "the run resumed on 5 ranks")
    log = run.lockstep("train", "--resume", "run", "--steps", 12, log="part3.log")
    run.expect(log, "resumed at step 9 of 12", "the run resumed on one process")
    run.compare("one", "run", 0)
    run.same_checkpoint("one", "run")


@scenario(240, labels=PARITY)
def launch_resume_on_the_same_ranks_is_bitwise(run):
    # G6 on ranks, without shards: 5 uneven ranks (5, 5, 5, 5 and 4 images) stopped at step 5 and
    # resumed on 5 ranks give the uninterrupted 5-rank run bit for bit.
    args = ("--config", HERE / "small_run.toml", *UNEVEN_VQ)
    run.launch(5, "whole", *args, "--steps", 12)
    run.launch(5, "run", *args, "--steps", 5, log="part1.log")
    log = run.lockstep("launch", "-n", 5, "--", "train", "--resume", "run", "--steps", 12, log="part2.log")
    run.expect(log, r"rank 4/5\] resumed at step 5 of 12", "the resumed run")
    run.compare("whole", "run", 0)
    run.same_checkpoint("whole", "run")


@scenario(240, labels=PARITY)
def launch_uneven_ranks_match_one_process(run):
    # Without shards (train.shard_size = 0), 24 images on 5 ranks (5, 5, 5, 5, 4), VQ with k-means
    # and dead codes: the first step within float32 rounding (G4's promise for a step, on any CPU);
    # the whole run only within 2e-2, since a near-tie nearest-code flip after float32 sums over ranks
    # (its step depends on the CPU's kernels: 1.6e-3 by step 12 here, 3.3e-3 on an AMD EPYC) lets
    # runs drift, while a wrong weighting moves the first step by far more. Whole runs that agree bit
    # for bit: the scenario above.
    run.train("one", *SMALL, *UNEVEN_VQ)
    run.launch(5, "five", *SMALL, *UNEVEN_VQ)
    run.compare("one", "five", 1e-5, first=1)
    run.compare("one", "five", 2e-2)
    evaluate(run, "five", "step 12", "--limit", "32")


@scenario(240, labels=PARITY)
def launch_two_ranks_residual_simvq_match_one_process(run):
    # Quantize dropout: the dropped layers' maps get zero gradients on every rank alike.
    one_and_ranks(run, 2, "--quantizer", "residual-simvq", "--set", "quantizer.simvq.codebook_size=64", "--set",
                  "quantizer.residual.num_quantizers=3", "--set", "quantizer.residual.quantize_dropout=true")


@scenario(240, labels=PARITY)
def launch_two_ranks_grouped_residual_vq_match_one_process(run):
    # Quantize dropout: every group keeps the same layers, on every rank alike.
    one_and_ranks(run, 2, "--quantizer", "grouped-residual-vq", "--set", "quantizer.vq.dim=4", "--set",
                  "quantizer.vq.codebook_size=32", "--set", "quantizer.residual.num_quantizers=2", "--set",
                  "quantizer.residual.quantize_dropout=true")


@scenario(240, labels=PARITY)
def launch_two_ranks_fsp_match_one_process(run):
    # FSP: its regulariser's moments are the global batch's and its perturbations are drawn by each
    # element's place in the global batch, so 2 ranks train as one process.
    one_and_ranks(run, 2, "--quantizer", "fsp", "--set", "quantizer.fsp.quantize_rate=0.5", "--set",
                  "quantizer.fsp.vector_norm=kurt")


@scenario(240, labels=PARITY)
def launch_two_ranks_affine_vq_match_one_process(run):
    # VQ with affine_param: the batch statistics the codebook is moved to are the global batch's.
    one_and_ranks(run, 2, "--quantizer", "vq", "--set", "quantizer.vq.affine_param=true", "--set",
                  "quantizer.vq.codebook_size=64")


@scenario(300, labels=PARITY)
def launch_resume_onto_more_ranks_matches_one_process(run):
    # A 2-rank run resumed on 3 ranks (the same global batch) continues the one-process sequence.
    run.train("one", *SMALL)
    run.launch(2, "run", "--config", HERE / "small_run.toml", "--steps", "6", log="part1.log")
    log = run.lockstep("launch", "-n", 3, "--", "train", "--resume", "run", "--steps", 12, log="part2.log")
    run.expect(log, "resumed at step 6 of 12", "the resumed run")
    run.compare("one", "run", 1e-4)
    evaluate(run, "run", "step 12", "--limit", "16")


@scenario(300, needs=("torchrun",), labels=PARITY)
def torchrun_two_ranks_match_launch_and_one_process(run):
    # torchrun's agent hosts the store, so rank 0 connects as a client: 2 ranks under torchrun give
    # exactly what `lockstep launch -n 2` gives, and one process's losses.
    run.train("one", *SMALL)
    run.launch(2, "launched", *SMALL)
    log = run.command([run.torchrun, "--standalone", "--nproc-per-node", 2, "--no-python", run.binary, "train",
                       "--run-dir", "torchrun", *SMALL], "torchrun.log")
    if len(re.findall("trained 12 steps", log)) != 2:
        raise Failure(f"both torchrun ranks should report 12 steps:\n{log[-3000:]}")
    run.compare("one", "torchrun", 1e-4)
    run.compare("launched", "torchrun", 0)
    evaluate(run, "torchrun", "step 12", "--limit", "32")


@scenario(120)
def train_ranks_from_flags(run):
    # Ranks from flags instead of the environment: rank 0 takes any free port (--master-port 0) and says which;
    # rank 1 is started with it.
    out = run.two_ranks("train", "--run-dir", "run", "--steps", 6, "--config", HERE / "small_run.toml")
    run.expect(out, r"store listens on 127\.0\.0\.1:[0-9]+.*trained 6 steps.*test: mse", "both ranks' run")


FOLDER = ("--buckets", "64x64,80x64,64x80", "--global-batch", 8, "--threads", 1, "--set", "data.eval_images=8",
          "--set", "model.channels=[8,16]", "--set", "train.log_every=2", "--set", "data.random_flip=true",
          "--set", "data.random_zoom=1.3")


@scenario(300, needs=("images",), labels=PARITY)
def folder_two_ranks_match_one_process_three_epochs(run):
    # G5 end to end: 3 epochs on 2 ranks (4 images each per step, from two buckets), with random crops
    # and flips, give one process's losses (each image's draw belongs to its slot of the global batch);
    # each epoch's report counts the file that is not an image; `eval` repeats the run's final figures.
    run.images()
    run.train("one", "--data", "images", "--epochs", 3, *FOLDER)
    log = run.launch(2, "two", "--data", "images", "--epochs", 3, *FOLDER)
    run.compare("one", "two", 1e-4)
    run.expect(log, r"rank 0/2\] epoch 3 of 3 ended at step [0-9]+: 0 images replaced \(failed to decode\), "
               r"1 unreadable files left out", "the epoch report")
    if "not-really.jpg" not in (run.dir / "two" / "manifest.json").read_text():
        raise Failure("the manifest does not name the file that is not an image")
    final = re.findall(r"mse .*", log)[-1]
    evaluated = run.lockstep("eval", "two", log="eval.log").strip().splitlines()[-1]
    if evaluated != final:
        raise Failure(f"eval reports {evaluated!r}, the run's final evaluation {final!r}")


@scenario(300, needs=("images",), labels=PARITY)
def folder_resume_onto_three_ranks_matches_one_process(run):
    # Exact resume onto another number of ranks: 2 ranks for 6 steps, then 3 (3, 3 and 2 images)
    # continue the one-process sequence across the epoch boundary (10 steps per epoch), crops and flips included.
    run.images()
    run.train("one", "--data", "images", "--steps", 14, *FOLDER)
    run.launch(2, "run", "--data", "images", "--steps", 6, *FOLDER, log="part1.log")
    log = run.lockstep("launch", "-n", 3, "--", "train", "--resume", "run", "--steps", 14, log="part2.log")
    run.expect(log, "resumed at step 6 of 14", "the resumed run")
    run.compare("one", "run", 1e-4)
    evaluate(run, "run", "step 14", "--split", "train")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--lockstep")
    parser.add_argument("--workdir")
    parser.add_argument("--torchrun")
    parser.add_argument("--opencv-images")
    args = parser.parse_args()
    if args.list:
        for name, (_, timeout, needs, labels) in SCENARIOS.items():
            print(name, timeout, ",".join(needs) or "-", ",".join(labels) or "-")
        return 0
    if args.name not in SCENARIOS:
        parser.error(f"no scenario {args.name!r}; --list names them")
    function, timeout, needs, _ = SCENARIOS[args.name]
    missing = [n for n, given in (("torchrun", args.torchrun), ("images", args.opencv_images)) if n in needs and not given]
    if missing:
        print(f"skipped: {args.name} needs {', '.join(missing)}")
        return SKIPPED
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    # A few seconds under ctest's limit, so that this process reports which command was still running.
    absolute = [str(Path(p).resolve()) if p else p for p in (args.lockstep, args.opencv_images)]
    run = Run(absolute[0], workdir, time.monotonic() + timeout - 10, args.torchrun, absolute[1])
    # SIGTERM (ctest's timeout, an interrupted run) ends the scenario as an exception, so that what it started is
    # ended and what it made (two_hosts' namespaces) removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        function(run)
    except Failure as failure:
        print(f"FAILED {args.name}: {failure}", file=sys.stderr)
        return 1
    except Skipped as reason:  # this machine cannot run it (ctest: skipped)
        print(f"skipped: {args.name}: {reason}")
        return SKIPPED
    print(f"ok: {args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
