"""Padded sequences (`mask` and `lens`), as audio codecs train on them: beside vector-quantize-pytorch
over training steps, against the same tokens packed without padding, and on 2 processes where one
rank's batch is all padding."""
import pytest
import torch
from vector_quantize_pytorch import ResidualVQ as ReferenceResidualVQ
from vector_quantize_pytorch import VectorQuantize as ReferenceVQ

import lockstep
from ranks import run_ranks

LENS = torch.tensor([9, 4, 0, 6])  # an item of padding only among them


def _mask(lens, n):
    return torch.arange(n) < lens[:, None]


def _step_pair(reference, ours, x, weights, **kwargs):
    """One training step of each module on x with `kwargs` (mask or lens); returns their results."""
    results = []
    for module in (reference, ours):
        xi = x.clone().requires_grad_(True)
        out, idx, loss = module(xi, **kwargs)
        ((out * weights).sum() + loss.sum()).backward()
        results.append((out.detach(), idx, loss.detach(), xi.grad))
    return results


# With heads the reference's masked commitment loss compares the heads' codes with the whole input (a
# broadcast, or a shape error); lockstep's is the unmasked formula over the tokens that count. Those
# are compared without the loss (weight 0): output, indices, input gradient, codebooks.
VQ_OPTIONS = [dict(), dict(rotation_trick=False), dict(decay=0.5, commitment_weight=0.3),
              dict(heads=2, separate_codebook_per_head=True, codebook_dim=4, commitment_weight=0.0)]


@pytest.mark.parametrize("options", VQ_OPTIONS)
@pytest.mark.parametrize("by", ["mask", "lens"])
def test_a_masked_vq_trains_as_the_reference_does(options, by):
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=8, codebook_size=16, **options)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, **options)
    ours.load_reference_state_dict(reference.state_dict())
    mask = _mask(LENS, 9)
    for step in range(3):
        x = torch.randn(4, 9, 8)
        weights = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
        given = dict(mask=mask) if by == "mask" else dict(lens=LENS)
        (out_r, idx_r, loss_r, grad_r), (out, idx, loss, grad) = _step_pair(reference, ours, x, weights, **given)
        assert torch.equal(idx, idx_r.to(idx.dtype)), step
        assert bool((idx[~mask] == -1).all()) and bool((out[~mask] == 0).all())
        torch.testing.assert_close(out, out_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, loss_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad, grad_r, atol=1e-5, rtol=1e-5)
        for key in ("_codebook.embed", "_codebook.cluster_size", "_codebook.embed_avg"):
            torch.testing.assert_close(ours.state_dict()[key], reference.state_dict()[key], atol=1e-5, rtol=1e-5,
                                       msg=lambda m, key=key: f"step {step}, {key}: {m}")


@pytest.mark.parametrize("zeros", [True, False])
def test_a_masked_residual_vq_trains_as_the_reference_does(zeros):
    torch.manual_seed(1)
    reference = ReferenceResidualVQ(dim=8, codebook_size=16, num_quantizers=3, return_zeros_for_masked_padding=zeros)
    ours = lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=3, return_zeros_for_masked_padding=zeros)
    ours.load_reference_state_dict(reference.state_dict())
    mask = _mask(LENS, 9)
    for step in range(3):
        x = torch.randn(4, 9, 8)
        weights = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
        (out_r, idx_r, loss_r, grad_r), (out, idx, loss, grad) = _step_pair(reference, ours, x, weights, mask=mask)
        assert torch.equal(idx, idx_r.to(idx.dtype)), step
        assert bool((idx[~mask] == -1).all())
        torch.testing.assert_close(out[~mask], torch.zeros_like(x[~mask]) if zeros else x[~mask])
        torch.testing.assert_close(out, out_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, loss_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad, grad_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.codebooks, reference.codebooks, atol=1e-5, rtol=1e-5)


def test_return_zeros_for_masked_padding_false_passes_the_input_through_as_the_reference():
    torch.manual_seed(2)
    reference = ReferenceVQ(dim=8, codebook_size=16, return_zeros_for_masked_padding=False)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, return_zeros_for_masked_padding=False)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(4, 9, 8)
    weights = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
    (out_r, _, _, grad_r), (out, _, _, grad) = _step_pair(reference, ours, x, weights, lens=LENS)
    mask = _mask(LENS, 9)
    assert torch.equal(out[~mask], x[~mask])
    torch.testing.assert_close(out, out_r, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, grad_r, atol=1e-5, rtol=1e-5)


