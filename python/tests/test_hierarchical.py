"""lockstep.HierarchicalVQ beside vector_quantize_pytorch.HierarchicalVQ from the same state and
inputs, its documented differences (a shared codebook's updates wait for backward; the nested-dropout
cutoff is drawn from (seed, step)), and on 2 real processes against one."""
import pytest
import torch
import torch.distributed as dist

import lockstep
from ranks import run_ranks, state_with_steps
from reference_steps import backward_and_compare_gradients

vqp = pytest.importorskip("vector_quantize_pytorch")

# Options the parity tests fix: the reference's k-means and dead-code samples come from torch's
# generator, lockstep's from (seed, step); both are tested on their own (test_vq.py, test_distributed.py).
FIXED = dict(kmeans_init=False, threshold_ema_dead_code=0)
CASES = {
    "sequence_separate_codebooks": (dict(dim=8, codebook_size=16, scales=[1, 2, 4], shared_codebook=False),
                                    (4, 8, 4), None),
    "image_channel_last_phi_per_level": (dict(dim=6, codebook_size=(8, 16, 16), scales=[1, (2, 2), (3, 4)],
                                              shared_codebook=False, accept_image_fmap=True, channel_first=False,
                                              share_quant_resi=0, decay=0.9), (3, 3, 4, 6), None),
    "masked_sequence_two_phis": (dict(dim=8, codebook_size=16, scales=[1, 3, 6], shared_codebook=False,
                                      share_quant_resi=2, commitment_weight=0.5), (4, 8, 6),
                                 torch.tensor([6, 4, 1, 0])),
    "volume_rotation_trick": (dict(dim=4, codebook_size=8, scales=[1, 2], shared_codebook=False, accept_3d_fmap=True,
                                   rotation_trick=True), (2, 4, 2, 2, 2), None),
}


def _pair(options, seed=0):
    torch.manual_seed(seed)
    reference = vqp.HierarchicalVQ(**FIXED, **options)
    ours = lockstep.HierarchicalVQ(**FIXED, **options)
    ours.load_reference_state_dict(reference.state_dict())
    return reference, ours


def _step(reference, ours, x, lens, optimizers, cutoffs=None):
    """One training step of both modules on x; asserts every result equal (1e-5) and returns ours's cutoff."""
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    out, idx, loss, cutoff = ours(xs[1], lens=lens, return_cutoff=True)
    if cutoffs is not None:  # the reference keeps the levels lockstep drew (its own draw is torch's generator)
        reference.sample_nested_cutoff = lambda device: cutoff
    out_ref, idx_ref, loss_ref = reference(xs[0], lens=lens)
    assert len(idx) == len(idx_ref)
    for level, (a, b) in enumerate(zip(idx, idx_ref)):
        assert torch.equal(a, b.long()), level
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    backward_and_compare_gradients(reference, ours, xs, out_ref, out, loss_ref, loss, optimizers)
    reference_state = reference.state_dict()
    for key, value in ours.state_dict().items():
        torch.testing.assert_close(value, reference_state[key], atol=1e-5, rtol=1e-5, msg=key)
    return cutoff


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_steps_match_the_reference(case):
    options, shape, lens = CASES[case]
    reference, ours = _pair(options)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, ours)]
    for _ in range(3):
        _step(reference, ours, torch.randn(*shape), lens, optimizers)


