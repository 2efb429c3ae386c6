"""What `lockstep train` and `lockstep encode` write is read from Python with the usual libraries: a
checkpoint with safetensors (its quantizer state loading into the matching lockstep module), tokens
with numpy."""
import json
import os
import subprocess

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy

import lockstep

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # installed by scripts/install-deps


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cli = os.environ.get("LOCKSTEP_CLI")
    if not cli or not os.path.exists(cli):
        pytest.skip("LOCKSTEP_CLI does not name the lockstep program (ctest sets it)")
    if not os.path.isdir(FASHION_MNIST):
        pytest.skip(f"no Fashion-MNIST at {FASHION_MNIST} (scripts/install-deps installs it)")
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    subprocess.run([cli, "train", "--run-dir", str(run_dir), "--steps", "3", "--batch-size", "16", "--threads", "1",
                    "--quantizer", "vq", "--set", "data.train_subset=64", "--set", "data.test_subset=32",
                    "--set", "model.channels=[8,8]", "--set", "quantizer.vq.codebook_size=64"],
                   check=True, capture_output=True, timeout=120)
    tokens = run_dir.parent / "tokens.npy"
    subprocess.run([cli, "encode", str(run_dir), "-o", str(tokens), "--limit", "20", "--threads", "1"], check=True,
                   capture_output=True, timeout=120)
    return run_dir, tokens


def test_a_checkpoint_loads_with_safetensors_and_its_codebook_into_lockstep(run):
    run_dir, _ = run
    path = str(run_dir / "checkpoint.safetensors")
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
        state = {key: f.get_tensor(key) for key in f.keys()}
    assert metadata["step"] == "3" and "[quantizer.vq]" in metadata["config"]
    assert set(load_numpy(path)) == set(state)  # numpy reads the same entries
    prefix = "model/quantizer."
    codebook = {"_codebook." + key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
    vq = lockstep.VectorQuantize(dim=codebook["_codebook.embed"].shape[-1], codebook_size=64)
    vq.load_state_dict(codebook)  # strict: the same names and shapes as the module's own state
    assert torch.equal(vq.codebook, state[prefix + "embed"][0]) and bool(vq._codebook.initted)


def test_tokens_load_with_numpy(run):
    run_dir, tokens = run
    array = np.load(tokens)
    assert array.dtype == np.int32 and array.shape[0] == 20 and array.ndim == 3
    assert array.min() >= 0 and array.max() < 64
    summary = json.loads((run_dir / "summary.json").read_text())  # plain JSON, with the final evaluation
    assert summary["steps"] == 3 and summary["test"]["images"] == 32 and 0 < summary["test"]["ssim"] <= 1
