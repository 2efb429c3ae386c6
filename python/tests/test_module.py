"""What every lockstep module does as a torch.nn.Module: its tensors stay the ones liblockstep
computes with through .to(), casts, deep copies and pickling; reference state dicts load through one
helper; (seed, step) resume; the reference's positional arguments keep their meaning."""
import copy

import pytest
import torch
from vector_quantize_pytorch import LFQ as ReferenceLFQ

import lockstep


def test_casting_keeps_the_quantizer_in_float32_and_its_tensors_shared():
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16)
    fsq = lockstep.FSQ(levels=[5, 5, 5], dim=8)
    for module in (vq, fsq):
        module.to(torch.bfloat16)
    assert vq._codebook.embed.dtype == torch.float32 and fsq.project_in.weight.dtype == torch.float32
    assert vq._codebook.embed.data_ptr() == vq._core.buffers()["embed"].data_ptr()
    assert fsq.project_in.weight.data_ptr() == fsq._core.parameters()["project_in.weight"].data_ptr()
    x = torch.randn(2, 10, 8, dtype=torch.bfloat16)
    out, _, _ = vq(x)
    assert out.dtype == torch.bfloat16  # the input's dtype back, as the reference
    assert fsq(x)[0].dtype == torch.bfloat16


def test_a_device_the_tensors_cannot_follow_to_is_named():
    # CUDA moves are checked by bench/gpu_check.sh; here, a device whose tensors cannot share storage.
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16)
    with pytest.raises(RuntimeError, match="meta"):
        vq.to("meta")


def test_a_reference_state_dict_of_another_configuration_is_refused_by_name():
    state = ReferenceLFQ(codebook_size=2**4).state_dict()  # its mask says 4 bits
    with pytest.raises(RuntimeError, match="mask"):
        lockstep.LFQ(codebook_size=2**5).load_reference_state_dict(state)
    state = lockstep.FSQ(levels=[5, 5], dim=6).state_dict()
    with pytest.raises(RuntimeError, match="project_in.weight"):
        lockstep.FSQ(levels=[5, 5], dim=8).load_reference_state_dict(state)


def test_positional_arguments_mean_what_they_mean_to_the_reference():
    vq = lockstep.VectorQuantize(8, 16, 4)  # codebook_dim=4, not a seed
    assert vq._codebook.embed.shape[-1] == 4
    fsq = lockstep.FSQ([8, 5, 5, 5], 4, 1, True)  # keep_num_codebooks_dim=True
    assert fsq(torch.randn(2, 3, 4))[1].shape == (2, 3, 1)


def test_a_resumed_module_draws_on_from_where_it_stopped():
    fsq = lockstep.FSQ(levels=[7, 5, 5], preserve_symmetry=True, noise_dropout=0.5, seed=3)
    x = torch.randn(2, 40, 3)
    for _ in range(2):
        fsq(x.clone().requires_grad_(True))[0].sum().backward()  # a step: the step counter advances in backward
    state = fsq.state_dict()
    assert state._metadata[""]["lockstep"] == (3, 2)  # (seed, step), in the metadata: no key of its own
    resumed = lockstep.FSQ(levels=[7, 5, 5], preserve_symmetry=True, noise_dropout=0.5)
    resumed.load_state_dict(state)
    fresh = lockstep.FSQ(levels=[7, 5, 5], preserve_symmetry=True, noise_dropout=0.5, seed=3)
    expected = fsq(x)[0]
    assert torch.equal(resumed(x)[0], expected)  # the noise of step 2, not step 0's again
    assert not torch.equal(fresh(x)[0], expected)


@pytest.mark.parametrize("make", [lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, kmeans_init=True),
                                  lambda: lockstep.ResidualFSQ(levels=[5, 5, 5], num_quantizers=2, dim=8),
                                  lambda: lockstep.LFQ(dim=8, codebook_size=2**4)])
def test_copies_are_whole_and_independent(make, tmp_path):
    module = make()
    x = torch.randn(2, 30, 8)
    module(x.clone().requires_grad_(True))[0].sum().backward()  # a training step: k-means and EMA move the codebook
    copied = copy.deepcopy(module)  # an EMA of the weights starts this way
    torch.save(module, tmp_path / "module.pt")
    loaded = torch.load(tmp_path / "module.pt", weights_only=False)
    for other in (copied, loaded):
        assert other.state_dict().keys() == module.state_dict().keys()
        for key, value in module.state_dict().items():
            assert torch.equal(other.state_dict()[key], value) if torch.is_tensor(value) else \
                other.state_dict()[key] == value, key
        held = {**other._core.parameters(), **other._core.buffers()}
        assert {t.data_ptr() for t in held.values()} == \
            {t.data_ptr() for t in list(other.parameters()) + list(other.buffers())}  # liblockstep's own
    expected = module(x)
    assert torch.equal(copied(x)[0], expected[0]) and torch.equal(loaded(x)[0], expected[0])
    with torch.no_grad():  # the copy's state is its own: the module still equals the other copy
        for tensor in list(copied.parameters()) + list(copied.buffers()):
            tensor.add_(1)
    assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), loaded.state_dict().values())
               if torch.is_tensor(a))


