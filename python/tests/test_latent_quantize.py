"""lockstep.LatentQuantize beside vector-quantize-pytorch's LatentQuantize: the same initial state from the
same torch seed, and over several Adam steps from the same state the same indices, outputs, losses and
gradients (reference_steps.compare_training_steps); decoding and the index helpers; refused options.
Under DDP on 2 processes: test_ddp.py."""
import pytest
import torch

import lockstep
from reference_steps import compare_training_steps

vqp = pytest.importorskip("vector_quantize_pytorch")
ReferenceLQ = vqp.LatentQuantize

CASES = [
    (dict(levels=[8, 5, 5, 5], dim=4), (2, 4, 3, 5)),
    (dict(levels=[4, 3], dim=6, num_codebooks=2), (2, 6, 7)),
    (dict(levels=[6, 5, 4], dim=16, commitment_loss_weight=0.5, quantization_loss_weight=0.0), (3, 16, 4, 4)),
    (dict(levels=5, codebook_dim=3, dim=3, keep_num_codebooks_dim=True), (2, 3, 9)),
]


@pytest.mark.parametrize("options, shape", CASES)
def test_the_same_seed_gives_the_references_initial_state(options, shape):
    torch.manual_seed(4)
    reference = vqp.LatentQuantize(**options)
    torch.manual_seed(4)
    ours = lockstep.LatentQuantize(**options)
    assert set(reference.state_dict()) == set(ours.state_dict())
    for key, value in reference.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


@pytest.mark.parametrize("options, shape", CASES)
def test_training_steps_match_the_reference(options, shape):
    torch.manual_seed(0)
    reference = vqp.LatentQuantize(**options)
    ours = lockstep.LatentQuantize(**options)
    has_parameters = any(True for _ in ours.parameters())  # the projections, when there are some
    compare_training_steps(reference, ours, shape, steps=4, optimizer=torch.optim.Adam if has_parameters else None)


def test_evaluation_returns_a_zero_loss_and_the_same_codes():
    torch.manual_seed(1)
    reference = vqp.LatentQuantize(levels=[5, 4, 3], dim=8)
    ours = lockstep.LatentQuantize(levels=[5, 4, 3], dim=8)
    ours.load_reference_state_dict(reference.state_dict())
    reference.eval()
    ours.eval()
    x = torch.randn(2, 8, 6)
    out, indices, loss = ours(x)
    ref_out, ref_indices, ref_loss = reference(x)
    assert torch.equal(indices, ref_indices) and loss.item() == ref_loss.item() == 0.0
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-6)


def test_decoding_and_index_helpers_are_the_references():
    torch.manual_seed(2)
    reference = vqp.LatentQuantize(levels=[4, 3], dim=6, num_codebooks=2)
    ours = lockstep.LatentQuantize(levels=[4, 3], dim=6, num_codebooks=2)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 6, 5)
    out, indices, _ = ours(x)
    for project_out in (True, False):
        torch.testing.assert_close(ours.indices_to_codes(indices, project_out=project_out),
                                   reference.indices_to_codes(indices, project_out=project_out))
    torch.testing.assert_close(ours.indices_to_codes(indices), out.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours.implicit_codebook, reference.implicit_codebook)
    assert torch.equal(ours.codes_to_indices(ours.implicit_codebook), torch.arange(12, dtype=torch.int32))
    assert torch.equal(ours.codes_to_indices(ours.implicit_codebook),
                       reference.codes_to_indices(reference.implicit_codebook))


def test_forms_the_reference_refuses_raise_its_exception_types():
    """Code written against the reference catches its types: levels as one int without codebook_dim
    (its repeat(-1)), a codebook_dim other than len(levels) (its first forward), a weight of None."""
    reference, ours = ReferenceLQ, lockstep.LatentQuantize
    with pytest.raises(RuntimeError):
        reference(levels=5, dim=16)
    with pytest.raises(RuntimeError, match="codebook_dim"):
        ours(levels=5, dim=16)
    made = reference(levels=[5, 5, 8], dim=3, codebook_dim=2)
    with pytest.raises(RuntimeError):
        made(torch.randn(1, 3, 4))
    with pytest.raises(RuntimeError, match="codebook_dim=2"):
        ours(levels=[5, 5, 8], dim=3, codebook_dim=2)
    for weight in ("commitment_loss_weight", "quantization_loss_weight"):
        with pytest.raises(TypeError):
            reference(levels=[5, 5], dim=2, **{weight: None})
        with pytest.raises(TypeError, match=weight):
            ours(levels=[5, 5], dim=2, **{weight: None})


