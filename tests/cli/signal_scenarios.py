"""The CLI's signal scenarios (scenarios.py runs them): every way a run is told to stop (SIGHUP from a closed
terminal, a closed stdout pipe, the launcher killed, a second SIGINT to launch, SIGINT to one rank) ends it with
the last step's checkpoint saved and one line saying so; and `launch --max-restarts` brings a run whose rank
was killed, twice, to the end an uninterrupted run reaches, bit for bit."""
import json
import os
import re
import signal
import subprocess
import time

from fault_scenarios import SMALLEST, Launched, children_by_rank, training
from scenario_kit import HERE, Failure, environment, evaluate, scenario

# One process training for as long as it is let, logging every step.
ENDLESS = ("--run-dir", "run", "--steps", 100000, "--batch-size", 8, *SMALLEST, "--set", "train.log_every=1",
           "--set", "train.eval_every=0")


def interrupted_summary(run, run_dir="run"):
    """The step summary.json says the run was interrupted at, with its checkpoint there; Failure otherwise."""
    summary = json.loads((run.dir / run_dir / "summary.json").read_text())
    if not summary.get("interrupted") or not (run.dir / run_dir / "checkpoint.safetensors").exists():
        raise Failure(f"{run_dir}: no interrupted summary with a checkpoint: {summary}")
    return summary["steps"]


def logged_steps(run, run_dir="run"):
    metrics = run.dir / run_dir / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


@scenario(120)
def train_saves_on_hangup_and_on_a_closed_pipe(run):
    # A closed terminal (SIGHUP) stops the run after the step under way, saved (exit 130), as Ctrl-C does.
    process = run.start("train", *ENDLESS, log="hangup.log")
    run.wait_until(lambda: logged_steps(run) >= 2 or process.poll() is not None, 60)
    process.send_signal(signal.SIGHUP)
    out = run.wait(process, "hangup.log", expect=130)
    steps = interrupted_summary(run)
    run.expect(out, rf"interrupted at step {steps}; checkpoint saved", "the line saying the checkpoint is saved")
    # `lockstep train | head -3`: the reader goes away; the run stops after its step, saved, and says so on
    # stderr (stdout is gone). It used to die of SIGPIPE (exit 141) with no checkpoint.
    with open(run.dir / "pipe.err", "wb") as err:
        process = subprocess.Popen([run.binary, "train", "--resume", "run", "--steps", "100000"], cwd=run.dir,
                                   stdout=subprocess.PIPE, stderr=err, start_new_session=True, env=environment({}))
        try:
            for _ in range(3):
                process.stdout.readline()
            process.stdout.close()
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    said = (run.dir / "pipe.err").read_text(errors="replace")
    if code != 130:
        raise Failure(f"train with its stdout closed exited {code}, expected 130\n{said[-3000:]}")
    resumed = interrupted_summary(run)
    run.expect(said, rf"interrupted at step {resumed}; checkpoint saved", "the closing line on stderr")
    if resumed <= steps:
        raise Failure(f"the resumed run stopped at step {resumed}, not after step {steps}")
    evaluate(run, "run", f"step {resumed}", "--limit", 8)


