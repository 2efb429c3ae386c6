"""lockstep's modules under the launchers and frameworks users train with (launched_training.py): torchrun,
HF accelerate's launcher and a Lightning DDP run, 2 CPU processes each, rank 0 alone running the model in
training mode at every epoch end. Each run must finish within a hard limit (the whole process group is
killed after it) with every parameter and buffer identical on both ranks."""
import os
import sys

import pytest
import torch

from ranks import run_launched

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launched_training.py")
TIME_LIMIT = 180  # seconds per run; a hung Lightning process ignores SIGTERM, so the group gets SIGKILL
COMMANDS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"],
    "accelerate": [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
    "lightning": [sys.executable],
}


def _run(framework, out):
    status, output = run_launched(COMMANDS[framework] + [SCRIPT, framework, str(out)], out, TIME_LIMIT)
    assert status == 0, f"{framework} exited {status}:\n{output[-3000:]}"


@pytest.mark.parametrize("framework", list(COMMANDS))
def test_a_rank_zero_preview_in_training_mode_leaves_ranks_identical(framework, tmp_path):
    _run(framework, tmp_path)
    for name in ("FSQ", "VectorQuantize", "LFQ"):
        states = [torch.load(tmp_path / f"{name}-rank{r}.pt") for r in range(2)]
        assert states[0].keys() == states[1].keys()
        for key in states[0]:
            assert torch.equal(states[0][key], states[1][key]), f"{framework}, {name}: {key} differs between ranks"
