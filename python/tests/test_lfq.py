"""lockstep.LFQ against vector_quantize_pytorch.LFQ on identical inputs and initial state."""
import copy

import pytest
import torch
from vector_quantize_pytorch import LFQ as ReferenceLFQ

import lockstep
from ranks import run_ranks
from reference_steps import compare_training_steps


def run(module, x):
    """Output, indices, aux loss and, in training mode, the input's gradient."""
    x = x.clone().requires_grad_(module.training)
    out, indices, aux = module(x)
    if not module.training:  # the reference's eval output has no gradient path (no straight-through)
        return out.detach(), indices, aux.detach(), None
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    ((out * weights).sum() + aux).backward()
    return out.detach(), indices, aux.detach(), x.grad


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(
    "options",
    [
        dict(codebook_size=2**8),
        dict(dim=8, codebook_size=2**8, commitment_loss_weight=0.25, diversity_gamma=2.0),
        dict(dim=16, codebook_size=2**6),
        dict(codebook_size=2**5, num_codebooks=2, dim=10),
        dict(codebook_size=2**8, spherical=True, codebook_scale=1.0),
    ],
)
def test_tokens_match_the_reference(options, training):
    reference = ReferenceLFQ(**options)
    ours = lockstep.LFQ(**options)
    ours.load_reference_state_dict(reference.state_dict())  # projections; the mask is checked and dropped
    reference.train(training)
    ours.train(training)
    x = torch.randn(2, 40, reference.dim)
    out_ref, idx_ref, aux_ref, grad_ref = run(reference, x)
    out, idx, aux, grad = run(ours, x)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(idx, idx_ref.to(idx.dtype)) and idx.shape == idx_ref.shape
    torch.testing.assert_close(aux, aux_ref.float(), atol=1e-5, rtol=1e-5)
    if training:
        torch.testing.assert_close(grad, grad_ref, atol=1e-5, rtol=1e-5)


def test_feature_maps_are_channel_first_like_the_reference():
    reference = ReferenceLFQ(codebook_size=2**4)
    ours = lockstep.LFQ(codebook_size=2**4)
    x = torch.randn(2, 4, 5, 6)
    out_ref, idx_ref, aux_ref, grad_ref = run(reference, x)
    out, idx, aux, grad = run(ours, x)
    assert out.shape == (2, 4, 5, 6) and idx.shape == (2, 5, 6)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(idx, idx_ref.to(idx.dtype))
    torch.testing.assert_close(grad, grad_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation, options, shape", [
    (torch.nn.Tanh(), dict(codebook_size=2**8), (2, 40, 8)),
    (torch.nn.Tanh(), dict(codebook_size=2**8, commitment_loss_weight=0.3), (2, 8, 5, 4)),  # a map, channel first
    # A module with parameters, not elementwise: it sees each codebook's bits, as the reference's does.
    (torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), dict(codebook_size=2**4, num_codebooks=2),
     (2, 30, 8)),
    # The tokens made from the input first: the module sees them after the projection, clamp, rotation, sphere.
    (torch.nn.Tanh(), dict(dim=12, codebook_size=2**8, commitment_loss_weight=0.2), (2, 40, 12)),
    (torch.nn.Tanh(), dict(dim=12, codebook_size=2**8, projection_has_bias=False), (2, 12, 3, 5)),
    (torch.nn.Tanh(), dict(dim=12, codebook_size=2**8, cosine_sim_project_in=True), (2, 40, 12)),
    (torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), dict(dim=6, codebook_size=2**4, num_codebooks=2),
     (2, 30, 6)),
    (torch.nn.Tanh(), dict(dim=8, codebook_size=2**8, soft_clamp_input_value=1.5), (2, 40, 8)),
    (torch.nn.Tanh(), dict(dim=8, codebook_size=2**8, orthogonal_rotation=True), (2, 40, 8)),
    (torch.nn.Softsign(), dict(dim=10, codebook_size=2**8, spherical=True, codebook_scale=2.0), (2, 40, 10)),
], ids=["tanh", "tanh_map", "linear_per_codebook", "projected", "projected_map_no_bias", "cosine_sim_project_in",
        "linear_per_codebook_projected", "soft_clamp", "orthogonal_rotation", "spherical_projected"])