def test_autocast_leaves_the_quantizer_in_float32():
    # Under torch.autocast to bfloat16 the quantizer still chooses codes from float32 distances: the
    # same indices and output as without autocast, for bfloat16 input as well.
    torch.manual_seed(0)
    vq = lockstep.VectorQuantize(dim=16, codebook_size=256).eval()
    x = torch.randn(4, 512, 16)
    with torch.no_grad():
        plain, plain_indices, _ = vq(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed, mixed_indices, _ = vq(x)
            from_bf16, bf16_indices, _ = vq(x.bfloat16())
    assert mixed.dtype == torch.float32
    assert torch.equal(mixed_indices, plain_indices)
    assert torch.equal(mixed, plain)
    assert torch.equal(bf16_indices, vq(x.bfloat16().float())[1])


def test_the_bindings_refuse_an_undeclared_or_out_of_range_option_by_name():
    # The options a module hands liblockstep are held to their declarations (quant/option_specs.h),
    # as the configuration's keys are: nothing misspelt is silently left unread.
    with pytest.raises(ValueError, match="unknown quantizer option 'vq.decayy'"):
        lockstep._C.make_quantizer("vq", "vq", {"dim": 4, "codebook_size": 8, "decayy": 0.5})
    with pytest.raises(ValueError, match=r"decay = 1.5 must be in \[0, 1\]"):  # the library's limit
        lockstep.VectorQuantize(dim=4, codebook_size=8, decay=1.5)
    assert lockstep.FSQ(levels=[512, 8]).codebook_size == 4096  # beyond the CLI's limits, within the library's
    with pytest.raises(ValueError, match="'fsp.activation' = \"relu\" is not one of"):
        lockstep.FSP(levels=[5, 5], act_name="relu")


REFERENCE_TWINS = {
    "VectorQuantize": dict(dim=8, codebook_size=16),
    "VectorQuantize-affine": dict(dim=8, codebook_size=16, affine_param=True),
    "ResidualVQ": dict(dim=8, codebook_size=16, num_quantizers=2),
    "LFQ": dict(dim=8, codebook_size=16),
    "ResidualLFQ": dict(dim=8, codebook_size=16, num_quantizers=2),
    "GroupedResidualLFQ": dict(dim=8, codebook_size=16, num_quantizers=2, groups=2),
    "ResidualFSQ": dict(levels=[5, 5, 5], num_quantizers=2, dim=8),
}


@pytest.mark.parametrize("name", REFERENCE_TWINS)
@pytest.mark.parametrize("trained", [False, True])
def test_reference_state_dict_loads_into_the_reference_module(name, trained):
    import vector_quantize_pytorch
    cls = name.split("-")[0]
    ours = getattr(lockstep, cls)(**REFERENCE_TWINS[name])
    reference = getattr(vector_quantize_pytorch, cls)(**REFERENCE_TWINS[name])
    x = torch.randn(2, 6, 8)
    if trained:  # statistics moved by training steps; the reference's affine buffers exist after a forward
        for _ in range(2):
            out, _, *losses = ours(x.clone().requires_grad_(True))
            (out.sum() + sum(loss.sum() for loss in losses)).backward()
        reference(x)
    state = lockstep.reference_state_dict(ours)
    assert "_extra_state" not in " ".join(state)
    reference.load_state_dict(state, strict=True)  # every entry the reference has, and no other
    ours.eval()
    reference.eval()
    if trained or name != "VectorQuantize-affine":  # untrained, the reference's evaluation takes the batch's statistics
        with torch.no_grad():
            assert torch.allclose(ours(x)[0], reference(x)[0], atol=1e-5)
    # And back: the reference's state loads into a fresh lockstep module that then quantizes alike.
    back = getattr(lockstep, cls)(**REFERENCE_TWINS[name])
    back.load_reference_state_dict(reference.state_dict())
    with torch.no_grad():
        assert torch.equal(back.eval()(x)[0], ours(x)[0])


def test_reference_state_dict_converts_a_quantizer_under_every_name_a_model_gives_it():
    import vector_quantize_pytorch
    lfq = lockstep.LFQ(dim=8, codebook_size=16)
    state = lockstep.reference_state_dict(torch.nn.ModuleDict({"a": lfq, "b": lfq}))
    twin = vector_quantize_pytorch.LFQ(dim=8, codebook_size=16)
    torch.nn.ModuleDict({"a": twin, "b": twin}).load_state_dict(state, strict=True)


def test_a_module_pickled_by_an_earlier_lockstep_loads_and_quantizes():
    # What a module pickled before state_dict() took the reference's layout held: no state-dict hook, none of
    # the whole-step bookkeeping.
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16)
    state = vq.__getstate__()
    state["_state_dict_hooks"] = type(state["_state_dict_hooks"])()
    for name in ("update_in_forward", "_unbackwarded", "_warned_unbackwarded", "_drawn_at", "_ema_held"):
        state.pop(name)
    old = lockstep.VectorQuantize.__new__(lockstep.VectorQuantize)
    old.__setstate__(state)
    with torch.no_grad():
        old(torch.randn(2, 5, 8))
    assert old.step == 1 and old.state_dict()["_codebook.initted"].dtype == torch.bool