def _packed_and_padded(make, steps=3):
    """The same module trained on padded batches and on their valid tokens packed into one sequence."""
    padded, packed = make(), make()
    packed.load_state_dict(padded.state_dict())
    mask = _mask(LENS, 9)
    for step in range(steps):
        x = torch.randn(4, 9, 8) * 2
        out, idx, loss = padded(x, mask=mask)
        (out.sum() + loss.sum()).backward()
        out_p, idx_p, loss_p = packed(x[mask].unsqueeze(0))
        (out_p.sum() + loss_p.sum()).backward()
        assert torch.equal(idx[mask], idx_p[0]), step
        torch.testing.assert_close(out[mask], out_p[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(loss, loss_p, atol=1e-6, rtol=1e-6)
    return padded, packed


@pytest.mark.parametrize("make", [
    lambda: lockstep.VectorQuantize(dim=8, codebook_size=64, kmeans_init=True, threshold_ema_dead_code=2, seed=3),
    lambda: lockstep.VectorQuantize(dim=8, codebook_size=16, heads=2, seed=4),
    lambda: lockstep.ResidualVQ(dim=8, codebook_size=32, num_quantizers=2, kmeans_init=True,
                                threshold_ema_dead_code=1, quantize_dropout=True, seed=5),
], ids=["vq-kmeans-dead-codes", "vq-shared-heads", "rvq-kmeans-dead-codes-dropout"])
def test_padding_counts_in_no_statistic(make):
    """k-means, the EMA and dead-code replacement see exactly the valid tokens: padded batches train
    the codebooks as the valid tokens packed without padding do (the draws included)."""
    padded, packed = _packed_and_padded(make)
    for key, value in padded.state_dict().items():
        torch.testing.assert_close(value, packed.state_dict()[key], atol=1e-6, rtol=1e-6, msg=lambda m, key=key: f"{key}: {m}")


def test_a_batch_of_padding_only_changes_no_statistic_and_has_a_zero_loss():
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.5)
    before = {k: v.clone() for k, v in vq.state_dict().items()}
    x = torch.randn(2, 5, 8, requires_grad=True)
    out, idx, loss = vq(x, lens=torch.tensor([0, 0]))
    (out.sum() + loss).backward()
    assert float(loss.detach()) == 0.0 and bool((idx == -1).all()) and bool((out == 0).all())
    assert torch.equal(x.grad, torch.zeros_like(x))
    # The EMA still decays toward this call's (empty) statistics, as the reference's does.
    assert torch.equal(vq.state_dict()["_codebook.cluster_size"], before["_codebook.cluster_size"] * 0.5)
    reference = ReferenceVQ(dim=8, codebook_size=16, decay=0.5)
    _, _, loss_r = reference(x.detach(), lens=torch.tensor([0, 0]))
    assert torch.isnan(loss_r)  # the reference's mean over no token (a deliberate difference)


def test_bad_masks_are_errors_naming_what_is_wrong():
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="not both"):
        vq(x, mask=torch.ones(2, 5, dtype=torch.bool), lens=torch.tensor([5, 5]))
    with pytest.raises(ValueError, match=r"mask must be bool of shape \(b, n\) = \(2, 5\)"):
        vq(x, mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        vq(x, mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="lens must hold one integer length per item"):
        vq(x, lens=torch.tensor([5.0, 2.0]))
    with pytest.raises(ValueError, match=r"for tokens \(b, n, dim\)"):
        lockstep.VectorQuantize(dim=8, codebook_size=16, accept_image_fmap=True)(
            torch.randn(2, 8, 3, 3), mask=torch.ones(2, 9, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):  # as the reference's, FSQ takes none
        lockstep.FSQ(levels=[5, 5], dim=8)(x, mask=torch.ones(2, 5, dtype=torch.bool))


def test_a_masked_vq_compiles():
    torch.manual_seed(5)
    eager = lockstep.VectorQuantize(dim=8, codebook_size=16, seed=1)
    compiled = lockstep.VectorQuantize(dim=8, codebook_size=16, seed=1)
    compiled.load_state_dict(eager.state_dict())
    run = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    mask = _mask(LENS, 9)
    for _ in range(2):
        x = torch.randn(4, 9, 8)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        out, idx, loss = eager(xs[0], mask=mask)
        out_c, idx_c, loss_c = run(xs[1], mask=mask)
        (out.sum() + loss).backward()
        (out_c.sum() + loss_c).backward()
        assert torch.equal(idx, idx_c)
        torch.testing.assert_close(out_c, out)
        torch.testing.assert_close(xs[1].grad, xs[0].grad)
    assert torch.equal(compiled.state_dict()["_codebook.embed"], eager.state_dict()["_codebook.embed"])


def _masked_ranks(rank, world, x, lens, initial):
    vq = lockstep.VectorQuantize(dim=8, codebook_size=32, decay=0.9, threshold_ema_dead_code=1.5, seed=7)
    vq.load_state_dict(initial)
    part, part_lens = x.chunk(world, dim=1)[rank], lens.chunk(world, dim=1)[rank]
    for step in range(3):
        out, _, loss = vq(part[step], lens=part_lens[step])
        (out.sum() + loss).backward()  # the EMA and dead codes, reduced over the ranks, ride on backward
    return {k: v for k, v in vq.state_dict().items() if k.startswith("_codebook")}


def test_ranks_whose_batch_is_all_padding_stay_identical_and_equal_one_process():
    x = torch.randn(3, 4, 10, 8)  # 3 steps of 4 sequences; rank r holds sequences 2r, 2r + 1
    lens = torch.tensor([[10, 7, 0, 0], [3, 10, 0, 0], [0, 0, 5, 2]])  # a rank of padding only, each step
    one = lockstep.VectorQuantize(dim=8, codebook_size=32, decay=0.9, threshold_ema_dead_code=1.5, seed=7)
    initial = {k: v.clone() for k, v in one.state_dict().items()}
    for step in range(3):
        out, _, loss = one(x[step], lens=lens[step])
        (out.sum() + loss).backward()
    states = run_ranks(2, _masked_ranks, x, lens, initial)
    for key, value in states[0].items():
        assert torch.equal(value, states[1][key]), key  # the ranks never diverge
        torch.testing.assert_close(value, one.state_dict()[key], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options", [dict(entropy_loss_weight=0.1, commitment_loss_weight=0.25),
                                     dict(num_codebooks=2, commitment_loss_weight=1.0, dim=10),
                                     dict(spherical=True, diversity_gamma=0.5, commitment_loss_weight=0.5)],
                         ids=["weights", "two_codebooks_projected", "spherical"])
def test_a_masked_lfq_trains_as_the_reference_does(options):
    """Output and indices as the reference's masked forward (padding quantized as any token); the loss
    and gradients as its unmasked formula over the valid tokens packed into one sequence. Its masked
    entropy is not that: indexing by the mask merges the codebook axis into the token axis, so its
    "batch" entropy averages nothing and equals the per-sample one (a deliberate difference)."""
    from vector_quantize_pytorch import LFQ as ReferenceLFQ

    torch.manual_seed(3)
    dim = options.pop("dim", 4)
    reference = ReferenceLFQ(dim=dim, codebook_size=16, **options)
    ours = lockstep.LFQ(dim=dim, codebook_size=16, **options)
    ours.load_reference_state_dict(reference.state_dict())
    mask = _mask(LENS, 9)
    for step in range(3):  # the projections, when there are some, are not stepped (padding reaches their gradient)
        _against_packed_reference(reference, ours, torch.randn(4, 9, dim), mask, step)
        for module in (reference, ours):
            module.zero_grad()


def _against_packed_reference(reference, ours, x, mask, step):
    weights = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
    (out_r, idx_r, loss_masked_r, grad_masked_r), (out, idx, loss, grad) = _step_pair(reference, ours, x, weights,
                                                                                      mask=mask)
    assert torch.equal(idx, idx_r.to(idx.dtype)), step  # padding quantized as any token, as there
    torch.testing.assert_close(out, out_r, atol=1e-5, rtol=1e-5)
    for module in (reference, ours):
        module.zero_grad()
    packed = x[mask].unsqueeze(0).requires_grad_(True)
    out_p, _, loss_p = reference(packed)
    ((out_p * weights[mask].unsqueeze(0)).sum() + loss_p.sum()).backward()
    torch.testing.assert_close(loss, loss_p.detach(), atol=1e-5, rtol=1e-5)
    # Valid tokens: the packed gradient; padding: only the output's (the reference's masked one there).
    expected = grad_masked_r.clone()
    expected[mask] = packed.grad[0]
    torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)
    return loss_masked_r


