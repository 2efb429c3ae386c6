"""lockstep's residual quantizers against vector_quantize_pytorch's ResidualVQ, ResidualFSQ and
ResidualLFQ: identical initial state (the reference's state dict loads as is), then several training
steps; feature maps, decoding from indices and the options lockstep refuses."""
import copy

import pytest
import torch
from vector_quantize_pytorch import ResidualFSQ as ReferenceResidualFSQ
from vector_quantize_pytorch import ResidualLFQ as ReferenceResidualLFQ
from vector_quantize_pytorch import ResidualVQ as ReferenceResidualVQ

import lockstep
from reference_steps import backward_and_compare_gradients, compare_call, compare_first_k_means, compare_training_steps


@pytest.mark.parametrize("options", [dict(), dict(rotation_trick=False, decay=0.9), dict(use_cosine_sim=True),
                                     dict(commitment_weight=0.5, orthogonal_reg_weight=0.2)])
def test_vq_training_steps_match_the_reference_codebooks_included(options):
    reference = ReferenceResidualVQ(dim=12, codebook_size=32, num_quantizers=3, **options)
    ours = lockstep.ResidualVQ(dim=12, codebook_size=32, num_quantizers=3, **options)
    weight = options.get("orthogonal_reg_weight", 0)
    compare_training_steps(reference, ours, (2, 50, 12), 3, [f"layers.{q}._codebook.embed" for q in range(3)],
                           orthogonal=(weight, lambda m: [layer._codebook.embed for layer in m.layers]) if weight else None,
                           optimizer=torch.optim.Adam if weight else None)


@pytest.mark.parametrize("options", [dict(codebook_dim=6, num_quantizers=3, codebook_size=32),
                                     dict(codebook_size=(8, 32, 16)),
                                     dict(codebook_size=(8, 32, 16), codebook_dim=4, decay=0.5),
                                     dict(num_quantizers=3, codebook_size=32, quant_grad_frac=0.3),
                                     dict(num_quantizers=3, codebook_size=32, quant_grad_frac=1.0, rotation_trick=False),
                                     dict(num_quantizers=3, codebook_size=32, quant_grad_frac=-0.5)],
                         ids=["codebook_dim", "sizes", "sizes_projected", "grad_frac", "grad_frac_1",
                              "grad_frac_negative"])
def test_options_once_refused_match_the_reference(options):
    """codebook_dim (a projection to it and back), a codebook size per layer (the number of layers taken
    from them), quant_grad_frac (a share of each layer's gradient reaching the layers before; <= 0
    detaches): outputs, indices, losses, input and parameter gradients and every codebook."""
    torch.manual_seed(0)
    reference = ReferenceResidualVQ(dim=12, **options)
    ours = lockstep.ResidualVQ(dim=12, **options)
    layers = len(reference.layers)
    compare_training_steps(reference, ours, (2, 50, 12), 3,
                           [f"layers.{q}._codebook.{name}" for q in range(layers) for name in ("embed", "embed_avg")],
                           optimizer=torch.optim.Adam if ours.has_projections else None)


def test_a_codebook_size_per_layer_decodes_each_layer_with_its_own_codebook():
    reference = ReferenceResidualVQ(dim=2, codebook_size=(5, 128, 256))  # the reference's TIGER example
    ours = lockstep.ResidualVQ(dim=2, codebook_size=(5, 128, 256))
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 2, 2)
    for module in (reference, ours):
        module.train()
    out_ref, idx_ref, _ = reference(x, freeze_codebook=True)
    out, idx, _ = ours(x, freeze_codebook=True)
    assert torch.equal(idx, idx_ref) and idx[..., 0].max() < 5
    torch.testing.assert_close(ours.get_output_from_indices(idx), out, atol=1e-5, rtol=1e-5)
    for codes, codes_ref in zip(ours.get_codes_from_indices(idx), reference.get_codes_from_indices(idx_ref)):
        torch.testing.assert_close(codes, codes_ref)


@pytest.mark.parametrize(
    "options",
    [
        dict(levels=[8, 5, 5, 5], num_quantizers=3),  # the reference's default: soft clamp, then hard-clamped layers
        dict(levels=[5, 4], num_quantizers=4, dim=16),
        dict(levels=[7, 5, 5], num_quantizers=2, bound_hard_clamp=False),
    ],
)
def test_fsq_matches_the_reference(options):
    reference = ReferenceResidualFSQ(**options)
    ours = lockstep.ResidualFSQ(**options)
    dim = options.get("dim", len(options["levels"]))
    compare_training_steps(reference, ours, (2, 60, dim), 2, scale=2.0)


