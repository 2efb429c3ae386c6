"""What the CLI scenarios share (tests/cli/scenarios.py runs them): the registry, a scenario's
directory and tools (Run: each command killed at the scenario's deadline, its output kept in a log),
the shared small run (small_run.toml) and the checks the scenarios make."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare_metrics import figures  # noqa: E402

SKIPPED = 77
SCENARIOS = {}


class Failure(Exception):
    pass


class Skipped(Exception):
    """What a scenario raises when this machine cannot run it (the reason): ctest shows it skipped."""


def scenario(timeout, needs=(), labels=()):
    """Registers a scenario: `timeout` seconds for everything it runs; `needs` names what it must be
    given ("torchrun", "images"); `labels`, its ctest labels ("channel": CI also runs it against Debian's
    LibTorch)."""
    def register(function):
        SCENARIOS[function.__name__] = (function, timeout, tuple(needs), tuple(labels))
        return function
    return register


def environment(env):
    """os.environ with `env` on top, a None value removing the variable."""
    merged = {**os.environ, **(env or {})}
    return {key: value for key, value in merged.items() if value is not None}


def stop(process):
    """Ends a command's process group: SIGTERM first (torchrun passes it on to its workers, which run
    in sessions of their own), SIGKILL after 5 s; returns what it printed. Never waits longer."""
    output = b""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            output, _ = process.communicate(timeout=5)
            return output
        except subprocess.TimeoutExpired:
            continue
    if process.stdout:  # a descendant outside the group still holds the pipe: stop reading it
        process.stdout.close()
    return output


class Run:
    """One scenario's directory and tools: runs the CLI there, keeps each command's output in a log."""

    def __init__(self, lockstep, workdir, deadline, torchrun=None, opencv_images=None):
        self.binary, self.dir, self.deadline = lockstep, Path(workdir), deadline
        self.torchrun, self.opencv_images = torchrun, opencv_images

    def command(self, argv, log, expect=0, env=None):
        """Runs argv in the scenario's directory (in its own process group, all of it killed at the
        deadline), with `env` added to the environment; writes its output to `log`; returns it.
        Failure when the exit status differs."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Failure(f"no time left for {argv[:4]}")
        try:
            process = subprocess.Popen([str(a) for a in argv], cwd=self.dir, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       env=environment(env))
        except OSError as e:
            raise Failure(f"cannot run {argv[0]}: {e}")
        try:
            output, _ = process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            output = stop(process)
            raise Failure(f"still running at the deadline: {' '.join(map(str, argv))}\n"
                          f"{output.decode(errors='replace')[-3000:]}")
        text = output.decode(errors="replace")
        (self.dir / log).write_text(text)
        if process.returncode != expect:
            raise Failure(f"exit status {process.returncode}, expected {expect}: {' '.join(map(str, argv))}\n"
                          f"{text[-3000:]}")
        return text

    def lockstep(self, *args, log, expect=0, env=None):
        return self.command([self.binary, *args], log, expect, env)

    def train(self, run_dir, *args, env=None):
        """One process: `lockstep train --run-dir RUN_DIR ARGS` (log RUN_DIR.log)."""
        return self.lockstep("train", "--run-dir", run_dir, *args, log=f"{run_dir}.log", env=env)

    def launch(self, ranks, run_dir, *args, log=None, env=None):
        """`lockstep launch -n RANKS -- train --run-dir RUN_DIR ARGS` (log RUN_DIR.log)."""
        return self.lockstep("launch", "-n", ranks, "--", "train", "--run-dir", run_dir, *args,
                             log=log or f"{run_dir}.log", env=env)

    def start(self, *args, log, env=None):
        """`lockstep ARGS` started in the scenario's directory, in its own process group, its output to `log`;
        `wait` ends it."""
        with open(self.dir / log, "wb") as out:
            return subprocess.Popen([str(self.binary), *map(str, args)], cwd=self.dir, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, env=environment(env))

    def wait(self, process, log, expect=0):
        """What a started process wrote to `log` once it ended (killed at the deadline: Failure); Failure unless
        its exit status is `expect`."""
        try:
            code = process.wait(timeout=max(self.deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            stop(process)
            raise Failure(f"still running at the deadline: {' '.join(map(str, process.args))}")
        text = (self.dir / log).read_text(errors="replace")
        if code != expect:
            raise Failure(f"exit status {code}, expected {expect}: {' '.join(map(str, process.args))}\n{text[-3000:]}")
        return text

    def wait_until(self, condition, seconds):
        """Polls `condition` every 10 ms for up to `seconds` (never past the deadline); whether it held."""
        end = min(time.monotonic() + seconds, self.deadline)
        while not condition():
            if time.monotonic() > end:
                return False
            time.sleep(0.01)
        return True

    def start_two_ranks(self, *args, rank1_extra=()):
        """`lockstep ARGS` started as two ranks by hand with --rank/--world-size (logs rank0.log, rank1.log): rank 0
        with --master-port 0 (any free port) says where its store listens, and rank 1 is started with that port
        and `rank1_extra` after ARGS. Returns both processes; stop_all ends them."""
        log0 = self.dir / "rank0.log"
        ranks = [self.start(*args, "--rank", 0, "--world-size", 2, "--master-port", 0, log=log0.name)]
        try:
            port = self.store_port(log0, ranks[0])
            ranks.append(self.start(*args, *rank1_extra, "--rank", 1, "--world-size", 2, "--master-port", port,
                                    log="rank1.log"))
        except BaseException:
            self.stop_all(ranks)
            raise
        return ranks

    def store_port(self, log, rank0):
        """The port rank 0 (process `rank0`, its output in `log`) says its store listens on; Failure when it ends
        or the deadline comes first."""
        while True:
            found = re.search(r"^rank 0: the store listens on .*:(\d+)$", log.read_text(errors="replace"), re.M)
            if found:
                return found.group(1)
            if rank0.poll() is not None or time.monotonic() > self.deadline:
                raise Failure(f"rank 0 did not say where its store listens:\n{log.read_text(errors='replace')}")
            time.sleep(0.05)

    @staticmethod
    def stop_all(processes):
        """Ends each started process still running (stop)."""
        for process in processes:
            if process.poll() is None:
                stop(process)

    def two_ranks(self, *args, rank1_extra=(), expect=0):
        """`lockstep ARGS` as two ranks (start_two_ranks), waited for. Returns rank 0's output, then rank 1's;
        Failure unless rank 0 exits with `expect`. Both are killed at the deadline."""
        argv = [str(self.binary), *map(str, args)]
        logs = [self.dir / f"rank{r}.log" for r in range(2)]
        ranks = self.start_two_ranks(*args, rank1_extra=rank1_extra)
        try:
            codes = [process.wait(timeout=max(self.deadline - time.monotonic(), 0.1)) for process in ranks]
        except subprocess.TimeoutExpired:
            raise Failure(f"still running at the deadline: two ranks of {' '.join(argv)}")
        finally:
            self.stop_all(ranks)
        text = "".join(f"--- rank {r} (exit {code}) ---\n{log.read_text(errors='replace')}"
                       for r, (code, log) in enumerate(zip(codes, logs)))
        if codes[0] != expect:
            raise Failure(f"rank 0's exit status {codes[0]}, expected {expect}: {' '.join(argv)}\n{text[-3000:]}")
        return text

    def python(self, script, *args, log):
        return self.command([sys.executable, HERE / script, *args], log)

    def compare(self, one, other, tolerance, *names, first=None):
        """Each of `names` (the loss by default; KIND:name for another record kind) of every logged step
        of run `other` within `tolerance` (relative) of run `one`'s; the first `first` steps only."""
        for spec in names or ("loss",):
            kind, name = spec.split(":", 1) if ":" in spec else ("train", spec)
            a = figures(self.dir / one / "metrics.jsonl", kind, name)
            b = figures(self.dir / other / "metrics.jsonl", kind, name)
            if not a or sorted(a) != sorted(b):
                raise Failure(f"{kind} steps differ: {one} logged {sorted(a)}, {other} {sorted(b)}")
            steps = sorted(a)[:first]
            worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in steps)
            if worst > tolerance:
                raise Failure(f"{other} vs {one}: {name} differs by {worst:.2e} (relative) over {len(steps)} "
                              f"{kind} steps, beyond {tolerance:.0e}")

    def same_checkpoint(self, one, other):
        """Failure unless the two runs' checkpoints hold the same tensors, bit for bit (model, weight
        average, optimizer and quantizer state)."""
        a, b = (tensors(self.dir / r / "checkpoint.safetensors") for r in (one, other))
        differ = sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))
        if not a or differ:
            raise Failure(f"{other} vs {one}: {len(differ)} of {len(a)} checkpoint tensors differ: {differ[:5]}")

    def expect(self, text, pattern, what):
        if not re.search(pattern, text, re.S):
            raise Failure(f"{what}: no match for {pattern!r} in\n{text[-3000:]}")

    def images(self):
        """OpenCV's example images in ./images, plus a file that is not an image (tests/cli/folder.tests.cmake)."""
        self.command(["bash", HERE / "fetch_opencv_images.sh", self.opencv_images], "fetch.log")
        shutil.copytree(self.opencv_images, self.dir / "images")
        (self.dir / "images" / "not-really.jpg").write_text("junk\n")