def test_a_straight_through_activation_gives_the_references_gradients(activation, options, shape):
    # The reference's act(x) + (q - act(x)).detach(): the value q, the input's gradient the module's, and the
    # module's parameters trained through it, step after step; evaluation as without it.
    torch.manual_seed(0)
    reference = ReferenceLFQ(straight_through_activation=activation, **options)
    ours = lockstep.LFQ(straight_through_activation=copy.deepcopy(activation), **options)
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in reference.named_parameters())
    trained = any(True for _ in reference.parameters())
    compare_training_steps(reference, ours, shape, steps=3, optimizer=torch.optim.Adam if trained else None)
    reference.eval(), ours.eval()
    x = torch.randn(*shape)
    assert torch.equal(ours(x)[1], reference(x)[1].to(torch.int64))


@pytest.mark.parametrize("options", [dict(dim=6, codebook_size=16, commitment_loss_weight=0.25),
                                     dict(codebook_size=2**8, num_codebooks=2, dim=16, frac_per_sample_entropy=0.5)],
                         ids=["projected", "two_codebooks_half_the_tokens"])
def test_a_calls_inv_temperature_gives_the_references_loss_breakdown_and_gradient(options):
    torch.manual_seed(0)
    reference, ours = ReferenceLFQ(**options), lockstep.LFQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(3, 5, options["dim"])
    xs = [x.clone().requires_grad_(True) for _ in range(3)]
    (_, _, aux_ref), expected = reference(xs[0], inv_temperature=2.0, return_loss_breakdown=True)
    (_, _, aux), got = ours(xs[1], inv_temperature=2.0, return_loss_breakdown=True)
    if options.get("frac_per_sample_entropy", 1) == 1:  # the reference draws its subset from torch's generator
        torch.testing.assert_close(aux, aux_ref, atol=1e-5, rtol=1e-5)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        aux_ref.backward(), aux.backward()
        torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
    # The call's temperature acts for that call alone, as a module made with it.
    made_with = lockstep.LFQ(inv_temperature=2.0, **options)
    made_with.load_state_dict(ours.state_dict())
    made_with.step = ours.step = 0
    torch.testing.assert_close(ours(x, inv_temperature=2.0)[2], made_with(x)[2], atol=0, rtol=0)
    assert ours(x)[2].item() != made_with(x)[2].item()
    with pytest.raises(ValueError, match="inv_temperature"):
        ours(x, inv_temperature=0.0)


def test_a_calls_own_inv_temperature_compiles_and_another_runs_eagerly_only():
    lfq = lockstep.LFQ(dim=6, codebook_size=16, inv_temperature=50.0)
    compiled = torch.compile(lfq, fullgraph=True)
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(compiled(x, inv_temperature=50.0)[2], lfq(x)[2], atol=1e-6, rtol=1e-6)
    with pytest.raises(Exception, match="inv_temperature"):
        compiled(x, inv_temperature=2.0)


def _temperature_ranks(rank, world, x):
    called = lockstep.LFQ(dim=6, codebook_size=16, seed=4, collective_timeout=20.0)
    made = lockstep.LFQ(dim=6, codebook_size=16, seed=4, collective_timeout=20.0, inv_temperature=3.0)
    made.load_state_dict(called.state_dict())
    grads = []
    for module, call in ((called, dict(inv_temperature=3.0)), (made, {})):
        part = x.chunk(world)[rank].clone().requires_grad_(True)
        module(part, **call)[2].backward()  # the entropy statistics reduced over the ranks, in backward
        grads.append(part.grad)
    return grads


def test_on_two_ranks_a_calls_inv_temperature_reduces_as_the_option():
    x = torch.randn(4, 8, 6)
    for called, made in run_ranks(2, _temperature_ranks, x):
        torch.testing.assert_close(called, made, atol=0, rtol=0)


@pytest.mark.parametrize("options", [dict(dim=6, codebook_size=16, commitment_loss_weight=0.25),
                                     dict(dim=8, codebook_size=16, num_codebooks=2, commitment_loss_weight=1.0),
                                     dict(dim=4, codebook_size=16, spherical=True, diversity_gamma=0.5)],
                         ids=["projected", "two_codebooks", "spherical_no_commitment"])
def test_return_loss_breakdown_gives_the_reference_s_unweighted_terms(options):
    torch.manual_seed(0)
    reference, ours = ReferenceLFQ(**options), lockstep.LFQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(3, 5, options["dim"])
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    (_, _, aux_ref), expected = reference(xs[0], return_loss_breakdown=True)
    (_, _, aux), got = ours(xs[1], return_loss_breakdown=True)
    assert type(got).__name__ == "LossBreakdown" and got._fields == expected._fields
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aux, aux_ref, atol=1e-5, rtol=1e-5)
    sum(expected).backward()
    sum(got).backward()  # unweighted terms: gradients of norm ~1, rounding ~2e-5
    torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-4, rtol=1e-4)
    for module in (reference, ours):
        module.eval()
    assert all(float(t) == 0 for t in ours(x, return_loss_breakdown=True)[1])  # zeros in evaluation, as there