@pytest.mark.parametrize(
    "options",
    [
        dict(dim=6, codebook_size=2**6, num_quantizers=3),
        dict(dim=16, codebook_size=2**5, num_quantizers=2, commitment_loss_weight=0.25, entropy_loss_weight=0.2),
        dict(dim=8, codebook_size=2**8, num_quantizers=2, spherical=True, diversity_gamma=2.0),
    ],
)
def test_lfq_training_steps_match_the_reference(options):
    reference = ReferenceResidualLFQ(**options)
    ours = lockstep.ResidualLFQ(**options)
    compare_training_steps(reference, ours, (2, 40, options["dim"]), 3)


@pytest.mark.parametrize("options, shape", [
    (dict(dim=6, codebook_size=2**4, num_quantizers=3), (2, 40, 6)),
    (dict(dim=4, codebook_size=2**4, num_quantizers=3, commitment_loss_weight=0.25), (2, 4, 5, 3)),  # a map
    (dict(dim=8, codebook_size=2**5, num_quantizers=3, soft_clamp_input_value=1.5), (2, 40, 8)),
    (dict(dim=8, codebook_size=2**6, num_quantizers=2, spherical=True), (2, 40, 8)),
    (dict(dim=6, codebook_size=2**4, num_quantizers=3), (2, 40, 6)),
], ids=["projected", "map", "soft_clamp", "spherical", "linear_in_every_layer"])
def test_lfq_straight_through_activation_matches_the_reference(options, shape, request):
    # Each layer's act(t_q) + (q - act(t_q)).detach(), t_q its residual: the input gradient the sum of the
    # module's over the layers (3 steps, the projections' gradients too); evaluation as without it. A module
    # with parameters is the one module of every layer (`layers.q.activation.*`), trained through them all.
    torch.manual_seed(0)
    linear = request.node.callspec.id == "linear_in_every_layer"
    activation = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()) if linear else torch.nn.Tanh()
    reference = ReferenceResidualLFQ(straight_through_activation=activation, **options)
    ours = lockstep.ResidualLFQ(straight_through_activation=copy.deepcopy(activation), **options)
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in reference.named_parameters())
    compare_training_steps(reference, ours, shape, 3, optimizer=torch.optim.Adam if linear else None)
    reference.eval(), ours.eval()
    x = torch.randn(*shape)
    torch.testing.assert_close(ours(x)[0], reference(x)[0], atol=1e-5, rtol=1e-5)


def test_lfq_straight_through_activation_skips_the_dropped_layers_as_the_reference():
    torch.manual_seed(0)
    options = dict(dim=6, codebook_size=2**4, num_quantizers=4, quantize_dropout=True,
                   straight_through_activation=torch.nn.Tanh())
    reference, ours = ReferenceResidualLFQ(**options), lockstep.ResidualLFQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    dropped = 0
    for seed in range(6):  # layers after a seeded random one are dropped, by both
        x = torch.randn(2, 30, 6)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        out_ref, idx_ref, loss_ref = reference(xs[0], rand_quantize_dropout_fixed_seed=seed)
        out, idx, loss = ours(xs[1], rand_quantize_dropout_fixed_seed=seed)
        assert torch.equal(idx, idx_ref)
        dropped += int((idx < 0).any())
        backward_and_compare_gradients(reference, ours, xs, out_ref, out, loss_ref, loss)
    assert dropped > 0


@pytest.mark.parametrize("options", [
    dict(learnable_codebook=True, ema_update=False),
    dict(learnable_codebook=True, ema_update=False, shared_codebook=True),
], ids=["learnable", "shared"])
def test_vq_layers_take_the_codebook_diversity_loss_as_the_references(options):
    # Each layer's diversity loss in its entry of the per-layer losses, trained through 3 Adam steps.
    torch.manual_seed(4)
    arguments = dict(dim=16, num_quantizers=3, codebook_size=32, codebook_diversity_loss_weight=0.3, **options)
    reference, ours = ReferenceResidualVQ(**arguments), lockstep.ResidualVQ(**arguments)
    compare_training_steps(reference, ours, (2, 30, 16), 3, optimizer=torch.optim.Adam)


def test_feature_maps_and_decoding_from_indices():
    reference = ReferenceResidualFSQ(levels=[8, 5, 5, 5], num_quantizers=2, dim=6, is_channel_first=True)
    ours = lockstep.ResidualFSQ(levels=[8, 5, 5, 5], num_quantizers=2, dim=6, is_channel_first=True)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 6, 5, 7)
    out_ref, idx_ref = reference(x)
    out, idx = ours(x)
    assert out.shape == (2, 6, 5, 7) and idx.shape == idx_ref.shape == (2, 2, 5, 7)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    last = idx.movedim(1, -1)  # decoding takes the layer axis last, as the reference
    torch.testing.assert_close(ours.get_output_from_indices(last), reference.get_output_from_indices(last),
                               atol=1e-5, rtol=1e-5)

    lfq_ref = ReferenceResidualLFQ(dim=4, codebook_size=2**4, num_quantizers=3)
    lfq = lockstep.ResidualLFQ(dim=4, codebook_size=2**4, num_quantizers=3)
    lfq.load_reference_state_dict(lfq_ref.state_dict())
    x = torch.randn(2, 4, 3, 5)  # (b, d, h, w): channel first, as the reference's layers take it
    out_ref, idx_ref, loss_ref = lfq_ref(x)
    out, idx, loss = lfq(x)
    assert idx.shape == idx_ref.shape == (2, 3, 5, 3) and torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    tokens = torch.randn(2, 9, 4)
    _, idx, _ = lfq(tokens)
    torch.testing.assert_close(lfq.get_output_from_indices(idx), lfq_ref.get_output_from_indices(idx))


