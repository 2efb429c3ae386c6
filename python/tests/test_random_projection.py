"""lockstep.RandomProjectionQuantizer beside vector-quantize-pytorch's: the same initial draws from the
same torch seed, the same indices, the same cross entropy and gradient."""
import pytest
import torch
from vector_quantize_pytorch import RandomProjectionQuantizer as Reference

import lockstep


@pytest.mark.parametrize("options", [dict(), dict(num_codebooks=2), dict(num_codebooks=3, norm=False)],
                         ids=["one", "two", "three_no_norm"])
def test_random_projection_quantizer_matches_the_reference(options):
    torch.manual_seed(0)
    reference = Reference(dim=12, codebook_size=16, codebook_dim=6, **options)
    torch.manual_seed(0)
    ours = lockstep.RandomProjectionQuantizer(dim=12, codebook_size=16, codebook_dim=6, **options)
    # The same draws from the same seed: the projection, then the codebooks.
    assert torch.equal(ours.rand_projs, reference.rand_projs)
    torch.testing.assert_close(ours.vq._codebook.embed, reference.vq._codebook.embed)
    ours.load_reference_state_dict(reference.state_dict())
    ours.train()  # a module in training still quantizes in evaluation, as the reference
    x = torch.randn(3, 20, 12)
    indices = ours(x)
    indices_ref = reference(x)
    assert indices.shape == indices_ref.shape
    assert torch.equal(indices, indices_ref.to(indices.dtype))
    assert torch.equal(ours.vq._codebook.embed, reference.vq._codebook.embed)  # nothing moved
    targets = torch.randint(0, 16, indices.shape)
    targets[0, :3] = -1  # ignored, as there
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    loss_ref = reference(xs[0], indices=targets)
    loss = ours(xs[1], indices=targets)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    loss_ref.backward()
    loss.backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)


def test_random_projection_quantizer_refuses_kmeans_init():
    # lockstep runs k-means only in training; this quantizer never trains: its codebook would stay zero.
    with pytest.raises(TypeError, match="kmeans_init"):
        lockstep.RandomProjectionQuantizer(dim=8, codebook_size=16, codebook_dim=4, kmeans_init=True)


def test_random_projection_quantizer_refuses_a_wrong_input_shape():
    rpq = lockstep.RandomProjectionQuantizer(dim=8, codebook_size=16, codebook_dim=4)
    with pytest.raises(ValueError, match=r"expected \(b, n, dim\)"):
        rpq(torch.randn(2, 8))
