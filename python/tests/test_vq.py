"""lockstep.VectorQuantize against vector_quantize_pytorch.VectorQuantize: identical initial
codebook (the reference's state dict loads as is), then several training steps."""
import copy

import pytest
import torch
from vector_quantize_pytorch import VectorQuantize as ReferenceVQ

import lockstep
from reference_steps import compare_training_steps


@pytest.mark.parametrize("options", [dict(), dict(rotation_trick=False), dict(decay=0.9, commitment_weight=0.5)])
def test_training_steps_match_the_reference_codebook_included(options):
    reference = ReferenceVQ(dim=16, codebook_size=64, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, **options)
    compare_training_steps(reference, ours, (2, 100, 16), 4, ["_codebook.embed"])


@pytest.mark.parametrize("options", [dict(decay=1.0), dict(decay=1.0, use_cosine_sim=True), dict(eps=1e-2),
                                     dict(eps=0.5, use_cosine_sim=True)],
                         ids=["decay_1", "decay_1_cosine", "eps", "eps_cosine"])
def test_options_once_refused_match_the_reference(options):
    """decay=1.0 (the EMA keeps the codebook: k-means sets it, then it stays) and eps (the Laplace smoothing
    of the cluster sizes), codebook and statistics included."""
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=16, codebook_size=64, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, **options)
    compare_training_steps(reference, ours, (2, 100, 16), 3, ["_codebook.embed", "_codebook.embed_avg",
                                                               "_codebook.cluster_size"])


@pytest.mark.parametrize("kmeans_init", [False, True])
def test_decay_one_keeps_the_codebook(kmeans_init):
    """From the initial codebook, or from k-means' (set in the first training call) on."""
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16, decay=1.0, kmeans_init=kmeans_init)
    before = vq.codebook.clone()
    for step in range(4):
        out, _, loss = vq(torch.randn(2, 30, 8, requires_grad=True))
        (out.sum() + loss).backward()
        if step == 0 and kmeans_init:
            assert not torch.equal(vq.codebook, before)  # k-means set it
            before = vq.codebook.clone()
    torch.testing.assert_close(vq.codebook, before, atol=1e-6, rtol=0)  # (1 + eps) / (K + K eps) K rounds


@pytest.mark.parametrize("options, shape", [(dict(channel_last=False), (2, 16, 40)),
                                            (dict(channel_last=False, heads=2, codebook_dim=4), (2, 16, 40)),
                                            (dict(accept_3d_fmap=True), (2, 16, 3, 4, 5))],
                         ids=["channel_first_sequences", "channel_first_heads", "video"])
def test_layouts_once_refused_match_the_reference(options, shape):
    """channel_last=False takes sequences (b, dim, n); accept_3d_fmap takes video (b, dim, t, h, w) with
    indices (b, t, h, w): training steps, and evaluation decoded from the indices."""
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=16, codebook_size=64, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, **options)
    compare_training_steps(reference, ours, shape, 3, ["_codebook.embed"])
    reference.eval()
    ours.eval()
    x = torch.randn(shape)
    out_ref, idx_ref, _ = reference(x)
    out, idx, _ = ours(x)
    assert out.shape == x.shape and idx.shape == idx_ref.shape and torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.get_output_from_indices(idx), out)
    torch.testing.assert_close(ours.get_codes_from_indices(idx), reference.get_codes_from_indices(idx_ref))


def test_channel_first_sequences_take_a_mask_along_the_sequence():
    """lens counts along n (the reference's counts along dim, a deliberate difference,
    docs/python/vector-quantize-pytorch.md)."""
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, channel_last=False)
    plain = lockstep.VectorQuantize(dim=8, codebook_size=16)
    plain.load_state_dict(ours.state_dict())
    x = torch.randn(2, 8, 10)
    out, idx, loss = ours(x, lens=torch.tensor([10, 4]))
    out_plain, idx_plain, loss_plain = plain(x.transpose(1, 2), lens=torch.tensor([10, 4]))
    assert out.shape == (2, 8, 10) and torch.equal(idx, idx_plain) and (idx[1, 4:] == -1).all()
    torch.testing.assert_close(out, out_plain.transpose(1, 2))
    torch.testing.assert_close(loss, loss_plain)