def test_dropped_layers_have_index_minus_one_and_decode_to_nothing():
    ours = lockstep.ResidualFSQ(levels=[5, 5], num_quantizers=4, quantize_dropout=True, quantize_dropout_cutoff_index=1)
    x = torch.randn(4, 30, 2)
    kept = []
    for _ in range(12):  # the cutoff is drawn from (seed, step), the step advancing with each backward
        out, idx = ours(x.clone().requires_grad_(True))
        out.sum().backward()
        out = out.detach()
        layers = int((idx[0, 0] >= 0).sum())
        assert 2 <= layers <= 4 and bool((idx[..., layers:] == -1).all()) and bool((idx[..., :layers] >= 0).all())
        torch.testing.assert_close(ours.get_output_from_indices(idx), out)
        kept.append(layers)
    assert len(set(kept)) > 1
    ours.eval()
    assert bool((ours(x)[1] >= 0).all())  # evaluation runs every layer


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
def test_learnable_codebooks_are_trained_by_gradient_as_the_reference_does(optimizer):
    options = dict(dim=8, codebook_size=16, num_quantizers=3, learnable_codebook=True, ema_update=False)
    reference = ReferenceResidualVQ(**options)
    ours = lockstep.ResidualVQ(**options)
    assert {f"layers.{q}._codebook.embed" for q in range(3)} <= set(dict(ours.named_parameters()))
    compare_training_steps(reference, ours, (2, 60, 8), 3, [f"layers.{q}._codebook.embed" for q in range(3)],
                           optimizer=optimizer)


def test_freeze_codebook_keeps_every_layer_s_codebook():
    torch.manual_seed(0)
    reference = ReferenceResidualVQ(dim=8, codebook_size=16, num_quantizers=2)
    ours = lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2)
    ours.load_reference_state_dict(reference.state_dict())
    initial = ours.codebooks.clone()
    x = torch.randn(2, 30, 8)
    for module in (reference, ours):
        out, _, loss = module(x, freeze_codebook=True)  # as the reference: forward freezes every layer
        (out.sum() + loss.sum()).backward()
    assert torch.equal(ours.codebooks, initial) and torch.equal(reference.codebooks, initial)
    # Deliberate difference: the layers' own setting holds (the reference's forward default, False,
    # overrides it, so there ResidualVQ(freeze_codebook=True) trains its codebooks anyway).
    frozen = lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, freeze_codebook=True)
    kept = frozen.codebooks.clone()
    out, _, loss = frozen(x)
    (out.sum() + loss.sum()).backward()
    assert torch.equal(frozen.codebooks, kept)
    reference = ReferenceResidualVQ(dim=8, codebook_size=16, num_quantizers=2, freeze_codebook=True)
    kept = reference.codebooks.clone()
    out, _, loss = reference(x)
    assert not torch.equal(reference.codebooks, kept)


def test_unsupported_options_are_type_errors_naming_them():
    with pytest.raises(AssertionError):  # the reference's own refusal, with its type
        ReferenceResidualVQ(dim=8, codebook_size=16, num_quantizers=2, heads=2)
    with pytest.raises(AssertionError, match="heads"):
        lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, heads=2)
    with pytest.raises(TypeError, match="accept_3d_fmap"):  # the layers' own layout: the stack decides it
        lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, accept_3d_fmap=True)
    with pytest.raises(TypeError, match="no_such_option"):
        lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, no_such_option=1)
    with pytest.raises(TypeError, match="orthogonal_rotation"):
        lockstep.ResidualFSQ(levels=[5, 5], num_quantizers=2, orthogonal_rotation=True)
    with pytest.raises(TypeError, match="codebook_scale"):
        lockstep.ResidualLFQ(dim=4, codebook_size=16, num_quantizers=2, codebook_scale=2.0)


