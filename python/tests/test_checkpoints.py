"""A project that swaps vector-quantize-pytorch for lockstep keeps what it has (issue #47 items 1 and 2):
- the same seed builds the same model: after torch.manual_seed(s) and construction, torch's global
  generator is where the reference leaves it, and both modules hold the same values;
- checkpoints load both ways with load_state_dict(strict=True), under the reference's key names, shapes
  and dtypes, and both modules then give the same outputs;
- lockstep's own (seed, step) rides in the state dict's metadata, so a strict load never sees it, and a
  resumed module draws on from where it stopped (torch.save and safetensors)."""
import io

import pytest
import torch
import vector_quantize_pytorch as vqp
from torch import nn

import lockstep

# (class, constructor options, input shape): every class, and every option that changes the state.
CASES = {
    "vq": ("VectorQuantize", dict(dim=8, codebook_size=16), (2, 12, 8)),
    "vq-kmeans": ("VectorQuantize", dict(dim=8, codebook_size=16, kmeans_init=True, kmeans_iters=2), (2, 12, 8)),
    "vq-learnable": ("VectorQuantize", dict(dim=8, codebook_size=16, learnable_codebook=True, ema_update=False),
                     (2, 12, 8)),
    "vq-cosine": ("VectorQuantize", dict(dim=8, codebook_size=16, use_cosine_sim=True), (2, 12, 8)),
    # The reference's evaluation moves the batch statistics by (1 - decay) (a documented difference): with a
    # decay of 1 they stay at the first training batch's, and both modules evaluate alike.
    "vq-affine": ("VectorQuantize", dict(dim=8, codebook_size=16, affine_param=True, affine_param_batch_decay=1.0),
                  (2, 12, 8)),
    "vq-projected": ("VectorQuantize", dict(dim=8, codebook_size=16, codebook_dim=4), (2, 12, 8)),
    "vq-heads": ("VectorQuantize", dict(dim=8, codebook_size=16, heads=2, separate_codebook_per_head=True),
                 (2, 12, 8)),
    "vq-shared-heads": ("VectorQuantize", dict(dim=8, codebook_size=16, heads=2), (2, 12, 8)),
    "vq-dead-codes": ("VectorQuantize", dict(dim=8, codebook_size=16, threshold_ema_dead_code=2), (2, 12, 8)),
    "residual-vq": ("ResidualVQ", dict(dim=8, codebook_size=16, num_quantizers=3), (2, 12, 8)),
    "residual-vq-shared": ("ResidualVQ", dict(dim=8, codebook_size=16, num_quantizers=3, shared_codebook=True),
                           (2, 12, 8)),
    "residual-vq-kmeans": ("ResidualVQ", dict(dim=8, codebook_size=16, num_quantizers=2, kmeans_init=True,
                                              kmeans_iters=2), (2, 12, 8)),
    "residual-vq-projected": ("ResidualVQ", dict(dim=8, codebook_size=16, num_quantizers=2, codebook_dim=4),
                              (2, 12, 8)),
    "residual-vq-implicit": ("ResidualVQ", dict(dim=8, codebook_size=16, num_quantizers=3,
                                                implicit_neural_codebook=True), (2, 12, 8)),
    "residual-vq-sizes": ("ResidualVQ", dict(dim=8, codebook_size=(16, 8)), (2, 12, 8)),
    "grouped-residual-vq": ("GroupedResidualVQ", dict(dim=8, codebook_size=16, num_quantizers=2, groups=2),
                            (2, 12, 8)),
    "fsq": ("FSQ", dict(levels=[8, 5, 5, 5]), (2, 12, 4)),
    "fsq-projected": ("FSQ", dict(levels=[8, 5, 5], dim=8, num_codebooks=2), (2, 12, 8)),
    "residual-fsq": ("ResidualFSQ", dict(levels=[5, 5, 5], num_quantizers=2, dim=8), (2, 12, 8)),
    "grouped-residual-fsq": ("GroupedResidualFSQ", dict(levels=[5, 5, 5], num_quantizers=2, dim=8, groups=2),
                             (2, 12, 8)),
    "lfq": ("LFQ", dict(dim=4, codebook_size=16), (2, 12, 4)),
    "lfq-projected": ("LFQ", dict(dim=8, codebook_size=16, num_codebooks=2), (2, 12, 8)),
    "residual-lfq": ("ResidualLFQ", dict(dim=8, codebook_size=16, num_quantizers=2), (2, 12, 8)),
    "grouped-residual-lfq": ("GroupedResidualLFQ", dict(dim=8, codebook_size=16, num_quantizers=2, groups=2),
                             (2, 12, 8)),
    "latent": ("LatentQuantize", dict(levels=[5, 5, 5], dim=8), (2, 8, 12)),  # channel first, as the reference
    "simvq": ("SimVQ", dict(dim=8, codebook_size=16), (2, 12, 8)),
    "residual-simvq": ("ResidualSimVQ", dict(dim=8, num_quantizers=2, codebook_size=16), (2, 12, 8)),
    "random-projection": ("RandomProjectionQuantizer", dict(dim=8, codebook_size=16, codebook_dim=4), (2, 12, 8)),
    "fsp": ("FSP", dict(levels=[8, 5, 5], dim=6), (2, 12, 6)),
    "fsq-rotation": ("FSQ", dict(levels=[5, 5, 5], orthogonal_rotation=True), (2, 12, 3)),
    "lfq-rotation": ("LFQ", dict(dim=4, codebook_size=16, orthogonal_rotation=True), (2, 12, 4)),
    "lfq-spherical": ("LFQ", dict(dim=4, codebook_size=16, spherical=True), (2, 12, 4)),
    "simvq-frozen-dim": ("SimVQ", dict(dim=8, codebook_size=32, frozen_codebook_dim=5), (2, 12, 8)),
    "hierarchical": ("HierarchicalVQ", dict(dim=8, codebook_size=16, scales=[1, 2, 4], shared_codebook=False,
                                            kmeans_init=False, threshold_ema_dead_code=0), (4, 8, 4)),
    "hierarchical-defaults": ("HierarchicalVQ", dict(dim=8, codebook_size=16, scales=[1, 2, 4]), (4, 8, 4)),
    # Modules of the user's as arguments: made from the generator after the seed, by the options function.
    "evo-lfq": ("EvoLFQ", lambda: dict(encoder=nn.Linear(5, 8), decoder=nn.Linear(8, 5), dim=8, codebook_size=16,
                                       pop_size=12), (2, 12, 5)),
    "binary-mapper": ("BinaryMapper", dict(bits=5), None),  # no state: the generator alone
}
# What a forward of each case returns is compared after a load; the rest (no state, outputs drawn) are built only.
LOADABLE = [case for case, (_, _, shape) in CASES.items() if shape is not None and case != "evo-lfq"]