# Every option docs/python/vq.md lists as supported with the reference's meaning, beside the reference
# (the options that draw random numbers are in test_differences.py).
@pytest.mark.parametrize("options, shape", [
    (dict(use_cosine_sim=True), (2, 100, 16)),
    (dict(codebook_dim=8), (2, 100, 16)),
    (dict(heads=2, separate_codebook_per_head=True, codebook_dim=8), (2, 100, 16)),
    (dict(heads=2, codebook_dim=8), (2, 100, 16)),
    (dict(accept_image_fmap=True), (2, 16, 6, 5)),
    (dict(use_cosine_sim=True, rotation_trick=False, commitment_weight=0.3), (2, 100, 16)),
], ids=["cosine", "codebook_dim", "heads_separate", "heads_shared", "image_fmap", "cosine_no_rotation"])
def test_each_supported_option_matches_the_reference(options, shape):
    reference = ReferenceVQ(dim=16, codebook_size=64, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, **options)
    compare_training_steps(reference, ours, shape, 3, ["_codebook.embed"])


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
def test_the_orthogonal_regulariser_trains_the_codebook_as_the_reference_does(optimizer):
    # The reference makes the codebook a parameter that the regulariser and the commitment loss train
    # beside the EMA; lockstep once kept it a buffer (the term a constant): 7/256 indices differed after
    # one Adam step, 64/256 after four.
    reference = ReferenceVQ(dim=16, codebook_size=64, orthogonal_reg_weight=0.5)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, orthogonal_reg_weight=0.5)
    assert "_codebook.embed" in dict(ours.named_parameters())
    compare_training_steps(reference, ours, (2, 128, 16), 5, ["_codebook.embed", "_codebook.embed_avg"],
                           orthogonal=(0.5, lambda m: [m._codebook.embed]), optimizer=optimizer)


@pytest.mark.parametrize("options", [dict(orthogonal_reg_active_codes_only=True),
                                     dict(orthogonal_reg_active_codes_only=True, heads=2, codebook_dim=8),
                                     dict(orthogonal_reg_max_codes=64), dict(orthogonal_reg_max_codes=100)],
                         ids=["active", "active_heads", "max_codes_all", "max_codes_above"])
def test_the_orthogonal_regulariser_over_some_codes_as_the_reference(options):
    """orthogonal_reg_active_codes_only: the regulariser over the codes the call's tokens chose (the reference's
    torch.unique of its indices); orthogonal_reg_max_codes no smaller than the codes: all of them, as there.
    Indices, outputs, losses, gradients and codebooks over 4 Adam steps."""
    reference = ReferenceVQ(dim=16, codebook_size=64, orthogonal_reg_weight=0.5, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, orthogonal_reg_weight=0.5, **options)
    if options.get("orthogonal_reg_active_codes_only"):
        def taken(codebook, indices):
            return codebook[:, torch.unique(indices)]
    else:
        def taken(codebook, indices):
            return codebook
    compare_training_steps(reference, ours, (2, 64, 16), 4, ["_codebook.embed", "_codebook.embed_avg"],
                           orthogonal=(0.5, lambda m: [m._codebook.embed], taken), optimizer=torch.optim.Adam)