@pytest.mark.parametrize("reference_class, ours_class, options", [
    (ReferenceResidualVQ, lockstep.ResidualVQ, dict(dim=6, num_quantizers=3, codebook_size=16, kmeans_init=False)),
    (ReferenceResidualVQ, lockstep.ResidualVQ, dict(dim=6, num_quantizers=3, codebook_size=16, quantize_dropout=True)),
    (ReferenceResidualFSQ, lockstep.ResidualFSQ, dict(levels=[5, 5, 5], num_quantizers=3, dim=6)),
    (ReferenceResidualFSQ, lockstep.ResidualFSQ, dict(levels=[5, 5, 5], num_quantizers=3, dim=6,
                                                      quantize_dropout=True)),
    (ReferenceResidualLFQ, lockstep.ResidualLFQ, dict(dim=6, num_quantizers=3, codebook_size=16)),
], ids=["vq", "vq_dropout", "fsq", "fsq_dropout", "lfq"])
def test_return_all_codes_gives_each_layer_s_codes_as_the_reference(reference_class, ours_class, options):
    torch.manual_seed(0)
    reference, ours = reference_class(**options), ours_class(**options)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(4, 5, 6)
    # In training (with quantize dropout, some layers dropped); a backward may follow, so the state waits for it.
    ours_result = ours(x.clone().requires_grad_(True), return_all_codes=True)
    codes = ours_result[-1]
    assert codes.shape == (3, 4, 5, codes.shape[-1])
    # the reference's codes of the same indices (its own dropout draws another cutoff)
    torch.testing.assert_close(codes, reference.get_codes_from_indices(ours_result[1]), atol=1e-6, rtol=0)
    for module in (reference, ours):
        module.eval()
    expected, got = reference(x, return_all_codes=True), ours(x, return_all_codes=True)
    assert len(got) == len(expected)
    assert torch.equal(got[1], expected[1].to(got[1].dtype))
    torch.testing.assert_close(got[-1], expected[-1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("options", [dict(), dict(use_cosine_sim=True)], ids=["euclidean", "cosine"])
def test_residual_indices_give_each_layer_s_cross_entropy_at_its_residual(options):
    torch.manual_seed(0)
    reference = ReferenceResidualVQ(dim=8, num_quantizers=3, codebook_size=16, kmeans_init=False, **options)
    ours = lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, kmeans_init=False, **options)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 5, 8)
    reference.eval()
    with torch.no_grad():
        _, given, _ = reference(x)
    given[0, 0, 1] = (given[0, 0, 1] + 3) % 16  # not the nearest code: a cross entropy that is not minimal
    xs = [x.clone().requires_grad_(True) for _ in range(3)]
    # The reference's layers one by one, each at the residual the given codes before it leave.
    residual, expected = xs[0], 0.0
    for q, layer in enumerate(reference.layers):
        _, cross_entropy = layer(residual, indices=given[..., q])
        expected = expected + cross_entropy
        residual = residual - layer.codebook[given[..., q]]
    ours.eval()
    out, loss = ours(xs[1], indices=given)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ours(x)[0])  # the first value is the module's usual output
    (expected * 2).backward()
    (loss * 2).backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
    _, listed = ours(xs[2], indices=list(given.unbind(-1)))  # a list of each layer's, as the reference takes
    torch.testing.assert_close(listed, loss)
    ours.train()
    before = ours.codebooks.clone()
    _, trained = ours(x, indices=given)
    trained.backward()  # the training call's EMA update rides on the cross entropy's backward
    assert not torch.equal(ours.codebooks, before)
    with pytest.raises(ValueError, match="-1"):
        ours(x, indices=torch.where(given == given[0, 0, 0], -1, given))
    with pytest.raises(ValueError, match="shape"):
        ours(x, indices=given[..., :2])
    with pytest.raises(ValueError, match="no mask"):
        ours(x, indices=given, mask=torch.ones(2, 5, dtype=torch.bool))


def test_the_forward_takes_the_reference_s_arguments_in_order():
    rvq = lockstep.ResidualVQ(dim=4, num_quantizers=2, codebook_size=8)
    mask = torch.tensor([[True, True, False]])
    out, indices, _ = rvq(torch.randn(1, 3, 4), mask)  # positionally, as the reference's forward(x, mask)
    assert (indices[0, 2] == -1).all() and (out[0, 2] == 0).all()


@pytest.mark.parametrize("name, options", [
    ("ResidualVQ", dict(dim=4, num_quantizers=2, codebook_size=8, kmeans_init=False)),
    ("ResidualSimVQ", dict(dim=4, num_quantizers=2, codebook_size=8)),
    ("GroupedResidualVQ", dict(dim=4, groups=2, num_quantizers=2, codebook_size=8, kmeans_init=False)),
])
def test_one_token_per_item_as_the_reference_takes_it(name, options):
    import vector_quantize_pytorch as vqp
    torch.manual_seed(0)
    reference, ours = getattr(vqp, name)(**options), getattr(lockstep, name)(**options)
    ours.load_reference_state_dict(reference.state_dict())
    for module in (reference, ours):
        module.eval()
    x = torch.randn(3, 4)
    expected, got = reference(x, return_all_codes=True), ours(x, return_all_codes=True)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(got[1], expected[1])
    codes = [torch.stack(c) if isinstance(c, tuple) else c for c in (got[3], expected[3])]
    torch.testing.assert_close(codes[0], codes[1], atol=1e-6, rtol=0)
    ours.train()
    out, _, losses = ours(x.clone().requires_grad_(True))[:3]
    assert out.shape == x.shape and losses.requires_grad  # trains as tokens (b, 1, dim)


