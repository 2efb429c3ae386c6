"""python/bench/trainer_vs_pytorch.py (the GPU check's train-vs-torch row) on the CPU, a few steps: both
trainers run, its PyTorch model has the CLI checkpoint's parameters (names and shapes), and a model that
differs is refused with the parameter named."""
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "bench", "trainer_vs_pytorch.py")
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # installed by scripts/install-deps

sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import trainer_vs_pytorch  # noqa: E402


@pytest.fixture(scope="module")
def cli():
    path = os.environ.get("LOCKSTEP_CLI")
    if not path or not os.path.exists(path):
        pytest.skip("LOCKSTEP_CLI does not name the lockstep program (ctest sets it)")
    if not os.path.isdir(FASHION_MNIST):
        pytest.skip(f"no Fashion-MNIST at {FASHION_MNIST} (scripts/install-deps installs it)")
    return path


def test_both_trainers_run_and_print_one_row_each(cli):
    done = subprocess.run([sys.executable, SCRIPT, "--lockstep", cli, "--steps", "12", "--log-every", "4",
                           "--train-subset", "256", "--threads", "1", "--quantizer", "lockstep"],
                          capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| lockstep") or line.startswith("| PyTorch")]
    assert len(rows) == 2, done.stdout
    for row in rows:
        rate, loss = (float(cell) for cell in row.strip("|").split("|")[1:3])
        assert rate > 0 and 0 < loss < 2, row
    assert "ratio CLI / PyTorch" in done.stdout


def test_a_model_other_than_the_clis_is_refused_naming_the_parameter(cli, tmp_path):
    args = type("Args", (), dict(lockstep=cli, data=FASHION_MNIST, device="cpu", steps=2, batch=16, lr=2e-3,
                                 log_every=1, threads=1, train_subset=64, timeout=170))()
    _, _, shapes = trainer_vs_pytorch.cli_run(args, str(tmp_path))
    same = trainer_vs_pytorch.Autoencoder(torch.nn.Identity(), 4)
    trainer_vs_pytorch.check_same_architecture(shapes, same)  # the CLI's model: accepted
    other = trainer_vs_pytorch.Autoencoder(torch.nn.Identity(), 4, channels=[16, 32, 48])
    with pytest.raises(SystemExit, match="encoder.4.weight: CLI \\[64, 32, 3, 3\\]"):
        trainer_vs_pytorch.check_same_architecture(shapes, other)
