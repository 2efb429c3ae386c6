"""lockstep.LFQ against vector_quantize_pytorch.LFQ on identical inputs and initial state."""
import pytest
import torch
from vector_quantize_pytorch import LFQ as ReferenceLFQ

import lockstep


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


@pytest.mark.parametrize(
    "option",
    [dict(soft_clamp_input_value=2.0), dict(cosine_sim_project_in=True), dict(projection_has_bias=False),
     dict(experimental_softplus_entropy_loss=True), dict(straight_through_activation=torch.nn.Tanh())],
)
def test_an_unsupported_option_is_a_type_error_naming_it(option):
    with pytest.raises(TypeError, match=next(iter(option))):
        lockstep.LFQ(dim=8, codebook_size=2**8, **option)


def test_forward_options_lockstep_does_not_take_are_type_errors():
    ours = lockstep.LFQ(codebook_size=2**4)
    x = torch.randn(1, 3, 4)
    with pytest.raises(TypeError, match="inv_temperature"):
        ours(x, inv_temperature=10.0)
    with pytest.raises(TypeError, match="return_loss_breakdown"):
        ours(x, return_loss_breakdown=True)
