"""VectorQuantize's per-call arguments beside the reference (issue #38): forward's topk (each token's k best
codes, their per-token commitment losses), update_ema_indices (the EMA update with codes chosen elsewhere),
ema_update_weight (a tensor or a callable of the call's global statistics), accum_ema_update and
ema_update. lockstep's EMA update rides on backward (docs/python/distributed.md): each lockstep call below is
backwarded before its state is compared, the reference's state is read after its forward."""
import pytest
import torch
from vector_quantize_pytorch import VectorQuantize as ReferenceVQ

import lockstep


def _pair(**options):
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=16, codebook_size=32, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=32, **options)
    ours.load_reference_state_dict(reference.state_dict())
    return reference, ours


def _assert_state(reference, ours, keys=("embed", "embed_avg", "cluster_size")):
    for key in keys:
        torch.testing.assert_close(ours.state_dict()[f"_codebook.{key}"], reference.state_dict()[f"_codebook.{key}"],
                                   atol=1e-5, rtol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


def _order_of_tied_codes(idx, idx_ref, reference, x):
    """For each of lockstep's k codes (b, n, k), its slot in the reference's: the same codes in the same order,
    but for codes at the same distance to the token in float32 (the reference's torch.topk orders those as it
    likes; lockstep by index, so that its first is its nearest code, issue #47)."""
    order = torch.arange(idx.shape[2]).expand(idx.shape).clone()
    with torch.no_grad():
        tokens = reference.project_in(x).double()
        codes = reference._codebook.embed[0].double()
    for b, n in (idx != idx_ref).any(2).nonzero().tolist():
        ours, theirs = idx[b, n].tolist(), idx_ref[b, n].tolist()
        assert sorted(ours) == sorted(theirs), f"token ({b}, {n}): codes {ours}, the reference's {theirs}"
        distances = (tokens[b, n] - codes[ours]).pow(2).sum(1)
        for j, code in enumerate(ours):
            if code != theirs[j]:  # a code taken out of the reference's place: a tie with the code there
                there = distances[ours.index(theirs[j])]
                assert abs(distances[j] - there) <= 1e-6 * there, f"token ({b}, {n}): codes {ours}, {theirs}"
            order[b, n, j] = theirs.index(code)
    return order


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("options", [dict(), dict(use_cosine_sim=True), dict(rotation_trick=False, codebook_dim=8),
                                     dict(commitment_weight=0.0)],
                         ids=["euclidean", "cosine", "straight_through_projected", "no_commitment"])
@pytest.mark.parametrize("masked", [False, True])
def test_topk_gives_the_reference_s_codes_losses_and_gradients(options, training, masked):
    reference, ours = _pair(**options)
    reference.train(training)
    ours.train(training)
    x = torch.randn(2, 40, 16)
    mask = torch.rand(2, 40) > 0.3 if masked else None
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    out_ref, idx_ref, loss_ref = reference(xs[0], mask=mask, topk=3, ema_update=False)
    out, idx, loss = ours(xs[1], mask=mask, topk=3, ema_update=False)
    assert out.shape == out_ref.shape == (2, 40, 3, 16) and idx.shape == (2, 40, 3)
    order = _order_of_tied_codes(idx, idx_ref, reference, xs[0])
    assert torch.equal(idx, idx_ref.gather(2, order))
    torch.testing.assert_close(out, out_ref.gather(2, order.unsqueeze(3).expand(out.shape)), atol=1e-5, rtol=1e-5)
    assert loss.shape == loss_ref.shape
    per_code = loss_ref.dim() == 3  # a scalar 0 in training without a commitment weight
    torch.testing.assert_close(loss, loss_ref.gather(2, order) if per_code else loss_ref, atol=1e-6, rtol=1e-5)
    # In evaluation the reference's codes carry no gradient (lockstep's the straight-through one, as its
    # evaluation forward without topk): the losses' gradients are compared there.
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape) * float(training)
    weights_ref = torch.zeros_like(weights).scatter(2, order.unsqueeze(3).expand(out.shape), weights)
    for o, lo, w in ((out_ref, loss_ref, weights_ref), (out, loss, weights)):
        if lo.requires_grad or o.requires_grad:
            ((o * w).sum() + lo.sum()).backward()
    if xs[0].grad is not None:
        torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
    _assert_state(reference, ours)  # a top-k search updates nothing


def test_topk_then_update_ema_indices_is_the_reference_s_update():
    """The reference's own scenario (test_beam.py): a masked training forward, beside a top-1 search and
    update_ema_indices with the codes it found; both end with the same EMA statistics and codebook."""
    reference, ours = _pair()
    x = torch.randn(1, 200, 16)
    mask = torch.rand(1, 200) > 0.5
    out_ref, idx_ref, _ = reference(x, mask=mask, topk=1, ema_update=False)
    reference.update_ema_indices(x, idx_ref[..., 0], mask=mask)
    out, idx, code_loss = ours(x, mask=mask, topk=1, ema_update=False)
    assert torch.equal(idx, idx_ref)
    ours.update_ema_indices(x, idx[..., 0], mask=mask)
    _assert_state(reference, ours)
    # ... which is a plain masked training call's update (backwarded, in lockstep)
    plain, _ = _pair()[1], None
    out, idx1, loss = plain(x, mask=mask)
    (out.sum() + loss).backward()
    assert torch.equal(idx1, idx[..., 0])
    torch.testing.assert_close(loss, code_loss.sum() / mask.sum())
    for key in ("embed", "embed_avg", "cluster_size"):
        torch.testing.assert_close(plain.state_dict()[f"_codebook.{key}"], ours.state_dict()[f"_codebook.{key}"])