def _weighted(terms, entropy_weight, gamma, commitment_weight):
    return entropy_weight * (terms.per_sample_entropy - gamma * terms.batch_entropy) + commitment_weight * terms.commitment


def test_the_breakdown_counts_the_tokens_the_call_counted():
    # With a mask and an entropy subset, the weighted terms are the call's own loss: the same tokens.
    lfq = lockstep.LFQ(dim=6, codebook_size=16, commitment_loss_weight=0.3, entropy_loss_weight=0.2,
                       diversity_gamma=0.7, frac_per_sample_entropy=0.5, seed=4)
    x, mask = torch.randn(4, 9, 6), torch.rand(4, 9) > 0.3
    for step in range(3):
        (_, _, aux), terms = lfq(x, mask=mask, return_loss_breakdown=True)
        torch.testing.assert_close(_weighted(terms, 0.2, 0.7, 0.3), aux, atol=1e-6, rtol=1e-6)
        aux.backward()
    assert lfq.step == 3


def _breakdown_ranks(rank, world, x):
    lfq = lockstep.LFQ(dim=6, codebook_size=16, commitment_loss_weight=0.3, frac_per_sample_entropy=0.5, seed=4,
                       collective_timeout=20.0)
    (_, _, aux), terms = lfq(x.chunk(world)[rank], return_loss_breakdown=True)
    aux.backward()  # the statistics' reduction over the ranks, in backward
    return aux.detach(), _weighted(terms, 0.1, 1.0, 0.3).detach()


