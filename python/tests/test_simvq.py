"""lockstep.SimVQ beside vector-quantize-pytorch's SimVQ: the same initial state from the same torch seed,
and over several Adam steps from the same state the same indices, outputs, losses, input and parameter
gradients (reference_steps.compare_training_steps), for tokens, feature maps, straight-through and a
frozen codebook of another length. Under DDP on 2 processes: test_ddp.py."""
import copy

import pytest
import torch

import lockstep
from reference_steps import compare_training_steps

vqp = pytest.importorskip("vector_quantize_pytorch")


def test_the_same_seed_gives_the_references_initial_state():
    torch.manual_seed(7)
    reference = vqp.SimVQ(dim=8, codebook_size=32, frozen_codebook_dim=5)
    torch.manual_seed(7)
    ours = lockstep.SimVQ(dim=8, codebook_size=32, frozen_codebook_dim=5)
    expected = reference.state_dict()
    assert set(expected) == set(ours.state_dict())
    for key, value in expected.items():
        assert torch.equal(ours.state_dict()[key], value), key
    torch.testing.assert_close(ours.codebook, reference.codebook)


@pytest.mark.parametrize("options, shape", [
    ({}, (2, 16, 8)),
    ({"rotation_trick": False}, (2, 16, 8)),
    ({"frozen_codebook_dim": 5, "input_to_quantize_commit_loss_weight": 0.5, "commitment_weight": 2.0}, (3, 7, 8)),
    ({"channel_first": True}, (2, 8, 4, 3)),
    ({}, (2, 4, 3, 8)),  # (b, h, w, d): the middle axes packed
])
def test_training_steps_match_the_reference(options, shape):
    torch.manual_seed(0)
    reference = vqp.SimVQ(dim=8, codebook_size=32, **options)
    ours = lockstep.SimVQ(dim=8, codebook_size=32, **options)
    compare_training_steps(reference, ours, shape, steps=4, optimizer=torch.optim.Adam)