@pytest.mark.parametrize("options", [dict(levels=[5, 5, 8], dim=16), dict(levels=5, dim=16, codebook_dim=3),
                                     dict(levels=[5, 5, 8], dim=16, optimize_values=False),
                                     dict(levels=[5, 5, 8], dim=16, num_codebooks=4),
                                     dict(levels=[5, 5, 5], dim=16)],
                         ids=["list", "int", "fixed_values", "codebooks", "same_levels"])
def test_every_constructor_form_of_the_reference_matches_it(options):
    """The forms of the reference's own examples and tests, on images, video and series, beside the reference
    (state dict loaded across): outputs, indices and loss."""
    torch.manual_seed(0)
    reference = ReferenceLQ(**options, commitment_loss_weight=0.1, quantization_loss_weight=0.1)
    ours = lockstep.LatentQuantize(**options, commitment_loss_weight=0.1, quantization_loss_weight=0.1)
    ours.load_state_dict(reference.state_dict())
    for shape in ((2, 16, 6, 5), (1, 16, 3, 4, 5), (2, 16, 20)):
        x = torch.randn(shape)
        out_ref, idx_ref, loss_ref = reference(x)
        out, idx, loss = ours(x)
        assert out.shape == x.shape and torch.equal(idx, idx_ref)
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, loss_ref, atol=1e-6, rtol=1e-5)
        assert torch.equal(ours.indices_to_codes(idx), out.detach()) == torch.equal(reference.indices_to_codes(idx_ref),
                                                                                    out_ref.detach())


def test_an_in_place_codebook_optimizer_is_made_over_the_values_and_moves_nothing():
    """The reference hands the values to the factory; its training forward then fails (AttributeError:
    no optimize_values). lockstep makes the optimizer the same way and never steps it: no gradient reaches
    the values through the straight-through estimator, so no step could move them."""
    made = []

    def factory(values):
        made.append(list(values))
        return torch.optim.SGD(made[-1], lr=0.5)

    reference = ReferenceLQ(levels=[5, 5], dim=2, in_place_codebook_optimizer=factory)
    with pytest.raises(AttributeError, match="optimize_values"):
        reference(torch.randn(2, 2, 7))
    ours = lockstep.LatentQuantize(levels=[5, 5], dim=2, in_place_codebook_optimizer=factory)
    assert isinstance(ours.in_place_codebook_optimizer, torch.optim.SGD)
    assert [v.shape for v in made[-1]] == [v.shape for v in made[0]] == [(5,), (5,)]
    before = [v.clone() for v in made[-1]]
    out, _, loss = ours(torch.randn(2, 2, 7, requires_grad=True))
    (out.sum() + loss).backward()
    assert all(v.grad is None for v in made[-1])
    assert all(torch.equal(b, v) for b, v in zip(before, made[-1]))
    assert made[-1][0] is ours.get_buffer("values_per_latent.0")  # the values the module quantizes with


def test_options_lockstep_cannot_run_are_refused_by_name():
    with pytest.raises(ValueError, match="level"):
        lockstep.LatentQuantize(levels=[5, 1], dim=2)
    # Without optimize_values the values are not in the state dict, as in the reference.
    assert "values_per_latent.0" not in lockstep.LatentQuantize(levels=[5, 5], dim=2, optimize_values=False).state_dict()


def test_an_even_level_that_is_no_power_of_two_gives_the_position_s_index():
    """Level 6's values are k/6 - 0.5; the reference truncates (z + (v - z)) * 6 + 3 and can land one
    index low (a deliberate difference: lockstep's index is the chosen position's, docs/python/scalar.md)."""
    ours = lockstep.LatentQuantize(levels=[6, 5], dim=2)
    codes = ours.implicit_codebook
    assert torch.equal(ours.codes_to_indices(codes), torch.arange(30, dtype=torch.int32))
    x = codes.t().unsqueeze(0)  # every code as an input, (1, 2, 30) channel first
    out, indices, _ = ours(x)
    assert torch.equal(indices[0], torch.arange(30, dtype=torch.int32))
    torch.testing.assert_close(ours.indices_to_codes(indices), out.detach())
