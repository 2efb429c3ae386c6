"""The multi-process harness of the distributed tests: real processes (torch.multiprocessing, forkserver),
torch.distributed with Gloo on CPU over a file rendezvous, and a hard time limit per run."""
import datetime
import faulthandler
import os
import signal
import subprocess
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIME_LIMIT = 120  # seconds per test: a rank that waits for another fails the test, it never hangs CI

# Ranks start from a fork server that has imported torch and lockstep once per test file: a spawned rank
# would import them afresh (2-3 s of CPU each), which was most of the suite's time. The server imports
# and runs nothing else, so each rank still starts with no threads and no process group.
START_METHOD = "forkserver"
mp.set_forkserver_preload(["torch", "torch.distributed", "lockstep", "vector_quantize_pytorch", "numpy"])


def run_ranks(world, target, *args):
    """Runs target(rank, world, *args) on `world` processes; returns their results (None for a rank that
    ended its process without returning, as a test's killed rank does with os._exit(0))."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        results = mp.get_context(START_METHOD).Manager().dict()
        context = mp.start_processes(_entry, args=(world, store, results, target, args), nprocs=world, join=False,
                                     start_method=START_METHOD)
        deadline = time.time() + TIME_LIMIT
        while not context.join(timeout=max(0.1, deadline - time.time())):
            if time.time() > deadline:
                for p in context.processes:
                    p.kill()
                pytest.fail(f"ranks still running after {TIME_LIMIT} s: one is waiting for another")
        return [results.get(r) for r in range(world)]


def _entry(rank, world, store, results, target, args):
    # A rank still running shortly before the limit prints where each of its threads is (to the
    # test's captured stderr), so a hang names its place before the rank is killed.
    faulthandler.dump_traceback_later(TIME_LIMIT - 10, exit=False)
    # A collective that waits longer than this is a failure of the test (a rank out of step).
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    # Every rank has finished connecting before any starts: a rank whose target returns at once would
    # otherwise close its connections while another is still making its own ("Gloo connectFullMesh
    # failed ... Connection closed by peer", seen once under make test's load).
    dist.barrier()
    try:
        results[rank] = target(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_launched(command, cwd, time_limit, env=None):
    """Runs `command` (a launcher and its script) in its own process group from `cwd`; returns its exit
    status and output. Past `time_limit` seconds the whole group is killed (a hung Lightning process
    ignores SIGTERM) and the test fails with the output's end."""
    env = dict(env or os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("MASTER_PORT", None)
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=time_limit)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{command[-3:]}: still running after {time_limit} s:\n{output.decode()[-3000:]}")
    return process.returncode, output.decode()


STEP_KEY = "(seed, step)"


def state_with_steps(module):
    """module.state_dict()'s tensors, cloned, and each lockstep module's (seed, step), which ride in the state
    dict's metadata, under `<module>.(seed, step)`: what ranks compare to show that they agree, draws included."""
    state = module.state_dict()
    values = {k: v.detach().clone() for k, v in state.items()}
    values.update({f"{prefix}.{STEP_KEY}" if prefix else STEP_KEY: torch.tensor(entry["lockstep"])
                   for prefix, entry in state._metadata.items() if "lockstep" in entry})
    return values


def loadable(state):
    """A state_with_steps() without the (seed, step) entries, for load_state_dict."""
    return {k: v for k, v in state.items() if not k.endswith(STEP_KEY)}