@pytest.mark.parametrize("options, shape", [
    (dict(), (2, 50, 16)),
    (dict(use_cosine_sim=True, codebook_diversity_temperature=10.0), (2, 50, 16)),
    (dict(heads=2, codebook_dim=8), (2, 50, 16)),
    (dict(heads=2, separate_codebook_per_head=True, codebook_dim=8), (2, 50, 16)),
    (dict(accept_image_fmap=True), (2, 16, 5, 6)),
    (dict(learnable_codebook=True, ema_update=False), (2, 50, 16)),
], ids=["euclidean", "cosine", "heads_shared", "heads_separate", "image_fmap", "learnable"])
def test_the_codebook_diversity_loss_matches_the_reference(options, shape):
    """codebook_diversity_loss_weight: minus the entropy of the code probabilities averaged over the batch at each
    position, over liblockstep's logits; indices, outputs, losses, input (and codebook) gradients and codebooks
    over 3 steps, and the breakdown's unweighted term. With the EMA the reference's gradient of its distances is
    taken at the codebook its in-forward update left (the storage its detached codebook shares, as with its
    cross-entropy commitment, docs/python/vq.md); lockstep's is the gradient of the value it returns, which a frozen
    copy of the reference gives."""
    import copy
    reference = ReferenceVQ(dim=16, codebook_size=64, codebook_diversity_loss_weight=0.3, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, codebook_diversity_loss_weight=0.3, **options)
    if options.get("learnable_codebook"):
        compare_training_steps(reference, ours, shape, 3, ["_codebook.embed"], optimizer=torch.optim.SGD)
    else:
        ours.load_reference_state_dict(reference.state_dict())
        for step in range(3):
            x = torch.randn(*shape)
            xs = [x.clone().requires_grad_(True) for _ in range(3)]
            frozen = copy.deepcopy(reference)
            out_frozen, _, loss_frozen = frozen(xs[0], freeze_codebook=True)
            out_ref, idx_ref, loss_ref = reference(xs[1])
            out, idx, loss = ours(xs[2])
            assert torch.equal(idx, idx_ref), step
            torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(loss.detach(), loss_ref.detach(), atol=1e-5, rtol=1e-5)
            weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
            ((out_frozen * weights).sum() + loss_frozen).backward()
            ((out * weights).sum() + loss).backward()
            torch.testing.assert_close(xs[2].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ours.state_dict()["_codebook.embed"], reference.state_dict()["_codebook.embed"],
                                       atol=1e-5, rtol=1e-5)
    x = torch.randn(*shape)
    *_, breakdown_ref = reference(x, return_loss_breakdown=True)
    *_, breakdown = ours(x, return_loss_breakdown=True)
    torch.testing.assert_close(breakdown.codebook_diversity, breakdown_ref.codebook_diversity.detach(), atol=1e-5,
                               rtol=1e-5)


def test_the_codebook_diversity_loss_leaves_padding_out():
    """A deliberate difference: the reference's average counts padded tokens; lockstep's, as its other terms,
    only those that count (an item wholly masked gives the other item's value)."""
    torch.manual_seed(0)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, codebook_diversity_loss_weight=1.0, commitment_weight=0.0)
    x = torch.randn(2, 12, 8, requires_grad=True)  # a backward may follow: the codebook waits, every call alike
    _, _, alone = ours(x[:1])
    _, _, masked = ours(x, mask=torch.tensor([[True] * 12, [False] * 12]))
    _, _, whole = ours(x, mask=torch.ones(2, 12, dtype=torch.bool))
    _, _, unmasked = ours(x)
    torch.testing.assert_close(masked, alone)
    torch.testing.assert_close(whole, unmasked)
    assert not torch.allclose(masked, unmasked)