def test_indices_to_codes_is_the_forward_value_and_reaches_the_map():
    torch.manual_seed(1)
    reference = vqp.SimVQ(dim=8, codebook_size=16, channel_first=True)
    ours = lockstep.SimVQ(dim=8, codebook_size=16, channel_first=True)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 8, 3, 3)
    out, indices, _ = ours(x)
    codes = ours.indices_to_codes(indices)
    torch.testing.assert_close(codes, out.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(codes, reference.indices_to_codes(indices), atol=1e-6, rtol=1e-6)
    codes.sum().backward()
    assert ours.code_transform.weight.grad is not None and ours.code_transform.weight.grad.abs().sum() > 0


def _transform(frozen_dim=8):
    return torch.nn.Sequential(torch.nn.Linear(frozen_dim, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8))


def _built_alike(make_reference, make_ours, seed):
    """Both modules made from torch seed `seed`: torch's generator advanced alike, the same state dict and
    parameter names. Returns (reference, ours)."""
    torch.manual_seed(seed)
    reference = make_reference()
    after_reference = torch.rand(3)
    torch.manual_seed(seed)
    ours = make_ours()
    assert torch.equal(torch.rand(3), after_reference)  # torch's generator advanced alike
    expected = reference.state_dict()
    assert set(expected) == set(ours.state_dict())
    for key, value in expected.items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert {name for name, _ in ours.named_parameters()} == {name for name, _ in reference.named_parameters()}
    return reference, ours


def test_a_codebook_transform_of_the_users_draws_and_holds_what_the_reference_does():
    reference, ours = _built_alike(
        lambda: vqp.SimVQ(dim=8, codebook_size=32, frozen_codebook_dim=5, codebook_transform=_transform(5)),
        lambda: lockstep.SimVQ(dim=8, codebook_size=32, frozen_codebook_dim=5, codebook_transform=_transform(5)), 7)
    torch.testing.assert_close(ours.codebook, reference.codebook)


@pytest.mark.parametrize("options, shape", [
    ({}, (2, 16, 8)),
    ({"rotation_trick": False, "frozen_codebook_dim": 5}, (3, 7, 8)),
    ({"channel_first": True}, (2, 8, 4, 3)),
])
def test_a_codebook_transform_of_the_users_trains_as_the_reference(options, shape):
    # The user's module runs in torch, liblockstep quantizes to its codes and returns their gradient:
    # the module's parameters get the reference's gradients, step after step.
    torch.manual_seed(0)
    transform = _transform(options.get("frozen_codebook_dim", 8))
    reference = vqp.SimVQ(dim=8, codebook_size=32, codebook_transform=transform, **options)
    ours = lockstep.SimVQ(dim=8, codebook_size=32, codebook_transform=copy.deepcopy(transform), **options)
    compare_training_steps(reference, ours, shape, steps=4, optimizer=torch.optim.Adam)
    indices = torch.randint(0, 32, (2, 5))
    torch.testing.assert_close(ours.indices_to_codes(indices), reference.indices_to_codes(indices))


def test_a_codebook_transform_giving_another_shape_is_refused_with_it():
    ours = lockstep.SimVQ(dim=8, codebook_size=16, codebook_transform=torch.nn.Linear(8, 6))
    with pytest.raises(ValueError, match=r"\(16, 8\), got \[16, 6\]"):
        ours(torch.randn(2, 3, 8))
    with pytest.raises(TypeError, match="codebook_transform must be a module"):
        lockstep.SimVQ(dim=8, codebook_size=16, codebook_transform=3)
    lockstep.SimVQ(dim=8, codebook_size=16, init_fn=vqp.sim_vq.identity)  # the reference's default is accepted


def test_a_batch_without_tokens_gives_a_zero_loss_with_a_gradient():
    """A rank whose batch is empty takes part in DDP's backward: its loss is 0, not the NaN of a mean of
    nothing (the reference's), so the averaged gradient stays finite."""
    ours = lockstep.SimVQ(dim=8, codebook_size=16)
    out, indices, loss = ours(torch.randn(0, 5, 8, requires_grad=True))
    assert out.shape == (0, 5, 8) and indices.shape == (0, 5)
    assert loss.item() == 0.0 and loss.requires_grad


@pytest.mark.parametrize("options, shape", [
    ({}, (2, 12, 8)),
    ({"rotation_trick": False, "frozen_codebook_dim": 5}, (2, 12, 8)),
    ({"channel_first": True}, (2, 8, 3, 4)),
])
def test_residual_simvq_training_steps_match_the_reference(options, shape):
    torch.manual_seed(2)
    reference = vqp.ResidualSimVQ(dim=8, num_quantizers=3, codebook_size=32, **options)
    ours = lockstep.ResidualSimVQ(dim=8, num_quantizers=3, codebook_size=32, **options)
    compare_training_steps(reference, ours, shape, steps=4, optimizer=torch.optim.Adam)


def test_residual_simvq_decodes_and_returns_all_codes_as_the_reference():
    torch.manual_seed(3)
    reference = vqp.ResidualSimVQ(dim=8, num_quantizers=3, codebook_size=16, channel_first=True)
    torch.manual_seed(3)
    ours = lockstep.ResidualSimVQ(dim=8, num_quantizers=3, codebook_size=16, channel_first=True)
    x = torch.randn(2, 8, 3, 3)
    out, indices, _, all_codes = ours(x, return_all_codes=True)
    ref_out, ref_indices, _, ref_all_codes = reference(x, return_all_codes=True)
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(all_codes, ref_all_codes, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours.codebooks, reference.codebooks, atol=0, rtol=0)
    torch.testing.assert_close(ours.get_output_from_indices(indices), reference.get_output_from_indices(indices),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.get_output_from_indices(indices), out.detach(), atol=1e-5, rtol=1e-5)


def test_residual_simvq_quantize_dropout_drops_trailing_layers_alike_for_every_token():
    ours = lockstep.ResidualSimVQ(dim=8, num_quantizers=4, codebook_size=16, quantize_dropout=True, seed=5)
    kept = set()
    for _ in range(12):
        out, indices, losses = ours(torch.randn(2, 6, 8))
        running = (indices[0, 0] >= 0).sum().item()
        assert torch.all((indices >= 0).sum(-1) == running)  # the same layers for every token
        assert torch.all(indices[..., running:] == -1) and torch.all(losses[running:] == 0)
        (out.sum() + losses.sum()).backward()  # a step: the next call draws anew
        kept.add(running)
    assert len(kept) > 1, kept
    with pytest.raises(AssertionError, match="heads"):  # the reference's assertion, with its type
        lockstep.ResidualSimVQ(dim=8, num_quantizers=2, codebook_size=16, heads=2)


def test_init_fn_shapes_the_frozen_codes_as_the_reference():
    """init_fn takes the drawn frozen codes and returns the codebook's (the same draw, then the function)."""
    from vector_quantize_pytorch import ResidualSimVQ as ReferenceResidualSimVQ
    from vector_quantize_pytorch import SimVQ as ReferenceSimVQ

    def init_fn(codes):
        return codes.sign() * 0.5

    ours = lockstep.SimVQ(dim=8, codebook_size=16, init_fn=init_fn)
    assert set(ours.frozen_codebook.unique().tolist()) == {-0.5, 0.5}
    reference = ReferenceSimVQ(dim=8, codebook_size=16, init_fn=init_fn)
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(2, 20, 8)
    out_ref, idx_ref, _ = reference(x)
    out, idx, _ = ours(x)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    stack = lockstep.ResidualSimVQ(dim=8, num_quantizers=2, codebook_size=16, init_fn=init_fn)
    assert all(set(stack.get_buffer(f"layers.{q}.frozen_codebook").unique().tolist()) == {-0.5, 0.5} for q in range(2))
    assert ReferenceResidualSimVQ(dim=8, num_quantizers=2, codebook_size=16, init_fn=init_fn)
    with pytest.raises(ValueError, match="shape"):
        lockstep.SimVQ(dim=8, codebook_size=16, init_fn=lambda codes: codes[:4])


@pytest.mark.parametrize("options, shape", [({}, (2, 16, 8)), ({"channel_first": True}, (2, 8, 4, 3))])
def test_residual_simvq_layers_share_a_codebook_transform_of_the_users_as_the_reference(options, shape):
    # The reference hands the one module to every layer: each layer's codes are it applied to that layer's
    # frozen codes, and its parameters get every layer's gradient.
    reference, ours = _built_alike(
        lambda: vqp.ResidualSimVQ(dim=8, num_quantizers=3, codebook_size=16, codebook_transform=_transform(),
                                  **options),
        lambda: lockstep.ResidualSimVQ(dim=8, num_quantizers=3, codebook_size=16, codebook_transform=_transform(),
                                       **options), 3)
    compare_training_steps(reference, ours, shape, steps=4, optimizer=torch.optim.Adam)
    indices = torch.randint(0, 16, (2, 5, 3))
    torch.testing.assert_close(ours.get_output_from_indices(indices), reference.get_output_from_indices(indices))
    torch.testing.assert_close(ours.codebooks, reference.codebooks)