@pytest.mark.parametrize("options", [dict(beam_size=2), dict(beam_size=3, eval_beam_size=2, codebook_dim=6),
                                     dict(beam_size=2, beam_score_quantizer_weights=[1.0, 0.5, 0.25]),
                                     dict(beam_size=4, use_cosine_sim=True, quant_grad_frac=0.2)],
                         ids=["beam_2", "beam_3_projected", "weighted_scores", "beam_4_cosine_grad_frac"])
def test_beam_search_matches_the_reference(options):
    """Each token's `beam_size` best paths through the layers' codes, scored by their codes' weighted
    commitment losses: the chosen codes, output, per-layer losses and gradients of a training step, then
    evaluation (eval_beam_size) and forward's own beam_size. Each layer's EMA update takes the chosen path's
    residuals and codes; the reference updates the first layer alone (its `all_residuals[..., 0, :]` picks
    layer 0's residual, not the best path's, and the zip over layers stops there: a deliberate difference,
    docs/python/residual.md), so the codebooks are compared for layer 0, and the other layers' cluster sizes
    against the chosen codes' counts."""
    torch.manual_seed(0)
    reference = ReferenceResidualVQ(dim=12, num_quantizers=3, codebook_size=16, decay=0.5, **options)
    ours = lockstep.ResidualVQ(dim=12, num_quantizers=3, codebook_size=16, decay=0.5, **options)
    initial = {key: value.clone() for key, value in reference.state_dict().items()}
    compare_training_steps(reference, ours, (2, 30, 12), 1, ["layers.0._codebook.embed",
                                                             "layers.0._codebook.cluster_size"])
    torch.manual_seed(5)
    x = torch.randn(2, 30, 12)
    reference.load_state_dict(initial)
    ours.load_reference_state_dict(initial)
    out, idx, loss = ours(x)
    (out.sum() + loss.sum()).backward()
    for q in range(3):  # decay 0.5 of ones toward each code's count on the chosen paths
        counts = torch.bincount(idx[..., q].flatten(), minlength=16).float()
        torch.testing.assert_close(ours.state_dict()[f"layers.{q}._codebook.cluster_size"][0], 0.5 + 0.5 * counts)
    ours.load_reference_state_dict(initial)
    reference.eval()
    ours.eval()
    out_ref, idx_ref, loss_ref = reference(x)
    out, idx, loss = ours(x)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.get_output_from_indices(idx), out, atol=1e-5, rtol=1e-5)
    greedy_ref = reference(x, beam_size=1)  # forward's beam_size replaces the module's
    greedy = ours(x, beam_size=1)
    assert torch.equal(greedy[1], greedy_ref[1])
    assert not torch.equal(greedy[1], idx)  # the search chose other codes than the greedy layers


def test_a_beam_search_finds_a_path_no_worse_than_the_greedy_one():
    torch.manual_seed(1)
    rvq = lockstep.ResidualVQ(dim=8, num_quantizers=4, codebook_size=16, eval_beam_size=None, beam_size=None).eval()
    x = torch.randn(4, 50, 8)
    greedy = rvq(x)[0]
    beam = rvq(x, beam_size=4)[0]
    # the search minimises the summed per-layer losses, which for the whole path track its error
    assert (beam - x).pow(2).mean() <= (greedy - x).pow(2).mean() + 1e-6


def test_a_masked_beam_search_matches_the_reference():
    torch.manual_seed(0)
    reference = ReferenceResidualVQ(dim=12, num_quantizers=3, codebook_size=16, beam_size=2)
    ours = lockstep.ResidualVQ(dim=12, num_quantizers=3, codebook_size=16, beam_size=2)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 20, 12)
    mask = torch.rand(2, 20) > 0.4
    out_ref, idx_ref, loss_ref = reference(x, mask=mask)
    out, idx, loss = ours(x, mask=mask)
    assert torch.equal(idx, idx_ref) and (idx[~mask] == -1).all()
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    (out.sum() + loss.sum()).backward()
    for name in ("embed", "cluster_size", "embed_avg"):  # layer 0: the reference updates no other
        key = f"layers.0._codebook.{name}"
        torch.testing.assert_close(ours.state_dict()[key], reference.state_dict()[key], atol=1e-5, rtol=1e-5)
    for q in range(3):  # the padding counts in no layer's statistics
        assert float(ours.state_dict()[f"layers.{q}._codebook.cluster_size"].sum()) == pytest.approx(
            0.8 * 16 + 0.2 * float(mask.sum()), rel=1e-5)