def test_orthogonal_reg_max_codes_takes_that_many_codes_drawn_each_step_from_the_seed():
    """Fewer codes than the codebook's: the regulariser is the reference's orthogonal_loss_fn over max_codes
    codes, its gradient theirs alone; drawn from (seed, step) rather than torch's generator (the reference's
    randperm): another step draws others, the same seed and step the same (on every rank: test_distributed)."""
    from vector_quantize_pytorch.vector_quantize_pytorch import orthogonal_loss_fn

    def made():
        return lockstep.VectorQuantize(dim=8, codebook_size=32, orthogonal_reg_weight=1.0, orthogonal_reg_max_codes=5,
                                       ema_update=False, commitment_weight=0.0, seed=7)

    ours, twin = made(), made()
    twin.load_state_dict(ours.state_dict())
    chosen = []
    for step in range(3):
        x = torch.randn(2, 20, 8)
        for module in (ours, twin):
            _, _, loss = module(x)
            loss.backward()
        embed = ours._codebook.embed
        rows = embed.grad[0].abs().sum(-1).nonzero().squeeze(1)
        assert rows.numel() == 5, rows
        torch.testing.assert_close(twin._codebook.embed.grad, embed.grad)  # the same seed and step: the same codes
        codes = embed.detach()[:, rows].clone().requires_grad_(True)
        expected = orthogonal_loss_fn(codes)
        torch.testing.assert_close(loss.detach(), expected.detach(), atol=1e-6, rtol=1e-5)
        expected.backward()
        torch.testing.assert_close(embed.grad[:, rows], codes.grad, atol=1e-6, rtol=1e-5)
        chosen.append(set(rows.tolist()))
        for module in (ours, twin):
            module.zero_grad()
    assert len({frozenset(c) for c in chosen}) > 1, chosen  # each step draws anew


@pytest.mark.parametrize("options, error, match", [
    (dict(orthogonal_reg_max_codes=0), ValueError, "orthogonal_reg_max_codes=0"),
    (dict(orthogonal_reg_active_codes_only=True, heads=2, separate_codebook_per_head=True), AssertionError,
     "separate codebooks"),
])
def test_orthogonal_options_the_reference_cannot_run_are_errors(options, error, match):
    with pytest.raises(error, match=match):
        lockstep.VectorQuantize(dim=8, codebook_size=16, orthogonal_reg_weight=0.5, **options)


@pytest.mark.parametrize("options", [dict(commitment_weight=0.7, orthogonal_reg_weight=0.3), dict(commitment_weight=0.0),
                                     dict(heads=2, separate_codebook_per_head=True, codebook_dim=4)],
                         ids=["weighted", "no_commitment", "heads"])
def test_return_loss_breakdown_gives_the_references_unweighted_terms(options):
    from vector_quantize_pytorch.vector_quantize_pytorch import orthogonal_loss_fn
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=8, codebook_size=16, **options)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, **options)
    ours.load_reference_state_dict(reference.state_dict())
    before = orthogonal_loss_fn(reference._codebook.embed.detach())
    x = torch.randn(2, 20, 8)
    *_, breakdown_ref = reference(x, return_loss_breakdown=True)
    out, idx, loss, breakdown = ours(x, return_loss_breakdown=True)
    assert breakdown._fields == breakdown_ref._fields == ("commitment", "codebook_diversity", "orthogonal_reg",
                                                            "inplace_optimize")
    torch.testing.assert_close(breakdown.commitment, breakdown_ref.commitment, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(breakdown.codebook_diversity, breakdown_ref.codebook_diversity)
    torch.testing.assert_close(breakdown.inplace_optimize, breakdown_ref.inplace_optimize)
    # The regulariser is of the codebook before the step's update (docs/python/vq.md), the reference's after it.
    expected_orthogonal = before if options.get("orthogonal_reg_weight") else breakdown_ref.orthogonal_reg
    torch.testing.assert_close(breakdown.orthogonal_reg, expected_orthogonal, atol=1e-5, rtol=1e-5)
    weights = options.get("commitment_weight", 1.0), options.get("orthogonal_reg_weight", 0.0)
    torch.testing.assert_close(loss, weights[0] * breakdown.commitment + weights[1] * breakdown.orthogonal_reg)
    assert len(ours(x)) == 3  # without the flag, the reference's three values


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
@pytest.mark.parametrize("options", [dict(), dict(rotation_trick=False), dict(commitment_weight=0.4),
                                     dict(heads=2, separate_codebook_per_head=True, codebook_dim=8)],
                         ids=["rotation", "straight_through", "weighted", "heads"])
def test_a_learnable_codebook_is_trained_by_gradient_as_the_reference_does(options, optimizer):
    # learnable_codebook=True, ema_update=False: the codebook is a parameter that the commitment loss
    # trains (the VQ-VAE codebook term); no EMA, no statistics.
    options = dict(learnable_codebook=True, ema_update=False, **options)
    reference = ReferenceVQ(dim=16, codebook_size=64, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, **options)
    assert "_codebook.embed" in dict(ours.named_parameters())
    compare_training_steps(reference, ours, (2, 100, 16), 4, ["_codebook.embed", "_codebook.cluster_size"],
                           optimizer=optimizer)


def test_ema_update_false_keeps_the_codebook_as_the_reference_does():
    reference = ReferenceVQ(dim=16, codebook_size=64, ema_update=False)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, ema_update=False)
    initial = reference.state_dict()["_codebook.embed"].clone()
    compare_training_steps(reference, ours, (2, 100, 16), 3, ["_codebook.embed", "_codebook.cluster_size"])
    assert torch.equal(ours.state_dict()["_codebook.embed"], initial)