def test_a_masked_residual_lfq_trains_as_the_reference_does():
    from vector_quantize_pytorch import ResidualLFQ as ReferenceResidualLFQ

    torch.manual_seed(4)
    options = dict(dim=6, codebook_size=16, num_quantizers=2, commitment_loss_weight=0.5)
    reference = ReferenceResidualLFQ(**options)
    ours = lockstep.ResidualLFQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    loss_masked_r = _against_packed_reference(reference, ours, torch.randn(4, 9, 6), _mask(LENS, 9), 0)
    assert loss_masked_r.shape == (2,)


def test_a_strided_or_broadcast_mask_is_read_as_its_values():
    lfq = lockstep.LFQ(dim=4, codebook_size=16, frac_per_sample_entropy=0.5, seed=2)
    x = torch.randn(2, 6, 4, requires_grad=True)  # a backward may follow: the step waits, every call draws alike
    wide = torch.ones(2, 12, dtype=torch.bool)
    wide[:, 1::2] = False  # every other column False: the strided view below is all True
    for mask in (wide[:, ::2], torch.tensor(True).expand(2, 6)):
        _, _, loss = lfq(x, mask=mask)
        _, _, expected = lfq(x, mask=mask.contiguous())
        torch.testing.assert_close(loss, expected)
        _, _, unmasked = lfq(x)
        torch.testing.assert_close(loss, unmasked)


