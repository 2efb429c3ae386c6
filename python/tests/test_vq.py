"""lockstep.VectorQuantize against vector_quantize_pytorch.VectorQuantize: identical initial
codebook (the reference's state dict loads as is), then several training steps."""
import pytest
import torch
from vector_quantize_pytorch import VectorQuantize as ReferenceVQ

import lockstep


@pytest.mark.parametrize("options", [dict(), dict(rotation_trick=False), dict(decay=0.9, commitment_weight=0.5)])
def test_training_steps_match_the_reference_codebook_included(options):
    reference = ReferenceVQ(dim=16, codebook_size=64, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, **options)
    ours.load_state_dict(reference.state_dict())
    for step in range(4):
        x = torch.randn(2, 100, 16)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        out_ref, idx_ref, loss_ref = reference(xs[0])
        out, idx, loss = ours(xs[1])
        assert torch.equal(idx, idx_ref.to(idx.dtype)), step
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, loss_ref.reshape(loss.shape), atol=1e-5, rtol=1e-5)
        w = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        ((out_ref * w).sum() + loss_ref.sum()).backward()
        ((out * w).sum() + loss.sum()).backward()
        torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
        # the EMA-updated codebook, after every step
        torch.testing.assert_close(ours.state_dict()["_codebook.embed"], reference.state_dict()["_codebook.embed"],
                                   atol=1e-5, rtol=1e-5)


def test_unsupported_options_are_type_errors_naming_them():
    with pytest.raises(TypeError, match="learnable_codebook"):
        lockstep.VectorQuantize(dim=8, codebook_size=16, learnable_codebook=True)
    with pytest.raises(TypeError, match="sync_codebook=False"):
        lockstep.VectorQuantize(dim=8, codebook_size=16, sync_codebook=False)
    with pytest.raises(TypeError, match="affine_param"):
        lockstep.VectorQuantize(dim=8, codebook_size=16, affine_param=True)
