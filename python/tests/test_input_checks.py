"""What a vector-quantize-pytorch user may pass by mistake is named, never quantized or dropped
without a word: integer input, float indices, layer arguments a residual stack decides itself, the
reference's forward keywords lockstep does not implement; and what a masked or evaluation forward
returns decodes back to exactly the same values."""
import pytest
import torch
from vector_quantize_pytorch import VectorQuantize as ReferenceVQ

import lockstep

MODULES = {
    "vq": (lambda: lockstep.VectorQuantize(dim=8, codebook_size=16), (2, 5, 8)),
    "residual-vq": (lambda: lockstep.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16), (2, 5, 8)),
    "fsq": (lambda: lockstep.FSQ(levels=[5, 5, 5], dim=8), (2, 5, 8)),
    "lfq": (lambda: lockstep.LFQ(dim=8, codebook_size=16), (2, 5, 8)),
    "simvq": (lambda: lockstep.SimVQ(dim=8, codebook_size=16), (2, 5, 8)),
    "fsp": (lambda: lockstep.FSP(levels=[5, 5, 5], dim=8), (2, 5, 8)),
    "latent": (lambda: lockstep.LatentQuantize(levels=[5, 5, 5], dim=8), (2, 8, 4, 4)),
}


@pytest.mark.parametrize("name", MODULES)
def test_integer_input_is_refused_not_returned_as_truncated_codes(name):
    make, shape = MODULES[name]
    with pytest.raises(TypeError, match="floating point, got torch.int64"):
        make()(torch.randint(-3, 4, shape))


@pytest.mark.parametrize("name", ["vq", "residual-vq", "fsq", "lfq", "simvq", "latent"])
def test_float_indices_are_refused_not_truncated(name):
    module = MODULES[name][0]().eval()
    shape = MODULES[name][1]
    _, indices, *_ = module(torch.randn(shape))
    decode = getattr(module, "get_output_from_indices", None) or module.indices_to_codes
    decode(indices)  # the module's own indices decode, also as a list
    decode(indices.tolist())
    with pytest.raises(TypeError, match="indices must be integers, got torch.float32"):
        decode(indices.float() + 0.5)


@pytest.mark.parametrize("given", [dict(num_codebooks=2), dict(keep_num_codebooks_dim=True),
                                   dict(channel_first=True), dict(return_indices=False)])
def test_residual_fsq_refuses_layer_layouts_it_would_drop(given):
    (name, value), = given.items()
    with pytest.raises(TypeError, match=f"ResidualFSQ: option {name}={value!r} is not supported"):
        lockstep.ResidualFSQ(levels=[8, 5, 5], num_quantizers=2, dim=16, **given)


@pytest.mark.parametrize("given", [dict(channel_first=True), dict(keep_num_codebooks_dim=True)])
def test_residual_lfq_refuses_layer_layouts_it_would_drop(given):
    (name, _), = given.items()
    with pytest.raises(TypeError, match=f"ResidualLFQ: option {name}=True is not supported"):
        lockstep.ResidualLFQ(dim=16, codebook_size=16, num_quantizers=2, **given)
    # Their defaults, given explicitly, change nothing.
    rlfq = lockstep.ResidualLFQ(dim=16, codebook_size=16, num_quantizers=2, **{name: False})
    assert rlfq(torch.randn(2, 5, 16))[1].shape == (2, 5, 2)


def test_a_token_layout_error_names_the_module_and_what_it_takes():
    rfsq = lockstep.ResidualFSQ(levels=[8, 5, 5], num_quantizers=2, dim=16)
    with pytest.raises(ValueError, match=r"ResidualFSQ: expected tokens \(b, n, 16\) or channel-first maps .* "
                                         r"is_channel_first=True, got shape \(2, 4, 5, 16\)"):
        rfsq(torch.randn(2, 4, 5, 16))
    grouped = lockstep.GroupedResidualFSQ(levels=[8, 5, 5], num_quantizers=2, dim=16, groups=2)
    with pytest.raises(ValueError, match=r"GroupedResidualFSQ, group 0 of 2 \(8 of the 16 features\)"):
        grouped(torch.randn(2, 4, 5, 16))
    with pytest.raises(ValueError, match=r"LatentQuantize: expected a channel-first map \(b, 8, ...\)"):
        MODULES["latent"][0]()(torch.randn(8))


def test_forward_s_positional_arguments_are_the_reference_s():
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16)
    assert vq(torch.randn(2, 5, 8), None, None, None, 2)[1].shape == (2, 5, 2)  # the reference's 5th: topk
    out, _, _, breakdown = vq(torch.randn(2, 5, 8), None, None, None, None, None, None, True)
    assert out.shape == (2, 5, 8) and breakdown.commitment.ndim == 0  # the 8th: return_loss_breakdown


def test_an_empty_batch_of_maps_quantizes_to_empty_outputs():
    vq = lockstep.VectorQuantize(dim=16, codebook_size=32, accept_image_fmap=True)
    out, indices, loss = vq(torch.randn(0, 16, 4, 4))
    assert out.shape == (0, 16, 4, 4) and indices.shape == (0, 4, 4) and loss.item() == 0.0
    fsp = lockstep.FSP(levels=[5, 5, 5], dim=8)
    assert fsp(torch.randn(0, 3, 8))[0].shape == (0, 3, 8)


@pytest.mark.parametrize("heads", [1, 2])
def test_masked_indices_decode_to_the_zeros_forward_gives_at_padding(heads):
    vq = lockstep.VectorQuantize(dim=8, codebook_size=16, heads=heads, separate_codebook_per_head=heads > 1).eval()
    x = torch.randn(2, 4, 8)
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    out, indices, _ = vq(x, mask=mask)
    assert (indices[1, 2:] == -1).all()
    assert torch.equal(vq.get_output_from_indices(indices), out)
    codes = vq.get_codes_from_indices(indices)
    assert (codes[1, 2:] == 0).all() and (codes[0] != 0).any()
    with pytest.raises(ValueError, match="-1 \\(padding\\) or lie in"):
        vq.get_output_from_indices(indices.masked_fill(indices == -1, -2))


@pytest.mark.parametrize("options", [{}, dict(use_cosine_sim=True), dict(codebook_dim=4), dict(rotation_trick=False)])
def test_evaluation_returns_the_codes_exactly_as_the_reference_does(options):
    reference = ReferenceVQ(dim=8, codebook_size=16, **options).eval()
    ours = lockstep.VectorQuantize(dim=8, codebook_size=16, **options).eval()
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 6, 8)
    out, indices, _ = ours(x)
    assert torch.equal(out, reference(x)[0])
    assert torch.equal(out, ours.get_output_from_indices(indices))
    if not options:  # the input still takes the straight-through gradient in evaluation
        x.requires_grad_(True)
        ours(x)[0].sum().backward()
        assert torch.equal(x.grad, torch.ones_like(x))