@pytest.mark.parametrize("options", [dict(), dict(use_cosine_sim=True, commitment_weight=0.5),
                                     dict(codebook_dim=6, quant_grad_frac=0.5, rotation_trick=False)],
                         ids=["euclidean", "cosine", "projected_grad_frac"])
def test_a_shared_codebook_matches_the_reference(options):
    """shared_codebook: every layer searches one codebook; each layer's statistics move it (EMA after EMA) and
    it is recomputed once, after the last layer, as the reference's manual EMA update: indices, outputs,
    losses, gradients and the one codebook (under every layer's name) over training steps."""
    torch.manual_seed(0)
    reference = ReferenceResidualVQ(dim=12, num_quantizers=3, codebook_size=16, shared_codebook=True, decay=0.7,
                                    **options)
    ours = lockstep.ResidualVQ(dim=12, num_quantizers=3, codebook_size=16, shared_codebook=True, decay=0.7, **options)
    assert ours.get_buffer("layers.0._codebook.embed") is ours.get_buffer("layers.2._codebook.embed")
    compare_training_steps(reference, ours, (2, 30, 12), 3,
                           [f"layers.{q}._codebook.{name}" for q in range(3)
                            for name in ("embed", "embed_avg", "cluster_size")],
                           optimizer=torch.optim.Adam if ours.has_projections else None)
    ours.eval()
    out, idx, _ = ours(torch.randn(2, 30, 12))
    torch.testing.assert_close(ours.get_output_from_indices(idx), out, atol=1e-5, rtol=1e-5)
    with pytest.raises(AssertionError, match="one codebook size"):  # the reference's assertion
        lockstep.ResidualVQ(dim=12, codebook_size=(8, 16), shared_codebook=True)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_diveq_learns_every_layer_s_codebook_by_gradient_as_the_reference(training):
    """diveq: the layers output their codes (no estimator), learned by gradient (no EMA, no commitment loss,
    every layer's gradient passed on), and the stack's output is the input moved its distance to the codes'
    sum along the noised direction to it, in training and evaluation, as the reference's. The noise is each
    side's own, so indices and the output's distance to the input are compared, and the gradients' reach."""
    torch.manual_seed(0)
    reference = ReferenceResidualVQ(dim=16, num_quantizers=4, codebook_size=32, diveq=True)
    ours = lockstep.ResidualVQ(dim=16, num_quantizers=4, codebook_size=32, diveq=True)
    ours.load_reference_state_dict(reference.state_dict())
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in reference.named_parameters())
    for module in (reference, ours):
        module.train(training)
    x = torch.randn(2, 40, 16)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    out_ref, idx_ref, loss_ref = reference(xs[0])
    out, idx, loss = ours(xs[1])
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(loss, loss_ref)  # zeros: no commitment loss
    codes = ours.get_output_from_indices(idx)
    torch.testing.assert_close((out - x).norm(dim=-1), (codes - x).norm(dim=-1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close((out_ref - x).norm(dim=-1), (codes - x).norm(dim=-1), atol=1e-4, rtol=1e-4)
    assert 0 < float((out - codes).norm(dim=-1).mean()) < 0.5 * float((codes - x).norm(dim=-1).mean())
    out.sum().backward()
    out_ref.sum().backward()
    for q in range(4):  # every layer's codebook learns, as the reference's
        name = f"layers.{q}._codebook.embed"
        assert (ours.get_parameter(name).grad != 0).any() and (reference.get_parameter(name).grad != 0).any()
    assert xs[1].grad.abs().sum() > 0


def _evaluation_matches(reference, ours, x, losses=True):
    """Both modules in evaluation on x: indices, outputs and (with `losses`; a greedy reference reports none in
    evaluation) losses equal, ours decoding its indices to its output; returns (ours' indices, the reference's)."""
    reference.eval()
    ours.eval()
    out_ref, idx_ref, loss_ref = reference(x)
    out, idx, loss = ours(x)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    if losses:
        torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.get_output_from_indices(idx), out, atol=1e-5, rtol=1e-5)
    return idx, idx_ref


@pytest.mark.parametrize("options", [dict(), dict(quant_grad_frac=0.3, rotation_trick=False),
                                     dict(mlp_kwargs=dict(dim_hidden=24, depth=2), codebook_dim=8),
                                     dict(quantize_dropout=True, quantize_dropout_cutoff_index=2),
                                     dict(shared_codebook=True)],
                         ids=["default", "grad_frac", "mlp_projected", "dropout", "shared"])
def test_implicit_neural_codebooks_match_the_reference(options):
    """QINCo: each layer after the first takes, per token, its codes from its codebook and the codes before it
    through the MLP (its parameters under the reference's names, mlps.<l>...): indices, outputs, losses,
    input and parameter gradients (codebooks and MLPs) over Adam steps, then evaluation decoded from the
    indices and each layer's codes."""
    torch.manual_seed(0)
    reference = ReferenceResidualVQ(dim=12, num_quantizers=3, codebook_size=16, implicit_neural_codebook=True, **options)
    ours = lockstep.ResidualVQ(dim=12, num_quantizers=3, codebook_size=16, implicit_neural_codebook=True, **options)
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in reference.named_parameters())
    # With the cutoff index at the last layer, dropout keeps every layer (its draws are lockstep's own).
    compare_training_steps(reference, ours, (2, 20, 12), 3, [], optimizer=torch.optim.Adam)
    idx, idx_ref = _evaluation_matches(reference, ours, torch.randn(2, 20, 12), losses=False)
    torch.testing.assert_close(ours.get_codes_from_indices(idx), reference.get_codes_from_indices(idx_ref),
                               atol=1e-5, rtol=1e-5)
    if options.get("quantize_dropout"):  # coarse indices: the dropped layers contribute nothing
        coarse = idx[..., :2]
        torch.testing.assert_close(ours.get_codes_from_indices(coarse), reference.get_codes_from_indices(coarse),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options, shape", [(dict(), (2, 30, 12)), (dict(beam_size=2), (1, 30, 12))],
                         ids=["greedy", "beam"])
