"""lockstep.BinaryMapper beside vector-quantize-pytorch's: from the same torch seed the same bits, the
same one-hot, loss and gradient to the logits."""
import copy
import pickle

import pytest
import torch
from vector_quantize_pytorch import BinaryMapper as Reference

import lockstep


def _run(module, logits, seed, **kwargs):
    torch.manual_seed(seed)
    x = logits.clone().requires_grad_(True)
    one_hot, indices, aux = module(x, return_indices=True, **kwargs)
    weights = torch.linspace(-1, 1, one_hot.numel()).reshape(one_hot.shape)
    ((one_hot * weights).sum() + aux.sum()).backward()
    return one_hot.detach(), indices, aux.detach(), x.grad


@pytest.mark.parametrize("kwargs", [dict(), dict(temperature=0.5), dict(reduce_aux_kl_loss=False),
                                    dict(deterministic=True, straight_through=True)],
                         ids=["sampled", "temperature", "per_token_loss", "deterministic"])
@pytest.mark.parametrize("bits, threshold", [(8, 0.6931471805599453), (3, 0.1)])
def test_binary_mapper_matches_the_reference_in_training(kwargs, bits, threshold):
    reference = Reference(bits=bits, kl_loss_threshold=threshold)
    ours = lockstep.BinaryMapper(bits=bits, kl_loss_threshold=threshold)
    logits = torch.randn(3, 5, bits) * 2
    (one_hot_r, idx_r, aux_r, grad_r), (one_hot, idx, aux, grad) = (_run(m, logits, 7, **kwargs)
                                                                   for m in (reference, ours))
    assert torch.equal(idx, idx_r) and one_hot.shape == (3, 5, 2**bits)
    torch.testing.assert_close(one_hot, one_hot_r)
    torch.testing.assert_close(aux, aux_r, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad, grad_r, atol=1e-6, rtol=1e-5)


def test_binary_mapper_in_evaluation_and_its_helpers_match_the_reference():
    reference = Reference(bits=6, deterministic_on_eval=True).eval()
    ours = lockstep.BinaryMapper(bits=6, deterministic_on_eval=True).eval()
    logits = torch.randn(2, 7, 6)
    one_hot_r, aux_r = reference(logits)
    one_hot, aux = ours(logits)
    assert torch.equal(one_hot, one_hot_r) and float(aux) == float(aux_r) == 0.0  # no loss in evaluation
    assert torch.equal(ours(logits)[0], one_hot)  # deterministic
    _, indices, _ = ours(logits, return_indices=True)
    for kwargs in (dict(indices=indices), dict(one_hot=one_hot)):
        for sum_bits in (True, False):
            torch.testing.assert_close(ours.log_prob(logits, sum_bits=sum_bits, **kwargs),
                                       reference.log_prob(logits, sum_bits=sum_bits, **kwargs))
    torch.testing.assert_close(ours.binary_entropy(logits), reference.binary_entropy(logits))
    torch.testing.assert_close(ours.calc_aux_loss(logits), reference.calc_aux_loss(logits))
    assert torch.equal(ours.codes, reference.codes) and torch.equal(ours.power_two, reference.power_two)
    assert ours.state_dict().keys() == reference.state_dict().keys()
    for copied in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert torch.equal(copied(logits)[0], one_hot)


def test_binary_mapper_computes_in_the_logits_dtype():
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="Double"):  # the reference's straight-through fails on float64
        Reference(bits=5)(logits)
    x = logits.clone().requires_grad_(True)
    one_hot, indices, aux = lockstep.BinaryMapper(bits=5)(x, return_indices=True)
    assert one_hot.dtype == aux.dtype == torch.float64
    torch.testing.assert_close(one_hot.detach(), torch.nn.functional.one_hot(indices, 32).double())
    one_hot[..., 3].sum().backward()
    assert x.grad.dtype == torch.float64 and x.grad.abs().sum() > 0


def test_binary_mapper_refuses_what_it_cannot_map():
    with pytest.raises(ValueError, match=r"bits = 30 must lie in \[1, 24\]"):
        lockstep.BinaryMapper(bits=30)
    mapper = lockstep.BinaryMapper(bits=4)
    with pytest.raises(ValueError, match="last dimension of 4"):
        mapper(torch.randn(2, 3))
    with pytest.raises(ValueError, match="temperature"):
        mapper(torch.randn(2, 4), temperature=0.0)
    with pytest.raises(ValueError, match="not both or neither"):
        mapper.log_prob(torch.randn(2, 4))