def test_combinations_the_reference_refuses_are_its_assertion_errors():
    """Code written against the reference catches its AssertionError for these."""
    for refused in (dict(learnable_codebook=True), dict(learnable_codebook=True, ema_update=False, use_cosine_sim=True),
                    dict(straight_through=True, rotation_trick=True), dict(sync_update_v=0.5),
                    dict(learnable_codebook=True, ema_update=False, sync_update_v=1.5)):
        with pytest.raises(AssertionError):
            ReferenceVQ(dim=8, codebook_size=16, **refused)
        with pytest.raises(AssertionError, match="as in the reference"):
            lockstep.VectorQuantize(dim=8, codebook_size=16, **refused)


@pytest.mark.parametrize("options", [dict(), dict(threshold_ema_dead_code=2.0),
                                     dict(learnable_codebook=True, ema_update=False)],
                         ids=["ema", "dead_codes", "learnable"])
def test_freeze_codebook_keeps_the_codebook_as_the_reference_does(options):
    reference = ReferenceVQ(dim=16, codebook_size=64, freeze_codebook=True, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, freeze_codebook=True, **options)
    initial = {k: v.clone() for k, v in reference.state_dict().items()}
    compare_training_steps(reference, ours, (2, 100, 16), 3, ["_codebook.embed", "_codebook.cluster_size"],
                           optimizer=torch.optim.SGD if options.get("learnable_codebook") else None)
    for key in ("_codebook.embed", "_codebook.cluster_size", "_codebook.embed_avg"):
        assert torch.equal(ours.state_dict()[key], initial[key]), key