@pytest.mark.parametrize("options", [dict(), dict(heads=2, separate_codebook_per_head=True, codebook_dim=8),
                                     dict(accept_image_fmap=True)],
                         ids=["tokens", "heads", "image"])
def test_update_ema_indices_takes_forward_s_layouts(options):
    reference, ours = _pair(**options)
    for module in (reference, ours):
        module.eval()
    x = torch.randn(2, 16, 5, 6) if options.get("accept_image_fmap") else torch.randn(2, 30, 16)
    _, idx_ref, _ = reference(x)
    _, idx, _ = ours(x)
    assert torch.equal(idx, idx_ref)
    for module in (reference, ours):
        module.train()
        module.update_ema_indices(x, idx)
    _assert_state(reference, ours)
    assert ours.step == 1  # an update advances the step, as a backwarded training call does


@pytest.mark.parametrize("use_cosine_sim", [False, True])
@pytest.mark.parametrize("use_callable", [False, True])
def test_ema_update_weight_weighs_each_code_s_update_as_the_reference(use_cosine_sim, use_callable):
    reference, ours = _pair(use_cosine_sim=use_cosine_sim, codebook_dim=8, decay=0.8)
    weights = (torch.arange(32) % 3 == 0).float()
    seen = []

    def weigh(embed_sum, cluster_size):
        seen.append((embed_sum.shape, cluster_size.shape, float(cluster_size.sum())))
        return weights

    x = torch.randn(4, 100, 16)
    reference(x, ema_update_weight=weigh if use_callable else weights)
    out, _, loss = ours(x, ema_update_weight=weigh if use_callable else weights)
    (out.sum() + loss).backward()
    _assert_state(reference, ours)
    if use_callable:  # called once per side with the call's global statistics
        assert seen[0] == seen[1] == ((1, 32, 8), (1, 32), 400.0)
    untouched = weights == 0
    torch.testing.assert_close(ours.state_dict()["_codebook.cluster_size"][0][untouched], torch.ones(int(untouched.sum())))


def test_accum_ema_update_gathers_statistics_until_an_update_folds_them_in():
    reference, ours = _pair(use_cosine_sim=True, codebook_dim=8)
    before = ours.codebook.clone()
    xs = [torch.randn(4, 60, 16) for _ in range(3)]
    for x in xs[:2]:
        reference(x, accum_ema_update=True)
        out, _, loss = ours(x, accum_ema_update=True)
        (out.sum() + loss).backward()
        torch.testing.assert_close(ours.codebook, before)  # nothing moved yet
    reference(xs[2])
    out, _, loss = ours(xs[2])
    (out.sum() + loss).backward()
    _assert_state(reference, ours)
    assert not torch.allclose(ours.codebook, before)


def test_forward_s_ema_update_false_tracks_statistics_without_moving_the_codebook():
    reference, ours = _pair(threshold_ema_dead_code=0.0)
    x = torch.randn(2, 50, 16)
    reference(x, ema_update=False)
    out, _, loss = ours(x, ema_update=False)
    (out.sum() + loss).backward()
    _assert_state(reference, ours)
    with pytest.raises(ValueError, match="ema_update_weight must be"):
        ours(x, ema_update_weight=torch.ones(5))[0].sum().backward()


@pytest.mark.parametrize("options", [dict(), dict(use_cosine_sim=True), dict(heads=2, separate_codebook_per_head=True)],
                         ids=["euclidean", "cosine", "heads"])
def test_manual_ema_update_moves_the_statistics_and_update_ema_the_codebook_as_the_reference(options):
    """manual_ema_update=True: each training call moves the EMA statistics but leaves the codebook;
    `_codebook.update_ema()` recomputes it from them, as the reference's. Every call's indices, outputs and
    state equal the reference's, an update_ema() after the second and third calls."""
    reference, ours = _pair(manual_ema_update=True, decay=0.8, **options)
    for step in range(3):
        x = torch.randn(2, 40, 16) * (3.0 if step == 0 else 1.0)
        embed_before = ours._codebook.embed.detach().clone()
        out_ref, idx_ref, _ = reference(x)
        out, idx, loss = ours(x)
        (out.sum() * 0 + loss).backward()  # lockstep's update rides on backward
        assert torch.equal(idx, idx_ref)
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        assert torch.equal(ours._codebook.embed.detach(), embed_before)  # the statistics moved, not the codes
        _assert_state(reference, ours)
        if step > 0:
            reference._codebook.update_ema()
            ours._codebook.update_ema()
            _assert_state(reference, ours)
            assert not torch.equal(ours._codebook.embed.detach(), embed_before)


def test_manual_ema_update_survives_a_copy():
    import copy
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, manual_ema_update=True)
    original = ours._codebook.embed.detach().clone()
    copied = copy.deepcopy(ours)
    copied(torch.randn(2, 10, 8))[2].backward()
    assert torch.equal(copied._codebook.embed.detach(), original)
    copied._codebook.update_ema()  # the copy's own quantizer, not the original's
    assert not torch.equal(copied._codebook.embed.detach(), original)
    assert torch.equal(ours._codebook.embed.detach(), original)
    # A residual stack's layer likewise: the copy's own layer.
    stack = lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, manual_ema_update=True)
    original = stack.codebooks.detach().clone()
    copied = copy.deepcopy(stack)
    copied(torch.randn(2, 10, 8))[2].sum().backward()
    assert torch.equal(copied.codebooks.detach(), original)
    copied.layers[1]._codebook.update_ema()
    assert torch.equal(copied.codebooks[0].detach(), original[0]) and not torch.equal(copied.codebooks[1], original[1])
    assert torch.equal(stack.codebooks.detach(), original)
