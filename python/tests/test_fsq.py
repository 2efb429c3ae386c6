"""lockstep.FSQ against vector_quantize_pytorch.FSQ on identical inputs and initial state."""
import pytest
import torch
from vector_quantize_pytorch import FSQ as ReferenceFSQ

import lockstep


def pair(**kwargs):
    reference = ReferenceFSQ(**kwargs)
    ours = lockstep.FSQ(**kwargs)
    ours.load_state_dict(reference.state_dict())  # projections, when there are any
    return reference, ours


def run(module, z):
    z = z.clone().requires_grad_(True)
    out, indices = module(z)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * weights).sum().backward()
    return out.detach(), indices, z.grad


@pytest.mark.parametrize(
    "options",
    [
        dict(levels=[8, 5, 5, 5]),
        dict(levels=[7, 5, 5, 5, 5], preserve_symmetry=True),
        dict(levels=[8, 6, 5], dim=16),
        dict(levels=[5, 5, 5], num_codebooks=2, dim=6),
        dict(levels=[4, 4], num_codebooks=1, keep_num_codebooks_dim=True),
        dict(levels=[8, 5, 5, 5], bound_hard_clamp=True),
        dict(levels=[8, 6, 5], preserve_symmetry=True, bound_hard_clamp=True),
    ],
)
def test_tokens_match_the_reference(options):
    reference, ours = pair(**options)
    z = torch.randn(3, 50, reference.dim) * 2
    out_ref, idx_ref, grad_ref = run(reference, z)
    out, idx, grad = run(ours, z)
    assert out.shape == out_ref.shape and idx.shape == idx_ref.shape and idx.dtype == idx_ref.dtype
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(grad, grad_ref, atol=1e-5, rtol=1e-5)
    if reference.dim == reference.effective_codebook_dim:  # without projections the codes invert exactly
        torch.testing.assert_close(ours.indices_to_codes(idx), reference.indices_to_codes(idx_ref))


def test_feature_maps_are_channel_first_like_the_reference():
    reference, ours = pair(levels=[8, 5, 5, 5])
    z = torch.randn(2, 4, 6, 7)
    out_ref, idx_ref, grad_ref = run(reference, z)
    out, idx, grad = run(ours, z)
    assert out.shape == (2, 4, 6, 7) and idx.shape == (2, 6, 7)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(grad, grad_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.indices_to_codes(idx), reference.indices_to_codes(idx_ref))


def test_parameters_are_the_tensors_liblockstep_computes_with():
    ours = lockstep.FSQ(levels=[8, 5, 5, 5], dim=12)
    names = sorted(name for name, _ in ours.named_parameters())
    assert names == ["project_in.bias", "project_in.weight", "project_out.bias", "project_out.weight"]
    z = torch.randn(2, 10, 12)
    before, _ = ours(z)
    with torch.no_grad():
        ours.project_out.bias.add_(1.0)  # a change through Python is what the C++ forward sees
    after, _ = ours(z)
    torch.testing.assert_close(after, before + 1.0)
    (after.sum()).backward()
    assert ours.project_in.weight.grad is not None  # gradients reach the registered parameters


@pytest.mark.parametrize("options", [dict(levels=[5, 5, 5], dim=8), dict(levels=[5, 5, 5], num_codebooks=2),
                                     dict(levels=[5, 5, 5], noise_dropout=0.0, preserve_symmetry=True)],
                         ids=["projected", "two_codebooks", "symmetric"])
def test_orthogonal_rotation_matches_the_reference(options):
    """orthogonal_rotation: each codebook's vector turned by the buffer orthogonal_rot before quantization and
    back after, in liblockstep; from the reference's state, indices, output, input gradient and
    indices_to_codes equal the reference's."""
    from vector_quantize_pytorch import FSQ as ReferenceFSQ
    torch.manual_seed(0)
    reference = ReferenceFSQ(orthogonal_rotation=True, **options)
    ours = lockstep.FSQ(orthogonal_rotation=True, **options)
    assert "orthogonal_rot" in dict(ours.named_buffers())
    idx, idx_ref = _same_step_as_the_reference(reference, ours, atol=1e-5)
    torch.testing.assert_close(ours.indices_to_codes(idx), reference.indices_to_codes(idx_ref), atol=1e-5, rtol=1e-5)


def _same_step_as_the_reference(reference, ours, atol):
    """ours from the reference's state on the same tokens (2, 30, dim): indices equal, outputs within `atol`,
    input gradients of the squared output within 1e-5; returns both modules' indices."""
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(2, 30, reference.dim)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    out_ref, idx_ref = reference(xs[0])
    out, idx = ours(xs[1])
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=atol, rtol=1e-5)
    out_ref.square().sum().backward()
    out.square().sum().backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
    return idx, idx_ref


def test_orthogonal_rotation_is_fsq_s_alone_not_the_residual_stack_s():
    with pytest.raises(TypeError, match="orthogonal_rotation"):
        lockstep.ResidualFSQ(levels=[5, 5], num_quantizers=2, dim=4, orthogonal_rotation=True)


def test_bad_values_are_value_errors_with_liblockstep_s_words():
    with pytest.raises(ValueError, match="level"):
        lockstep.FSQ(levels=[1, 5])


def test_projections_without_bias_match_the_reference():
    from vector_quantize_pytorch import FSQ as ReferenceFSQ
    torch.manual_seed(0)
    reference = ReferenceFSQ(levels=[8, 5, 5], dim=10, projection_has_bias=False)
    ours = lockstep.FSQ(levels=[8, 5, 5], dim=10, projection_has_bias=False)
    assert sorted(n for n, _ in ours.named_parameters()) == ["project_in.weight", "project_out.weight"]
    _same_step_as_the_reference(reference, ours, atol=1e-6)


@pytest.mark.parametrize("module", ["FSQ", "LFQ"])
def test_force_quantization_f32_false_quantizes_in_float32_all_the_same(module):
    """A deliberate difference (docs/python/scalar.md): the reference then rounds in the input's half precision;
    lockstep's codes are the float32 path's, its output in the input's dtype."""
    make = (lambda **o: lockstep.FSQ(levels=[8, 5, 5], **o)) if module == "FSQ" else (
        lambda **o: lockstep.LFQ(codebook_size=2**6, **o))
    torch.manual_seed(0)
    forced, unforced = make(), make(force_quantization_f32=False)
    unforced.load_state_dict(forced.state_dict())
    x = torch.randn(2, 20, 3 if module == "FSQ" else 6).bfloat16()
    a, b = forced(x), unforced(x)
    assert b[0].dtype == torch.bfloat16 and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