def test_freeze_codebook_in_forward_overrides_the_module_s_setting_for_that_call():
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=8, codebook_size=16, decay=0.5)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.5)
    ours.load_reference_state_dict(reference.state_dict())
    compiled = lockstep.VectorQuantize(dim=8, codebook_size=16, decay=0.5)
    compiled.load_reference_state_dict(reference.state_dict())
    run = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    for freeze in (True, False, True):
        before = ours.state_dict()["_codebook.embed"].clone()
        x = torch.randn(2, 30, 8)
        results = []
        for module in (reference, ours, run):
            xi = x.clone().requires_grad_(True)
            out, idx, loss = module(xi, freeze_codebook=freeze)
            (out.sum() + loss).backward()
            results.append((out.detach(), idx, xi.grad))
        for out, idx, grad in results[1:]:
            assert torch.equal(idx, results[0][1].to(idx.dtype))
            torch.testing.assert_close(out, results[0][0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(grad, results[0][2], atol=1e-5, rtol=1e-5)
        embed = ours.state_dict()["_codebook.embed"]
        assert torch.equal(embed, before) == freeze
        torch.testing.assert_close(embed, reference.state_dict()["_codebook.embed"], atol=1e-5, rtol=1e-5)
        assert torch.equal(compiled.state_dict()["_codebook.embed"], embed)


@pytest.mark.parametrize("options", [dict(), dict(use_cosine_sim=True), dict(codebook_dim=4),
                                     dict(heads=2, separate_codebook_per_head=True),
                                     dict(heads=2, codebook_dim=4),
                                     dict(learnable_codebook=True, ema_update=False)],
                         ids=["euclidean", "cosine", "projected", "heads_separate", "heads_shared", "learnable"])
def test_indices_give_the_reference_s_cross_entropy(options):
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=8, codebook_size=16, **options)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, **options)
    ours.load_reference_state_dict(reference.state_dict())
    heads = options.get("heads", 1)
    for training in (True, False):
        reference.train(training)
        ours.train(training)
        x = torch.randn(2, 12, 8)
        indices = torch.randint(0, 16, (2, 12, heads) if heads > 1 else (2, 12))
        indices[0, :2] = -1  # ignored, as there
        # In training the reference's EMA step writes the codebook's .data inside forward, so its
        # backward differentiates at the moved codebook (a deliberate difference): the gradient is
        # compared with the reference's in evaluation from the same state, the gradient of the value.
        unmoved = copy.deepcopy(reference).eval()
        xs = [x.clone().requires_grad_(True) for _ in range(3)]
        _, ce_ref = reference(xs[0], indices=indices)
        _, ce_unmoved = unmoved(xs[2], indices=indices)
        out, ce = ours(xs[1], indices=indices)
        assert out.shape == x.shape  # the module's output (the reference returns its internal layout)
        torch.testing.assert_close(ce, ce_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ce, ce_unmoved, atol=1e-5, rtol=1e-5)
        ce_unmoved.backward()
        ce.backward()
        ce_ref.backward()
        torch.testing.assert_close(xs[1].grad, xs[2].grad, atol=1e-5, rtol=1e-5)
        if options.get("learnable_codebook"):
            torch.testing.assert_close(ours._codebook.embed.grad, unmoved._codebook.embed.grad, atol=1e-5,
                                       rtol=1e-5)
            ours._codebook.embed.grad = None
    torch.testing.assert_close(ours.state_dict()["_codebook.embed"], reference.state_dict()["_codebook.embed"],
                               atol=1e-5, rtol=1e-5)  # the training call's EMA update happened in both
    with pytest.raises(ValueError, match="indices must have shape"):
        ours(torch.randn(2, 12, 8), indices=torch.zeros(2, 11, dtype=torch.long))
    with pytest.raises(ValueError, match="no mask"):
        ours(torch.randn(2, 12, 8), indices=indices, lens=torch.tensor([12, 3]))


@pytest.mark.parametrize("options", [
    dict(directional_reparam=True, threshold_ema_dead_code=1e-9, directional_reparam_variance=0.0),
    dict(directional_reparam=True, threshold_ema_dead_code=1e-9, directional_reparam_variance=0.0, codebook_dim=8),
    dict(learnable_codebook=True, ema_update=False, sync_update_v=0.5),
    dict(learnable_codebook=True, ema_update=False, route_gradients_to_input=False),
    dict(route_gradients_to_input=False, rotation_trick=False),
    dict(straight_through=True, rotation_trick=False),
    dict(layernorm_after_project_in=True, codebook_dim=8),
    dict(layernorm_after_project_in=True, codebook_dim=4, heads=2, separate_codebook_per_head=True)],
    ids=["diveq", "diveq_projected", "sync_update_v", "no_route_learnable", "no_route", "gumbel_straight_through",
         "layernorm", "layernorm_heads"])
def test_estimator_options_once_refused_match_the_reference(options):
    """directional_reparam (DiVeQ: the token plus its distance to the code along the noised direction; here
    without noise, so both sides are deterministic), sync_update_v and route_gradients_to_input: outputs,
    gradients (input and learned codebook) and codebooks over Adam steps."""
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=16, codebook_size=32, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=32, **options)
    learned = bool(options.get("learnable_codebook") or options.get("directional_reparam"))
    compare_training_steps(reference, ours, (2, 40, 16), 3, ["_codebook.embed"],
                           optimizer=torch.optim.Adam if learned or ours.has_projections else None)