def tensors(path):
    """A safetensors file's tensors as {name: raw bytes} (its header is JSON after its 8-byte length)."""
    data = Path(path).read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    return {name: data[8 + length + t["data_offsets"][0]:8 + length + t["data_offsets"][1]]
            for name, t in header.items()}


# The small run (tests/cli/small_run.toml) for 12 steps, and for 4 steps on 64 images.
SMALL = ("--config", HERE / "small_run.toml", "--steps", "12")
TINY = ("--config", HERE / "small_run.toml", "--steps", "4", "--batch-size", "16", "--set", "data.train_subset=64")


def one_and_ranks(run, ranks, *args, tolerance=1e-4, names=(), two="two", eval_args=()):
    """Trains `args` on one process (run `one`) and on `ranks` ranks (run `two`); the logged losses (or
    `names`) within `tolerance`; then `eval` of the ranks' run reports its final figures."""
    run.train("one", *SMALL, *args)
    log = run.launch(ranks, two, *SMALL, *args)
    run.expect(log, rf"rank {ranks - 1}/{ranks}\] trained 12 steps", "the last rank finished")
    run.compare("one", two, tolerance, *names)
    evaluate(run, two, "step 12", "--limit", "32", *eval_args)
    return log


def evaluate(run, run_dir, step, *args):
    """`lockstep eval RUN_DIR ARGS` reports the run's figures at its last step."""
    run.expect(run.lockstep("eval", run_dir, *args, log="eval.log"), rf"{step}.*mse [0-9.]+  psnr",
               f"eval of {run_dir}")


def tiny_run(run, *args, run_dir="run"):
    """The small run for 4 steps on 64 images: the run directory the single-run scenarios take."""
    run.train(run_dir, *TINY, *args)


def reject(text, pattern, what):
    """Failure when `pattern` matches `text`."""
    if re.search(pattern, text, re.S):
        raise Failure(f"{what}: {pattern!r} matches, which it must not, in\n{text[-3000:]}")