@pytest.mark.parametrize("commitment_weight", [1.0, 0.0])  # 0: no loss carries the dropped levels' graph
def test_nested_dropout_keeps_the_levels_it_draws_and_trains_the_dropped_ones_as_the_reference(commitment_weight):
    options = dict(dim=8, codebook_size=16, scales=[1, 2, 4, 8], shared_codebook=False, nested_dropout=0.8,
                   nested_dropout_min_levels=2, commitment_weight=commitment_weight, seed=5)
    reference, ours = _pair({k: v for k, v in options.items() if k != "seed"})
    ours = lockstep.HierarchicalVQ(**FIXED, **options)
    ours.load_reference_state_dict(reference.state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, ours)]
    cutoffs = [_step(reference, ours, torch.randn(3, 8, 8), None, optimizers, cutoffs=True) for _ in range(6)]
    assert {1, 2} & set(cutoffs), cutoffs  # some steps dropped levels (min 2 levels kept: cutoff 1 or 2)
    assert all(c is None or 1 <= c <= 2 for c in cutoffs), cutoffs
    # The draw is a pure function of (seed, step): a second module from the same seed draws the same.
    again = lockstep.HierarchicalVQ(**FIXED, **options)
    drawn = []
    for step in range(6):
        for vq in again.vqs:
            vq.step = step
        drawn.append(again.nested_cutoff())
    assert drawn == cutoffs
    again.eval()
    assert again.nested_cutoff() is None  # evaluation keeps every level


def test_a_shared_codebook_quantizes_every_level_with_the_step_s_codebook():
    # Deliberate difference: the reference updates its shared codebook in forward after each level, so
    # its later levels see the earlier levels' update; lockstep's updates wait for backward (a forward
    # never communicates), so every level of a training forward quantizes as the reference's evaluation.
    reference, ours = _pair(dict(dim=8, codebook_size=16, scales=[1, 2, 4]))
    x = torch.randn(4, 8, 4)
    reference.eval()
    out_ref, idx_ref, _ = reference(x)
    out, idx, loss = ours(x)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(a, b.long()) for a, b in zip(idx, idx_ref))
    before = ours.vq._codebook.embed.clone()
    (out.sum() + loss).backward()
    assert ours.vq.step == 3  # one update per level, applied in backward
    assert not torch.equal(ours.vq._codebook.embed, before)


def test_a_calls_sampling_temperature_reaches_every_level():
    # At 0 each level takes its nearest codes, as the reference's; at t it draws what levels made with t draw.
    options = dict(dim=6, codebook_size=8, scales=[1, 2, 4], shared_codebook=False, stochastic_sample_codes=True,
                   sample_codebook_temp=1.0)
    reference, ours = _pair(options)
    x = torch.randn(3, 6, 4)  # (b, dim, n)
    out_ref, idx_ref, _ = reference(x, sample_codebook_temp=0.0)
    out, idx, _ = ours(x, sample_codebook_temp=0.0)
    for a, b in zip(idx, idx_ref):
        assert torch.equal(a, b.long())
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    made_with = lockstep.HierarchicalVQ(**FIXED, **dict(options, sample_codebook_temp=5.0))
    made_with.load_state_dict(ours.state_dict())
    x = torch.randn(8, 6, 16)
    with torch.no_grad():
        expected = made_with(x)[1]
        assert all(torch.equal(a, b) for a, b in zip(ours(x, sample_codebook_temp=5.0)[1], expected))
        assert not all(torch.equal(a, b) for a, b in zip(ours(x)[1], expected))


def test_decoding_from_indices_matches_the_reference():
    options = dict(dim=6, codebook_size=8, scales=[1, (2, 2), (2, 4)], accept_image_fmap=True, shared_codebook=False)
    reference, ours = _pair(options)
    x = torch.randn(3, 6, 2, 4)
    mask = torch.rand(3, 2, 4) > 0.4
    mask[1] = False  # an item of padding only: index -1 at every level
    for module in (reference, ours):
        module.eval()
    out_ref, idx_ref, _ = reference(x, mask=mask)
    out, idx, _ = ours(x, mask=mask)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    assert (idx[0][1] == -1).all()
    torch.testing.assert_close(ours.get_output_from_indices(idx), reference.get_output_from_indices(idx_ref),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.get_output_from_indices(idx, full_shape=(4, 8)),
                               reference.get_output_from_indices(idx_ref, full_shape=(4, 8)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arguments, error, match", [
    (dict(scales=[2, 1]), ValueError, "non-decreasing"),
    (dict(scales=[1, 2], codebook_size=(8, 16)), ValueError, "shared codebook"),
    (dict(scales=[1, 2], codebook_size=(8, 16, 16), shared_codebook=False), ValueError, "2 scales"),
    (dict(scales=[1, (2, 2)]), ValueError, "spatial"),
    (dict(scales=[1, 2], nested_dropout=1.5), ValueError, "nested_dropout"),
    (dict(scales=[1, 2], accept_image_fmap=True, accept_3d_fmap=True), ValueError, "at most one"),
    (dict(scales=[1, 2], orthogonal_reg_weight=0.1, orthogonal_reg_max_codes=0), ValueError, "orthogonal_reg_max_codes"),
])
def test_bad_options_are_errors_naming_them(arguments, error, match):
    with pytest.raises(error, match=match):
        lockstep.HierarchicalVQ(**{"dim": 4, "codebook_size": 8, **arguments})


