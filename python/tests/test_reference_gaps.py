"""Smaller gaps a vector-quantize-pytorch user met when switching the import: one token per item, a
per-layer codebook_size, FSQ's level 2, the seed of the initial codebook, and a loss with a gradient
function whatever the input."""
import pytest
import torch
from vector_quantize_pytorch import FSQ as ReferenceFSQ
from vector_quantize_pytorch import ResidualVQ as ReferenceRVQ
from vector_quantize_pytorch import VectorQuantize as ReferenceVQ

import lockstep


def test_one_token_per_item_is_quantized_as_the_reference_does():
    reference = ReferenceVQ(dim=8, codebook_size=32)
    ours = lockstep.VectorQuantize(dim=8, codebook_size=32)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(6, 8)  # (b, d): one token per item
    reference.eval()
    ours.eval()
    out_ref, idx_ref, _ = reference(x)
    out, idx, _ = ours(x)
    assert out.shape == out_ref.shape == (6, 8) and idx.shape == idx_ref.shape == (6,)
    assert torch.equal(idx, idx_ref.to(idx.dtype))
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    ours.train()
    out, idx, loss = ours(x.clone().requires_grad_(True))  # and in training
    assert out.shape == (6, 8) and idx.shape == (6,) and loss.ndim == 0


def test_a_codebook_size_per_layer_sets_each_layer_and_the_number_of_layers():
    rvq = lockstep.ResidualVQ(dim=8, codebook_size=(5, 64, 32))  # the reference's TIGER example: no num_quantizers
    assert rvq.num_quantizers == 3 and rvq.codebook_size == 5 and rvq.codebook_sizes == (5, 64, 32)
    assert [rvq.state_dict()[f"layers.{q}._codebook.embed"].shape[-2] for q in range(3)] == [5, 64, 32]
    assert [c.shape for c in rvq.codebooks] == [(5, 8), (64, 8), (32, 8)]  # a tuple, as the reference's
    for reference_error in (lambda: ReferenceRVQ(dim=8, num_quantizers=3, codebook_size=(64, 64)),
                            lambda: ReferenceRVQ(dim=8, codebook_size=64)):
        with pytest.raises(AssertionError):
            reference_error()
    with pytest.raises(AssertionError, match="names 2 layers"):
        lockstep.ResidualVQ(dim=8, num_quantizers=3, codebook_size=(64, 64))
    with pytest.raises(AssertionError, match="num_quantizers"):
        lockstep.ResidualVQ(dim=8, codebook_size=64)


def test_fsq_refuses_a_level_of_two_without_symmetry_as_the_reference_does():
    with pytest.raises(AssertionError):
        ReferenceFSQ(levels=[2, 2, 2])
    with pytest.raises(ValueError, match="preserve_symmetry"):
        lockstep.FSQ(levels=[2, 2, 2])
    assert lockstep.FSQ(levels=[2, 2, 2], preserve_symmetry=True).codebook_size == 8


def test_seed_decides_the_initial_codebook_whatever_torch_s_generator_holds():
    torch.manual_seed(1)
    a = lockstep.VectorQuantize(dim=8, codebook_size=16, seed=5)
    torch.manual_seed(2)
    b = lockstep.VectorQuantize(dim=8, codebook_size=16, seed=5)
    c = lockstep.VectorQuantize(dim=8, codebook_size=16, seed=6)
    assert torch.equal(a._codebook.embed, b._codebook.embed)
    assert not torch.equal(a._codebook.embed, c._codebook.embed)
    state = torch.random.get_rng_state()
    lockstep.VectorQuantize(dim=8, codebook_size=16, seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)  # torch's generator is left as it was
    # Without a seed, torch's generator draws it, as in the reference.
    torch.manual_seed(3)
    d = lockstep.VectorQuantize(dim=8, codebook_size=16)
    torch.manual_seed(3)
    e = lockstep.VectorQuantize(dim=8, codebook_size=16)
    assert torch.equal(d._codebook.embed, e._codebook.embed) and d.seed == 0


@pytest.mark.parametrize("make", [lambda: lockstep.VectorQuantize(dim=8, codebook_size=16),
                                  lambda: lockstep.LFQ(dim=8, codebook_size=2**4)])
def test_a_training_loss_has_a_gradient_function_even_when_the_input_needs_none(make):
    module = make()
    before = module.step
    _, _, loss = module(torch.randn(2, 10, 8))  # an input that needs no gradient
    assert loss.requires_grad and loss.grad_fn is not None
    loss.backward()  # backward reaches the module: its step (and a VQ's EMA update) happens
    assert module.step == before + 1