def gone(pid):
    """Whether process `pid` has ended (a zombie counts: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@scenario(180)
def launch_killed_its_ranks_save_a_checkpoint(run):
    # `kill -KILL` of launch: its ranks get SIGTERM (their parent died) and write to the dead launcher's pipe;
    # they save their checkpoint all the same (they used to die of SIGPIPE first).
    with training(run, 10) as launched:
        ranks = dict(launched.ranks)
        launched.process.kill()
        if not run.wait_until(lambda: all(gone(pid) for pid in ranks.values()), 60):
            raise Failure(f"the ranks {ranks} still run 60 s after launch was killed")
    steps = interrupted_summary(run)
    print(f"ok: both ranks stopped at step {steps} with the checkpoint saved")


# Two ranks whose steps last long (each rank accumulates 480 one-image micro-batches), so that a second signal
# comes while a step is under way.
LONG_STEPS = ("--run-dir", "run", "--config", HERE / "small_run.toml", "--steps", 100000, "--batch-size", 960,
              "--set", "data.train_subset=1920", "--set", "train.grad_accum=480", "--set", "train.log_every=1")


@scenario(180)
def launch_passes_a_second_sigint_on(run):
    # SIGINT to launch (by its pid, as a scheduler or `kill -INT` sends it) asks the ranks to stop after the
    # step under way; a second one, later, stops them at once (it used to be ignored until the grace ran out).
    with Launched(run, "-n", 2, "--grace", 60, "--", "train", *LONG_STEPS) as launched:
        launched.wait_for(r"rank 0/2\] step", 120, "training did not start")
        launched.process.send_signal(signal.SIGINT)
        launched.wait_for(r"passing it to the ranks", 10, "launch passing the first SIGINT on")
        time.sleep(0.5)
        launched.process.send_signal(signal.SIGINT)
        asked = time.monotonic()
        launched.ended_with(130, 30, "the second SIGINT")
        took = time.monotonic() - asked
        launched.expect(r"again; passing it on", "launch passing the second SIGINT on")
        launched.expect(r"stopped at once \(a second interrupt\)", "a rank stopping at once")
        launched.no_rank_left()
    print(f"ok: launch ended {took:.1f} s after the second SIGINT")


@scenario(180)
def launch_rank_interrupted_alone_is_no_failure(run):
    # SIGINT to one rank: every rank stops after the same step, saved; launch says the run was interrupted and
    # exits 130, not "rank 1 failed with exit status 130".
    with training(run, 10) as launched:
        os.kill(launched.rank(1), signal.SIGINT)
        launched.ended_with(130, 60, "rank 1 got SIGINT")
        launched.expect(r"the run was interrupted \(rank [01] of 2 exited with 130 first\); its checkpoint is saved",
                        "launch's line")
        if re.search(r"failed with", launched.log()):
            raise Failure(f"launch called the interruption a failure\n{launched.log()[-3000:]}")
        launched.no_rank_left()
    interrupted_summary(run)


# A run whose rank 1 is killed twice: 2 ranks in shards, a checkpoint every 5 steps.
RESTARTED = ("--config", HERE / "small_run.toml", "--steps", 40, "--set", "train.checkpoint_every=5",
             "--set", "train.shard_size=1", "--set", "train.log_every=1", "--set", "train.eval_every=0")


@scenario(300)
def launch_restarts_a_lost_rank_until_the_run_completes(run):
    # launch --max-restarts 2: rank 1 SIGKILLed after the checkpoint at step 10, then again (in its second life)
    # after the one at step 25; every rank restarts from the last checkpoint by itself, and the run ends where
    # the uninterrupted one does, bit for bit.
    run.launch(2, "whole", *RESTARTED)
    launched = Launched(run, "-n", 2, "--max-restarts", 2, "--", "train", "--run-dir", "run", *RESTARTED)
    with launched:
        for restart, after_step in ((1, 10), (2, 25)):
            def past():
                launched.remember_ranks()
                return (logged_steps(run) > after_step and 1 in launched.ranks) or launched.process.poll() is not None
            run.wait_until(past, 120)
            os.kill(launched.rank(1), signal.SIGKILL)
            launched.wait_for(rf"restart {restart} of 2", 60, f"launch restarting after kill {restart}")
            launched.ranks.clear()
        launched.ended_with(0, 240, "the second restart")
        launched.expect(r"rank [01] was lost \(.*\); restart 2 of 2", "the second restart logged")
        launched.expect(r"rank 0/2\] restart 2: resuming run from its last checkpoint", "rank 0 resuming")
    run.same_checkpoint("whole", "run")
    print("ok: killed twice, restarted twice, the final checkpoint equals the uninterrupted run's bit for bit")


@scenario(300, needs=("torchrun",))
def torchrun_restarts_a_lost_rank_from_the_checkpoint(run):
    # torchrun --max-restarts 1 starts the workers again with the same command after rank 1 is SIGKILLed; train
    # sees TORCHELASTIC_RESTART_COUNT and resumes its --run-dir from the last checkpoint, and the run ends where
    # the uninterrupted one (under launch, which torchrun matches exactly) does, bit for bit.
    run.launch(2, "whole", *RESTARTED)
    with open(run.dir / "torchrun.log", "wb") as log:
        process = subprocess.Popen([run.torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                                    "--no-python", run.binary, "train", "--run-dir", "run", *map(str, RESTARTED)],
                                   cwd=run.dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=environment({}))
    try:
        target = []
        def past():
            target[:] = [pid for rank, pid in children_by_rank(process.pid).items() if rank == 1]
            return (logged_steps(run) > 10 and target) or process.poll() is not None
        run.wait_until(past, 120)
        if not target:
            raise Failure(f"rank 1 not found under torchrun\n{(run.dir / 'torchrun.log').read_text()[-3000:]}")
        os.kill(target[0], signal.SIGKILL)
        code = process.wait(timeout=max(run.deadline - time.monotonic(), 1))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    text = (run.dir / "torchrun.log").read_text(errors="replace")
    if code != 0:
        raise Failure(f"torchrun exited {code}\n{text[-3000:]}")
    run.expect(text, r"restart 1: resuming run from its last checkpoint", "train resuming after torchrun's restart")
    run.same_checkpoint("whole", "run")
