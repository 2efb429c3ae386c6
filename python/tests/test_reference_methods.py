"""The reference's decoding methods, beside vector-quantize-pytorch on identical state: the module loads
the reference's state dict, both quantize the same input, and each method maps the reference's
indices to what the reference's method returns (within 1e-5)."""
import pytest
import torch
from vector_quantize_pytorch import FSQ as ReferenceFSQ
from vector_quantize_pytorch import LFQ as ReferenceLFQ
from vector_quantize_pytorch import ResidualFSQ as ReferenceResidualFSQ
from vector_quantize_pytorch import ResidualLFQ as ReferenceResidualLFQ
from vector_quantize_pytorch import ResidualVQ as ReferenceResidualVQ
from vector_quantize_pytorch import VectorQuantize as ReferenceVQ

import lockstep


def _pair(reference_class, ours_class, **options):
    torch.manual_seed(0)
    reference = reference_class(**options).eval()
    ours = ours_class(**options).eval()
    ours.load_reference_state_dict(reference.state_dict())
    return reference, ours


@pytest.mark.parametrize("options, shape", [
    (dict(), (2, 30, 16)),
    (dict(codebook_dim=8), (2, 30, 16)),
    (dict(heads=2, separate_codebook_per_head=True, codebook_dim=8), (2, 30, 16)),
    (dict(heads=2, codebook_dim=8), (2, 30, 16)),
    (dict(accept_image_fmap=True), (2, 16, 6, 5)),
], ids=["plain", "codebook_dim", "heads_separate", "heads_shared", "image_fmap"])
def test_vq_codes_and_output_from_indices_match_the_reference(options, shape):
    reference, ours = _pair(ReferenceVQ, lockstep.VectorQuantize, dim=16, codebook_size=64, **options)
    x = torch.randn(*shape)
    with torch.no_grad():
        quantized, indices, _ = reference(x)
        ours_quantized, ours_indices, _ = ours(x)
        assert torch.equal(indices.long(), ours_indices.long())
        codes = ours.get_codes_from_indices(indices)
        assert torch.allclose(codes, reference.get_codes_from_indices(indices), atol=1e-5)
        output = ours.get_output_from_indices(indices)
        expected = reference.get_output_from_indices(indices)
        assert output.shape == expected.shape and torch.allclose(output, expected, atol=1e-5)
        # Forward's output, from its indices (one codebook for every head: per head, as the reference has it).
        assert torch.allclose(output.reshape(ours_quantized.shape), ours_quantized, atol=1e-5)


def test_residual_vq_codebooks_and_codes_from_indices_match_the_reference():
    reference, ours = _pair(ReferenceResidualVQ, lockstep.ResidualVQ, dim=8, num_quantizers=3, codebook_size=16,
                            quantize_dropout=True)
    assert torch.equal(ours.codebooks, reference.codebooks)
    with torch.no_grad():
        _, indices, _ = reference(torch.randn(2, 10, 8))
        for given in (indices, indices[..., :2], torch.cat([indices[..., :1], torch.full_like(indices[..., 1:], -1)], -1)):
            codes = ours.get_codes_from_indices(given)
            assert codes.shape == (3, 2, 10, 8)
            assert torch.allclose(codes, reference.get_codes_from_indices(given), atol=1e-6)
        assert torch.allclose(ours.get_output_from_indices(indices), reference.get_output_from_indices(indices),
                              atol=1e-5)
    plain = lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16)
    with pytest.raises(ValueError, match="quantize_dropout=True"):
        plain.get_codes_from_indices(indices[..., :2])