def test_bad_inputs_are_errors_naming_them():
    hvq = lockstep.HierarchicalVQ(dim=4, codebook_size=8, scales=[1, 2], kmeans_init=False)
    with pytest.raises(ValueError, match="dim=4"):
        hvq(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="mask must be bool of shape"):
        hvq(torch.randn(2, 4, 4), mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="not both"):
        hvq(torch.randn(2, 4, 4), mask=torch.ones(2, 4, dtype=torch.bool), lens=torch.tensor([4, 4]))
    with pytest.raises(ValueError, match="get_output_from_indices"):
        hvq(torch.randn(2, 4, 4), indices=torch.zeros(2, 4, dtype=torch.long))
    image = lockstep.HierarchicalVQ(dim=4, codebook_size=8, scales=[1, 2], accept_image_fmap=True)
    with pytest.raises(ValueError, match="lens is for 1d"):
        image(torch.randn(2, 4, 2, 2), lens=torch.tensor([1, 2]))


OPTIONS = dict(dim=8, codebook_size=16, scales=[1, 2, 4], nested_dropout=0.6, seed=11)  # k-means and dead codes on


def _train(module, data, world, rank, extra_forward):
    """4 steps on this rank's part of each global batch: phi's gradients averaged over the ranks; the
    codebook's statistics are reduced by lockstep in backward. Returns the state and the cutoffs."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    cutoffs = []
    for step, x in enumerate(data):
        part = x.chunk(world)[rank]
        if extra_forward and step == 2:
            module(part + 1.0)  # a preview on this rank alone, in training mode: its graph is dropped
        out, _, loss, cutoff = module(part, return_cutoff=True)
        cutoffs.append(cutoff)
        # W x each rank's sum, averaged by the ranks, is the whole batch's sum
        (world * (out * torch.linspace(-1, 1, out.shape[-1])).sum() + loss).backward()
        if world > 1:
            for p in module.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        optimizer.step()
        optimizer.zero_grad()
    return state_with_steps(module), cutoffs


def _ranks(rank, world, data):
    return _train(lockstep.HierarchicalVQ(**OPTIONS, collective_timeout=20.0), data, world, rank,
                  extra_forward=rank == 0)


def test_two_ranks_stay_identical_and_equal_one_process_with_a_rank_s_extra_forward():
    data = torch.randn(4, 4, 8, 4, generator=torch.Generator().manual_seed(3))
    one, one_cutoffs = _train(lockstep.HierarchicalVQ(**OPTIONS), data, 1, 0, extra_forward=False)
    (state0, cutoffs0), (state1, cutoffs1) = run_ranks(2, _ranks, data)
    assert cutoffs0 == cutoffs1 == one_cutoffs
    assert any(c is not None for c in one_cutoffs), one_cutoffs
    for key, value in one.items():
        assert torch.equal(state0[key], state1[key]), key  # bit-identical ranks
        torch.testing.assert_close(state0[key], value, atol=1e-5, rtol=1e-5, msg=key)
