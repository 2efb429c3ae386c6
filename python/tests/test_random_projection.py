"""lockstep.RandomProjectionQuantizer beside vector-quantize-pytorch's: the same initial draws from the
same torch seed, the same indices, the same cross entropy and gradient."""
import pytest
import torch
from vector_quantize_pytorch import RandomProjectionQuantizer as Reference

import lockstep
from ranks import run_ranks


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


def test_kmeans_init_sets_the_codebook_at_the_first_call():
    # As the reference: the first call (in evaluation, as every call) runs k-means on its projected batch; the
    # codebook stays as it set it. k-means draws its own samples, so the reference is given lockstep's codebook.
    torch.manual_seed(0)
    reference = Reference(dim=12, codebook_size=8, codebook_dim=6, num_codebooks=2, kmeans_init=True)
    torch.manual_seed(0)
    ours = lockstep.RandomProjectionQuantizer(dim=12, codebook_size=8, codebook_dim=6, num_codebooks=2,
                                              kmeans_init=True)
    x = torch.randn(3, 20, 12)
    with torch.no_grad():
        indices = ours(x)
    initialised = ours.vq._codebook.embed.detach().clone()
    assert bool(ours.vq._codebook.initted) and initialised.abs().sum() > 0
    # The codes k-means found are the means of the projected tokens (cosine): every code is used.
    assert all(len(torch.unique(indices[..., h])) == 8 for h in range(2))
    reference.load_state_dict(lockstep.reference_state_dict(ours))
    assert torch.equal(indices, reference(x).to(indices.dtype))
    later = torch.randn(3, 20, 12)
    assert torch.equal(ours(later), reference(later).to(indices.dtype))
    assert torch.equal(ours.vq._codebook.embed, initialised)  # set once


def _initialised_on_ranks(rank, world, x):
    torch.manual_seed(0)
    rpq = lockstep.RandomProjectionQuantizer(dim=12, codebook_size=8, codebook_dim=6, kmeans_init=True, seed=5)
    with torch.no_grad():
        rpq(x.chunk(world)[rank])
    return rpq.vq._codebook.embed.clone()


def test_kmeans_init_over_two_ranks_sets_what_one_process_sets():
    x = torch.randn(4, 20, 12)
    one = _initialised_on_ranks(0, 1, x)
    ranks = run_ranks(2, _initialised_on_ranks, x)
    assert torch.equal(ranks[0], ranks[1])
    torch.testing.assert_close(ranks[0], one, atol=1e-5, rtol=1e-5)


def test_random_projection_quantizer_refuses_a_wrong_input_shape():
    rpq = lockstep.RandomProjectionQuantizer(dim=8, codebook_size=16, codebook_dim=4)
    with pytest.raises(ValueError, match=r"expected \(b, n, dim\)"):
        rpq(torch.randn(2, 8))


def test_kmeans_init_compiles_and_initialises_as_eager():
    made = []
    for _ in range(2):
        torch.manual_seed(0)
        made.append(lockstep.RandomProjectionQuantizer(dim=12, codebook_size=8, codebook_dim=6, kmeans_init=True,
                                                       seed=5))
    eager, compiled = made[0], torch.compile(made[1], fullgraph=True, backend="aot_eager")
    for step in range(3):  # the first call initialises (through the custom op when compiled), the others search
        x = torch.randn(3, 20, 12)
        with torch.no_grad():
            assert torch.equal(eager(x), compiled(x)), step
    assert torch.equal(made[0].vq._codebook.embed, made[1].vq._codebook.embed)