@pytest.mark.parametrize("options, shape", [
    (dict(dim=8, codebook_size=2**8), (2, 10, 8)),
    (dict(dim=16, codebook_size=2**6, codebook_scale=0.5), (2, 10, 16)),
    (dict(dim=16, codebook_size=2**4, num_codebooks=2, spherical=True), (2, 10, 16)),
    (dict(dim=8, codebook_size=2**8), (2, 8, 4, 3)),
], ids=["plain", "projected_scaled", "two_codebooks_spherical", "feature_map"])
def test_lfq_indices_to_codes_matches_the_reference(options, shape):
    reference, ours = _pair(ReferenceLFQ, lockstep.LFQ, **options)
    x = torch.randn(*shape)
    with torch.no_grad():
        quantized, indices, _ = reference(x)
        for project_out in (True, False):
            assert torch.allclose(ours.indices_to_codes(indices, project_out=project_out),
                                  reference.indices_to_codes(indices, project_out=project_out), atol=1e-5)
        assert torch.allclose(ours.indices_to_codes(indices), quantized, atol=1e-5)


@pytest.mark.parametrize("options", [
    dict(levels=[8, 5, 5, 5]),
    dict(levels=[7, 5, 4, 2], preserve_symmetry=True),
    dict(levels=[8, 6, 5], dim=12, num_codebooks=2),
], ids=["plain", "symmetric", "two_codebooks_projected"])
def test_fsq_implicit_codebook_and_codes_to_indices_match_the_reference(options):
    reference, ours = _pair(ReferenceFSQ, lockstep.FSQ, **options)
    codebook = ours.implicit_codebook
    assert codebook.shape == reference.implicit_codebook.shape and codebook.dtype == torch.float32
    assert torch.allclose(codebook, reference.implicit_codebook, atol=1e-6)
    indices = ours.codes_to_indices(reference.implicit_codebook)
    assert indices.dtype == torch.int32
    assert torch.equal(indices, reference.codes_to_indices(reference.implicit_codebook))
    assert torch.equal(indices.long(), torch.arange(ours.codebook_size))
    # Codes of a batch (b, n, codebook_dim), shuffled: each maps back to its index.
    pick = torch.randint(ours.codebook_size, (2, 9))
    assert torch.equal(ours.codes_to_indices(codebook[pick]).long(), pick)
    with pytest.raises(ValueError, match="codebook_dim"):
        ours.codes_to_indices(torch.zeros(2, len(options["levels"]) + 1))


@pytest.mark.parametrize("reference_class, ours_class, options", [
    (ReferenceResidualFSQ, lockstep.ResidualFSQ, dict(levels=[8, 5, 5], dim=12)),
    (ReferenceResidualFSQ, lockstep.ResidualFSQ, dict(levels=[7, 5, 4], dim=3)),
    (ReferenceResidualLFQ, lockstep.ResidualLFQ, dict(dim=12, codebook_size=2**5)),
    (ReferenceResidualLFQ, lockstep.ResidualLFQ, dict(dim=5, codebook_size=2**5)),
], ids=["fsq_projected", "fsq", "lfq_projected", "lfq"])
def test_residual_fsq_and_lfq_codebooks_and_codes_from_indices_match_the_reference(reference_class, ours_class,
                                                                                   options):
    reference, ours = _pair(reference_class, ours_class, num_quantizers=3, quantize_dropout=True, **options)
    assert ours.codebooks.shape == reference.codebooks.shape
    assert torch.allclose(ours.codebooks, reference.codebooks, atol=1e-6)
    with torch.no_grad():
        quantized, indices, *_ = reference(torch.randn(2, 10, options["dim"]))
        for given in (indices, indices[..., :2], torch.cat([indices[..., :1], torch.full_like(indices[..., 1:], -1)], -1)):
            codes = ours.get_codes_from_indices(given)
            assert codes.shape == reference.get_codes_from_indices(given).shape
            assert torch.allclose(codes, reference.get_codes_from_indices(given), atol=1e-6)
        # The layers' codes, summed and projected out, are forward's output.
        assert torch.allclose(ours.get_output_from_indices(indices), quantized, atol=1e-5)
        assert torch.allclose(ours.get_output_from_indices(indices), reference.get_output_from_indices(indices),
                              atol=1e-5)
    plain = ours_class(num_quantizers=3, **options)
    with pytest.raises(ValueError, match=f"lockstep.{ours_class.__name__}: .*quantize_dropout=True"):
        plain.get_codes_from_indices(indices[..., :2])
