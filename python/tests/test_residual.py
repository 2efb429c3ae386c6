"""lockstep.ResidualVQ against vector_quantize_pytorch.ResidualVQ: identical initial codebooks (the
reference's state dict loads as is), then several training steps."""
import pytest
import torch
from vector_quantize_pytorch import ResidualVQ as ReferenceResidualVQ

import lockstep


@pytest.mark.parametrize("options", [dict(), dict(rotation_trick=False, decay=0.9)])
def test_training_steps_match_the_reference_codebooks_included(options):
    reference = ReferenceResidualVQ(dim=12, codebook_size=32, num_quantizers=3, **options)
    ours = lockstep.ResidualVQ(dim=12, codebook_size=32, num_quantizers=3, **options)
    assert sorted(ours.state_dict()) == sorted(reference.state_dict())
    ours.load_state_dict(reference.state_dict())
    for step in range(3):
        x = torch.randn(2, 50, 12)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        out_ref, idx_ref, losses_ref = reference(xs[0])
        out, idx, losses = ours(xs[1])
        assert torch.equal(idx, idx_ref.to(idx.dtype)), step
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(losses, losses_ref.reshape(losses.shape), atol=1e-5, rtol=1e-5)
        w = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        ((out_ref * w).sum() + losses_ref.sum()).backward()
        ((out * w).sum() + losses.sum()).backward()
        torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
        for q in range(3):
            key = f"layers.{q}._codebook.embed"
            torch.testing.assert_close(ours.state_dict()[key], reference.state_dict()[key], atol=1e-5, rtol=1e-5)


def test_unsupported_options_are_type_errors_naming_them():
    with pytest.raises(TypeError, match="shared_codebook"):
        lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, shared_codebook=True)
    with pytest.raises(TypeError, match="learnable_codebook"):
        lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, learnable_codebook=True)
    with pytest.raises(TypeError, match="no_such_option"):
        lockstep.ResidualVQ(dim=8, codebook_size=16, num_quantizers=2, no_such_option=1)