def test_freeze_codebook_with_a_learnable_codebook_is_refused_under_compile():
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16, learnable_codebook=True, ema_update=False)
    run = torch.compile(vq, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="freeze_codebook with a learnable codebook"):
        run(torch.randn(2, 5, 8), freeze_codebook=True)


def test_lfq_padding_counts_in_no_loss():
    lfq = lockstep.LFQ(dim=4, codebook_size=16, commitment_loss_weight=0.5)
    mask = _mask(LENS, 9)
    x = torch.randn(4, 9, 4)
    _, _, loss = lfq(x, mask=mask)
    _, _, packed = lfq(x[mask].unsqueeze(0))
    torch.testing.assert_close(loss, packed, atol=1e-6, rtol=1e-6)
    _, _, other = lfq(torch.where(mask.unsqueeze(-1), x, 100.0), mask=mask)  # whatever the padding holds
    torch.testing.assert_close(other, loss, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match=r"a mask of a map is \(b,\) or \(b, ...\) = \(2, 3, 3\); got \(2, 9\)"):
        lfq(torch.randn(2, 4, 3, 3), mask=torch.ones(2, 9, dtype=torch.bool))
    maps = torch.randn(2, 4, 3, 3)  # a map's positions (b, h, w) count as its tokens
    position_mask = torch.rand(2, 3, 3) > 0.5
    _, _, of_positions = lfq(maps, mask=position_mask)
    _, _, of_tokens = lfq(maps.movedim(1, -1).reshape(2, 9, 4), mask=position_mask.reshape(2, 9))
    torch.testing.assert_close(of_positions, of_tokens)


def _lfq_masked_ranks(rank, world, x, lens):
    lfq = lockstep.LFQ(dim=4, codebook_size=16, commitment_loss_weight=0.5, seed=1)
    part, part_lens = x.chunk(world)[rank], lens.chunk(world)[rank]
    xi = part.clone().requires_grad_(True)
    _, _, loss = lfq(xi, mask=_mask(part_lens, x.shape[1]))
    loss.backward()  # the entropy's statistics are summed over the ranks here
    return xi.grad


def test_lfq_over_ranks_with_a_rank_of_padding_only_gives_one_process_s_gradients():
    x = torch.randn(4, 9, 4) * 0.05  # small: the entropy's gradient is not ~0 for most tokens
    lens = torch.tensor([9, 5, 0, 0])  # rank 1 holds padding only
    grads = {}
    for weight in (0.5, 0.0):
        lfq = lockstep.LFQ(dim=4, codebook_size=16, commitment_loss_weight=weight, seed=1)
        xi = x.clone().requires_grad_(True)
        _, _, loss = lfq(xi, mask=_mask(lens, 9))
        loss.backward()
        grads[weight] = xi.grad
    entropy = grads[0.0]
    ranks = run_ranks(2, _lfq_masked_ranks, x, lens)
    # The entropy's gradient is of the global batch's valid tokens, the world size times one process's
    # (DDP averages it back, docs/python/vq.md); the commitment loss is rank 0's mean over its valid
    # tokens, which are all the valid tokens here.
    assert entropy.abs().max() > 1e-3
    torch.testing.assert_close(ranks[0], grads[0.5][:2] + entropy[:2], atol=1e-6, rtol=1e-5)
    assert torch.equal(ranks[1], torch.zeros_like(ranks[1]))  # padding gets no gradient


def test_a_masked_grouped_residual_vq_trains_as_the_reference_does():
    from vector_quantize_pytorch import GroupedResidualVQ as ReferenceGroupedResidualVQ

    torch.manual_seed(6)
    options = dict(dim=8, groups=2, num_quantizers=2, codebook_size=16)
    reference = ReferenceGroupedResidualVQ(**options)
    ours = lockstep.GroupedResidualVQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    mask = _mask(LENS, 9)
    for step in range(2):
        x = torch.randn(4, 9, 8)
        weights = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
        (out_r, idx_r, loss_r, grad_r), (out, idx, loss, grad) = _step_pair(reference, ours, x, weights, mask=mask)
        assert torch.equal(idx, idx_r.to(idx.dtype)), step
        assert bool((idx[:, ~mask] == -1).all())
        torch.testing.assert_close(out, out_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, loss_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad, grad_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.codebooks, reference.codebooks, atol=1e-5, rtol=1e-5)