def test_implicit_neural_codebooks_k_means_each_layer_from_its_residual(options, shape):
    """With kmeans_init, the first training call initialises every layer's base codebook from the residual the
    layers before it leave (their MLP-made codes), as the reference's layers do before their codebook_transform_fn
    (compare_first_k_means); then trained alike."""
    torch.manual_seed(6)
    options = dict(dim=12, num_quantizers=3, codebook_size=16, implicit_neural_codebook=True, kmeans_init=True,
                   mlp_kwargs=dict(depth=1), **options)
    ours = lockstep.ResidualVQ(**options)
    x = torch.randn(*shape)
    first_call = ours(x)
    assert all(bool(layer._codebook.initted) for layer in ours.layers)
    reference = ReferenceResidualVQ(**options)
    compare_first_k_means(reference, ours, x, first_call, 3)
    compare_training_steps(reference, ours, shape, 3, [], optimizer=torch.optim.Adam)


@pytest.mark.parametrize("options", [dict(beam_size=2), dict(beam_size=3, eval_beam_size=2, quant_grad_frac=0.3),
                                     dict(beam_size=2, beam_score_quantizer_weights=[1.0, 0.5, 0.25],
                                          mlp_kwargs=dict(dim_hidden=24, depth=2))],
                         ids=["beam_2", "beam_3_grad_frac", "weighted_mlp"])
def test_implicit_neural_codebooks_with_beam_search_match_the_reference(options):
    """Beam search with QINCo's codebooks: each path's codes at a layer come from that path's sum so far through
    the MLP. The reference's works for a batch of one item alone (its MLP's condition and the codebook's
    tokens disagree in shape otherwise), so the comparison takes one: training steps (indices, outputs,
    losses, input and parameter gradients), then evaluation (eval_beam_size) and decoding."""
    torch.manual_seed(0)
    reference = ReferenceResidualVQ(dim=12, num_quantizers=3, codebook_size=16, implicit_neural_codebook=True,
                                    **options)
    ours = lockstep.ResidualVQ(dim=12, num_quantizers=3, codebook_size=16, implicit_neural_codebook=True, **options)
    compare_training_steps(reference, ours, (1, 30, 12), 3, [], optimizer=torch.optim.Adam)
    x = torch.randn(1, 30, 12)
    idx, _ = _evaluation_matches(reference, ours, x)
    greedy = ours(x, beam_size=1)[1]
    assert torch.equal(greedy, reference(x, beam_size=1)[1]) and not torch.equal(greedy, idx)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_an_implicit_beam_search_over_a_batch_searches_each_item_as_alone(training):
    """Where the reference fails (a batch of more than one item), each item's paths are its own: the batch's
    indices and outputs are each item's searched alone."""
    torch.manual_seed(1)
    rvq = lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, implicit_neural_codebook=True, beam_size=3)
    rvq.train(training)
    x = torch.randn(3, 10, 8)
    with torch.no_grad():  # a training forward without gradients changes nothing
        out, idx, _ = rvq(x)
        alone = [rvq(x[i:i + 1]) for i in range(3)]
    assert torch.equal(idx, torch.cat([a[1] for a in alone]))
    torch.testing.assert_close(out, torch.cat([a[0] for a in alone]), atol=1e-6, rtol=1e-6)
    assert not torch.equal(idx, rvq(x, beam_size=1)[1])


def test_implicit_neural_codebooks_refuse_what_the_reference_refuses():
    with pytest.raises(AssertionError):
        ReferenceResidualVQ(dim=8, num_quantizers=2, codebook_size=8, implicit_neural_codebook=True, use_cosine_sim=True)
    with pytest.raises(AssertionError, match="cosine"):
        lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=8, implicit_neural_codebook=True, use_cosine_sim=True)
    with pytest.raises(TypeError, match="mlp_kwargs"):
        lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=8, implicit_neural_codebook=True,
                            mlp_kwargs=dict(l2norm_output=True))