def build(library, case, seed=0):
    cls, options, _ = CASES[case]
    torch.manual_seed(seed)
    return getattr(library, cls)(**(options() if callable(options) else options))


def call(module, x):
    """(output or None, indices, [losses]) of a forward; RandomProjectionQuantizer returns indices alone."""
    result = module(x)
    if torch.is_tensor(result):
        return None, result, []
    out, indices, *losses = result
    return out, indices, losses


def train_steps(module, case, steps=2):
    """Training steps as a project runs them: forward on an input that needs a gradient, backward of the
    output and every loss, so that codebooks, statistics and k-means move."""
    module.train()
    shape = CASES[case][2]
    generator = torch.Generator().manual_seed(7)
    for _ in range(steps):
        x = torch.randn(shape, generator=generator).requires_grad_(True)
        out, _, losses = call(module, x)
        if out is None:  # nothing to train
            continue
        total = out.sum()
        for loss in losses:
            if torch.is_tensor(loss):
                total = total + loss.sum()
        total.backward()


def evaluated(module, case):
    module.eval()
    x = torch.randn(CASES[case][2], generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        out, indices, _ = call(module, x)
    return out, indices


def assert_same_indices(indices, expected):
    """Indices as a tensor, or a list of tensors (HierarchicalVQ's levels), equal."""
    if torch.is_tensor(expected):
        indices, expected = [indices], [expected]
    assert len(indices) == len(expected) and all(torch.equal(a, b.to(a.dtype)) for a, b in zip(indices, expected))


def layout(state):
    return {key: (tuple(value.shape), value.dtype) for key, value in state.items()}


@pytest.mark.parametrize("case", CASES)
def test_the_same_seed_builds_the_same_model_and_leaves_the_generator_where_the_reference_does(case):
    reference = build(vqp, case, seed=5)
    after_reference = torch.get_rng_state()
    ours = build(lockstep, case, seed=5)
    assert torch.equal(torch.get_rng_state(), after_reference), f"{case}: the global generator moved otherwise"
    expected, got = reference.state_dict(), ours.state_dict()
    assert layout(got) == layout(expected)
    for key, value in expected.items():
        if expected.get(key + "_needs_init", False):  # the reference's torch.empty: memory, not a value
            continue
        assert torch.equal(got[key], value), f"{case}: {key} differs"


@pytest.mark.parametrize("case", LOADABLE)
def test_a_reference_checkpoint_loads_strictly_and_quantizes_alike(case):
    reference = build(vqp, case)
    train_steps(reference, case)
    ours = build(lockstep, case, seed=1)
    ours.load_state_dict(reference.state_dict(), strict=True)
    out_ref, indices_ref = evaluated(reference, case)
    out, indices = evaluated(ours, case)
    assert_same_indices(indices, indices_ref)
    if out is not None:
        torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", LOADABLE)
def test_a_lockstep_checkpoint_loads_strictly_into_the_reference_and_quantizes_alike(case):
    ours = build(lockstep, case)
    train_steps(ours, case)
    reference = build(vqp, case, seed=1)
    if CASES[case][1].get("affine_param"):  # the reference registers its batch statistics in its first training
        train_steps(reference, case, steps=1)  # forward: its own checkpoints load only into such a module too
    state = ours.state_dict()
    assert layout(state) == layout(reference.state_dict())
    reference.load_state_dict(state, strict=True)
    out, indices = evaluated(ours, case)
    out_ref, indices_ref = evaluated(reference, case)
    assert_same_indices(indices, indices_ref)
    if out is not None:
        torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)