def test_diveq_noise_turns_the_direction_by_its_variance_alone():
    """With noise the output is the token moved its distance to the code along a direction near the code's:
    the noise changes where it lands, not how far it moved, and more variance turns it more."""
    torch.manual_seed(0)
    x = torch.randn(2, 50, 16)
    turned = []
    for variance in (1e-4, 1e-1):
        vq = lockstep.VectorQuantize(dim=16, codebook_size=32, directional_reparam=True, threshold_ema_dead_code=1e-9,
                                     directional_reparam_variance=variance, seed=1)
        out, idx, _ = vq(x.clone().requires_grad_(True))
        codes = vq.get_output_from_indices(idx)
        torch.testing.assert_close((out - x).norm(dim=-1), (codes - x).norm(dim=-1), atol=1e-4, rtol=1e-4)
        turned.append(float((out - codes).norm(dim=-1).mean()))
    assert 0 < turned[0] < turned[1]
    with pytest.raises(AssertionError, match="dead-code"):  # the reference's assertion
        lockstep.VectorQuantize(dim=16, codebook_size=32, directional_reparam=True)
    with pytest.raises(AssertionError, match="at most one"):
        lockstep.VectorQuantize(dim=16, codebook_size=32, directional_reparam=True, rotation_trick=True,
                                threshold_ema_dead_code=1.0)


@pytest.mark.parametrize("options", [dict(), dict(use_cosine_sim=True, commitment_weight=0.5),
                                     dict(heads=2, separate_codebook_per_head=True, codebook_dim=8)],
                         ids=["euclidean", "cosine", "heads"])
def test_a_cross_entropy_commitment_matches_the_reference(options):
    """commitment_use_cross_entropy_loss: the commitment loss is the cross entropy of each token's chosen code
    under its logits (liblockstep's distances, the codebook as the call found it): losses, gradients and
    codebooks over training steps. With decay 1 (a codebook the update keeps): the reference differentiates
    its distances at the codebook its in-forward EMA step left (its detached codebook shares the storage that
    step overwrites), lockstep at the codebook the call searched (shown below)."""
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=16, codebook_size=32, commitment_use_cross_entropy_loss=True, decay=1.0, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=32, commitment_use_cross_entropy_loss=True, decay=1.0,
                                   **options)
    compare_training_steps(reference, ours, (2, 40, 16), 3, ["_codebook.embed"])


def test_a_cross_entropy_commitment_differentiates_at_the_codebook_the_call_searched():
    torch.manual_seed(0)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=32, commitment_use_cross_entropy_loss=True, decay=0.5)
    codebook = ours.codebook.detach().clone()
    x = torch.randn(2, 40, 16, requires_grad=True)
    _, idx, loss = ours(x)
    loss.backward()  # the EMA update runs in this backward too
    assert not torch.equal(ours.codebook, codebook)
    by_hand = x.detach().clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(-torch.cdist(by_hand, codebook.unsqueeze(0)).movedim(-1, 1), idx).backward()
    torch.testing.assert_close(x.grad, by_hand.grad, atol=1e-6, rtol=1e-5)
    # Feature maps too, where the reference's cross entropy fails on the indices' shape.
    maps = lockstep.VectorQuantize(dim=16, codebook_size=32, commitment_use_cross_entropy_loss=True,
                                   accept_image_fmap=True)
    assert maps(torch.randn(2, 16, 5, 4))[2].ndim == 0
    with pytest.raises(RuntimeError):
        ReferenceVQ(dim=16, codebook_size=32, commitment_use_cross_entropy_loss=True,
                    accept_image_fmap=True)(torch.randn(2, 16, 5, 4))


def test_a_masked_cross_entropy_commitment_ignores_the_padding():
    torch.manual_seed(0)
    reference = ReferenceVQ(dim=16, codebook_size=32, commitment_use_cross_entropy_loss=True)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=32, commitment_use_cross_entropy_loss=True)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 30, 16)
    lens = torch.tensor([30, 11])
    _, idx_ref, loss_ref = reference(x, lens=lens)
    _, idx, loss = ours(x, lens=lens)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