@pytest.mark.parametrize("reference_class, ours_class, options", [
    (ReferenceResidualFSQ, lockstep.ResidualFSQ, dict(levels=[5, 5, 5], num_quantizers=3, dim=8,
                                                      bound_hard_clamp=False, soft_clamp_input_value=1.2)),
    (ReferenceResidualFSQ, lockstep.ResidualFSQ, dict(levels=[5, 5, 5], num_quantizers=2,
                                                      bound_hard_clamp=False, soft_clamp_input_value=[1.1, 1.3, 1.5])),
    (ReferenceResidualLFQ, lockstep.ResidualLFQ, dict(dim=8, codebook_size=16, num_quantizers=3,
                                                      soft_clamp_input_value=1.5, commitment_loss_weight=0.25)),
], ids=["fsq_one_value", "fsq_per_dimension", "lfq"])
def test_a_soft_clamped_input_matches_the_reference(reference_class, ours_class, options):
    """soft_clamp_input_value: the stack's input squashed to tanh(x / c) c (residual FSQ, one c or one per
    dimension), or each LFQ layer's soft clamp c 2^-q (residual LFQ), as the reference's."""
    torch.manual_seed(0)
    reference, ours = reference_class(**options), ours_class(**options)
    compare_training_steps(reference, ours, (2, 30, options.get("dim", 3)), 2, [], scale=3.0)
    with pytest.raises(AssertionError):  # the reference's: the hard clamp sets its own
        ReferenceResidualFSQ(levels=[5, 5], num_quantizers=2, soft_clamp_input_value=1.2)
    with pytest.raises(AssertionError, match="bound_hard_clamp"):
        lockstep.ResidualFSQ(levels=[5, 5], num_quantizers=2, soft_clamp_input_value=1.2)


@pytest.mark.parametrize("options", [dict(), dict(shared_codebook=True)], ids=["greedy", "shared"])
def test_a_residual_stacks_manual_ema_update_is_the_references(options):
    """manual_ema_update=True given to ResidualVQ: each layer's training calls move its EMA statistics while its
    codebook waits for rvq.layers[q]._codebook.update_ema() (a shared codebook is refreshed by the stack after its
    last layer whatever the flag, as the reference sets it itself). 3 steps, update_ema on every layer after the
    second: indices, outputs, losses, input gradients and every layer's buffers as the reference's."""
    torch.manual_seed(7)
    options = dict(dim=8, num_quantizers=3, codebook_size=16, decay=0.8, manual_ema_update=True, **options)
    reference = ReferenceResidualVQ(**options)
    ours = lockstep.ResidualVQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    before = ours.codebooks.clone()
    for step in range(3):
        x = torch.randn(2, 20, 8)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        compare_call(reference(xs[0]), ours(xs[1]), xs, step)
        if step == 0:
            assert torch.equal(ours.codebooks, before) != bool(options.get("shared_codebook"))
        if step == 1:
            for layer_ref, layer in zip(reference.layers, ours.layers):
                layer_ref._codebook.update_ema()
                layer._codebook.update_ema()
        state = ours.state_dict()
        for key, value in reference.state_dict().items():
            if key.endswith(("_codebook.embed", "_codebook.embed_avg", "_codebook.cluster_size")):
                torch.testing.assert_close(state[key], value, atol=1e-5, rtol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


def test_a_beam_search_with_manual_ema_update_leaves_each_layers_codebook_to_update_ema():
    """With beam search the reference updates its first layer alone (test_beam_search_matches_the_reference),
    so manual_ema_update is checked against lockstep's own automatic update: a training step moves the same
    statistics and leaves every codebook; update_ema() on each layer then gives the automatic update's."""
    torch.manual_seed(8)
    options = dict(dim=8, num_quantizers=3, codebook_size=16, decay=0.8, beam_size=2)
    manual = lockstep.ResidualVQ(manual_ema_update=True, **options)
    automatic = lockstep.ResidualVQ(**options)
    automatic.load_state_dict(manual.state_dict())
    before = manual.codebooks.detach().clone()
    x = torch.randn(2, 20, 8)
    for module in (manual, automatic):
        module(x)[2].sum().backward()
    assert torch.equal(manual.codebooks, before) and not torch.equal(automatic.codebooks, before)
    for q in range(3):
        for name in ("cluster_size", "embed_avg"):
            key = f"layers.{q}._codebook.{name}"
            torch.testing.assert_close(manual.state_dict()[key], automatic.state_dict()[key])
        manual.layers[q]._codebook.update_ema()
    torch.testing.assert_close(manual.codebooks, automatic.codebooks)