def test_checkpoints_load_strictly_inside_a_project_model_both_ways():
    class Tokenizer(nn.Module):  # a project's model: the quantizer is one submodule among others
        def __init__(self, library):
            super().__init__()
            self.encoder = nn.Linear(4, 8)
            self.quantizers = library.LFQ(dim=8, codebook_size=16)

    reference, ours = Tokenizer(vqp), Tokenizer(lockstep)
    ours.load_state_dict(reference.state_dict(), strict=True)
    reference.load_state_dict(ours.state_dict(), strict=True)
    assert "quantizers.mask" in ours.state_dict()


def test_a_reference_checkpoint_of_another_configuration_is_refused_by_name():
    state = vqp.LFQ(codebook_size=2**4).state_dict()  # its mask says 4 bits
    with pytest.raises(RuntimeError, match="mask"):
        lockstep.LFQ(codebook_size=2**5).load_state_dict(state)


def noisy_fsq(seed=None):
    return lockstep.FSQ(levels=[7, 5, 5], preserve_symmetry=True, noise_dropout=0.5, seed=seed)


def two_steps_then_state(module):
    x = torch.randn(2, 40, 3, generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        module(x.clone().requires_grad_(True))[0].sum().backward()  # the step advances in backward
    return x


def test_seed_and_step_ride_in_the_metadata_and_a_resumed_module_draws_on_with_torch_save():
    fsq = noisy_fsq(seed=3)
    x = two_steps_then_state(fsq)
    state = fsq.state_dict()
    assert set(state) == set(vqp.FSQ(levels=[7, 5, 5], preserve_symmetry=True, noise_dropout=0.5).state_dict())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    resumed = noisy_fsq()
    resumed.load_state_dict(torch.load(buffer), strict=True)  # weights_only, as torch.load's default
    assert (resumed.seed, resumed.step) == (3, 2)
    expected = fsq(x.clone().requires_grad_(True))[0]
    assert torch.equal(resumed(x.clone().requires_grad_(True))[0], expected)  # step 2's noise, not step 0's
    assert not torch.equal(noisy_fsq(seed=3)(x.clone().requires_grad_(True))[0], expected)


def test_a_resumed_module_draws_on_with_safetensors(tmp_path):
    fsq = noisy_fsq(seed=3)
    x = two_steps_then_state(fsq)
    path = tmp_path / "model.safetensors"
    lockstep.save_model(fsq, path)
    resumed = noisy_fsq()
    lockstep.load_model(resumed, path)
    assert (resumed.seed, resumed.step) == (3, 2)
    assert torch.equal(resumed(x.clone().requires_grad_(True))[0], fsq(x.clone().requires_grad_(True))[0])
    # The file is a plain safetensors file of the reference's keys: the reference loads it as it is.
    from safetensors.torch import load_file
    vqp.FSQ(levels=[7, 5, 5], preserve_symmetry=True, noise_dropout=0.5).load_state_dict(load_file(path), strict=True)


def test_a_checkpoint_written_by_an_earlier_lockstep_still_loads():
    fsq = noisy_fsq(seed=3)
    two_steps_then_state(fsq)
    state = fsq.state_dict()
    state["_extra_state"] = torch.tensor([3, 2], dtype=torch.int64)  # how (seed, step) travelled before
    resumed = noisy_fsq()
    resumed.load_state_dict(dict(state), strict=True)
    assert (resumed.seed, resumed.step) == (3, 2)


def test_a_reference_checkpoint_keeps_the_modules_own_seed_and_step():
    ours = noisy_fsq(seed=4)
    two_steps_then_state(ours)
    ours.load_state_dict(vqp.FSQ(levels=[7, 5, 5], preserve_symmetry=True, noise_dropout=0.5).state_dict())
    assert (ours.seed, ours.step) == (4, 2)