def test_on_two_ranks_each_rank_s_breakdown_is_of_its_own_tokens():
    # Each rank's subset is drawn by its tokens' global positions; its breakdown is of those tokens, as
    # the loss value it returns (docs/python/distributed.md: forward returns the rank's own values).
    for aux, weighted in run_ranks(2, _breakdown_ranks, torch.randn(4, 8, 6)):
        torch.testing.assert_close(weighted, aux, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("options", [dict(), dict(frac_per_sample_entropy=0.5), dict(spherical=True),
                                     dict(codebook_size=2**8, num_codebooks=2, dim=16)],
                         ids=["plain", "half_the_tokens", "spherical", "two_codebooks"])
@pytest.mark.parametrize("items", [[False, False], [True, False], [True, True]], ids=["none", "one", "both"])
def test_a_mask_of_items_keeps_them_out_of_the_losses_as_the_reference(options, items):
    """The reference's masked LFQ takes a mask of the batch's items, (b,), for images too (its own test,
    test_lfq.py): masked items are quantized as any, and count in neither entropy nor commitment."""
    options = {"codebook_size": 2**16, "dim": 16, "entropy_loss_weight": 0.1, "commitment_loss_weight": 0.25,
               **options}
    torch.manual_seed(0)
    reference, ours = ReferenceLFQ(**options), lockstep.LFQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    mask = torch.tensor(items)
    x = torch.randn(2, 16, 6, 5)
    (out_ref, idx_ref, _), terms_ref = reference(x, return_loss_breakdown=True, mask=mask)
    (out, idx, aux), terms = ours(x, return_loss_breakdown=True, mask=mask)
    assert torch.equal(idx, idx_ref.to(idx.dtype)) and (out == ours.indices_to_codes(idx)).all()
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    if not any(items):  # nothing counts: zero terms (the reference's mean of nothing is nan)
        assert all(float(t) == 0 for t in terms) and float(aux) == 0
        return
    kept = x[mask]  # the counted items alone, unmasked: what the masked call's terms are
    (_, _, aux_kept), terms_kept = ours(kept, return_loss_breakdown=True)
    if options.get("frac_per_sample_entropy", 1) == 1:
        torch.testing.assert_close(terms.per_sample_entropy, terms_ref.per_sample_entropy, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(terms.batch_entropy, terms_ref.batch_entropy, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(terms.commitment, terms_ref.commitment, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(aux, aux_kept, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(terms.commitment, terms_kept.commitment, atol=1e-6, rtol=1e-5)


def _brute_force_per_sample_entropy(module, tokens, inv_temperature=100.0):
    """mean over tokens of H(softmax over every code of 2 inv_t <z, c>), the reference's formula without its
    log clamp, from the whole (K, bits) codebook: tokens (N, dim) already in code space."""
    bits = int(module.codebook_size).bit_length() - 1
    codes = ((torch.arange(module.codebook_size)[:, None] >> torch.arange(bits - 1, -1, -1)) & 1) * 2.0 - 1.0
    logits = 2 * inv_temperature * tokens.double() @ (codes.double() * module._code_value).t()
    p = logits.softmax(-1)
    return -(p * logits.log_softmax(-1)).sum(-1).mean()


@pytest.mark.parametrize("masked", [False, True])
def test_a_fraction_of_tokens_gives_the_brute_force_entropy_of_exactly_those_tokens(masked):
    """frac_per_sample_entropy < 1: the per-sample entropy is the brute-force value over the tokens the call
    drew (entropy_subset names them), to 1e-5; about that share of the counted tokens is drawn, and the
    next step draws others."""
    torch.manual_seed(0)
    ours = lockstep.LFQ(codebook_size=2**10, entropy_loss_weight=0.1, frac_per_sample_entropy=0.1, seed=3)
    x = torch.randn(2, 10, 16, 16)
    mask = torch.tensor([True, False]) if masked else None
    (_, _, _), terms = ours(x, return_loss_breakdown=True, mask=mask)
    tokens = x.movedim(1, -1).reshape(2, -1, 10)
    token_mask = None if mask is None else mask[:, None].expand(2, tokens.shape[1])
    assert ours.step == 1  # nothing here can be backwarded: the call was a whole step, drawn at step 0
    subset = ours._core.entropy_subset(tokens, ours.seed, torch.tensor(0), None, token_mask)
    counted = tokens.shape[1] * (1 if masked else 2)
    assert 0.05 * counted < int(subset.sum()) < 0.15 * counted
    if masked:
        assert not subset[1].any()
    expected = _brute_force_per_sample_entropy(ours, tokens[subset])
    torch.testing.assert_close(terms.per_sample_entropy.double(), expected, atol=1e-5, rtol=1e-5)
    assert not torch.equal(ours._core.entropy_subset(tokens, ours.seed, ours._steps, None, token_mask), subset)


@pytest.mark.parametrize("options", [dict(dim=12, projection_has_bias=False), dict(dim=8, has_projections=True),
                                     dict(dim=12, soft_clamp_input_value=1.5, commitment_loss_weight=0.3),
                                     dict(experimental_softplus_entropy_loss=True, entropy_loss_offset=2.0),
                                     dict(experimental_softplus_entropy_loss=True, spherical=True),
                                     dict(dim=12, orthogonal_rotation=True, commitment_loss_weight=0.3),
                                     dict(orthogonal_rotation=True, spherical=True, num_codebooks=2),
                                     dict(dim=12, cosine_sim_project_in=True),
                                     dict(dim=12, cosine_sim_project_in=True, cosine_sim_project_in_scale=3.0,
                                          spherical=True)],
                         ids=["no_bias", "forced_projections", "soft_clamp", "softplus", "softplus_spherical",
                              "rotation", "rotation_spherical", "cosine_project_in", "cosine_project_in_scaled"])
def test_options_once_refused_match_the_reference(options):
    """projection_has_bias=False, has_projections=True (dim equal to the code space), soft_clamp_input_value
    and the softplus entropy: output, indices, loss and input gradient in training, from the same state."""
    torch.manual_seed(0)
    reference = ReferenceLFQ(codebook_size=2**8, **options)
    ours = lockstep.LFQ(codebook_size=2**8, **options)
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in reference.named_parameters())
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 40, reference.dim)
    out_ref, idx_ref, aux_ref, grad_ref = run(reference, x)
    out, idx, aux, grad = run(ours, x)
    assert torch.equal(idx, idx_ref.to(idx.dtype))
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aux, aux_ref.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, grad_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options", [dict(dim=12), dict(spherical=True, num_codebooks=2)], ids=["projected", "spherical"])
def test_orthogonal_rotation_turns_decoded_codes_back_as_the_reference(options):
    torch.manual_seed(0)
    reference = ReferenceLFQ(codebook_size=2**6, orthogonal_rotation=True, **options)
    ours = lockstep.LFQ(codebook_size=2**6, orthogonal_rotation=True, **options)
    ours.load_reference_state_dict(reference.state_dict())
    _, idx_ref, _ = reference.eval()(torch.randn(2, 12, reference.dim))
    for project_out in (True, False):
        torch.testing.assert_close(ours.indices_to_codes(idx_ref, project_out=project_out),
                                   reference.indices_to_codes(idx_ref, project_out=project_out), atol=1e-5, rtol=1e-5)
    with pytest.raises(TypeError, match="orthogonal_rotation"):
        lockstep.ResidualLFQ(dim=6, num_quantizers=2, codebook_size=2**6, orthogonal_rotation=True)
