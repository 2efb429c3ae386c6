"""lockstep.VectorQuantize(vq_bridge=module) beside vector-quantize-pytorch's: the codebook passes through
a module of the user's (run in torch at each call) before liblockstep searches, quantizes and computes the
losses on it; the codebook is then learned by gradient through the module, as the reference's
(learnable_codebook defaults to True and ema_update to False there); ResidualVQ's layers each through the one
module. Under DDP on 2 processes: test_ddp.py; under torch.compile: test_compile.py."""
import copy

import pytest
import torch
from torch import nn

import lockstep
from reference_steps import compare_first_k_means, compare_training_steps

vqp = pytest.importorskip("vector_quantize_pytorch")


def _bridge(width):
    return nn.Sequential(nn.Linear(width, width), nn.Tanh())


@pytest.mark.parametrize("options, width", [
    (dict(), 16),
    (dict(rotation_trick=False, commitment_weight=0.5), 16),
    (dict(heads=2, separate_codebook_per_head=True, codebook_dim=8), 8),
    (dict(commitment_use_cross_entropy_loss=True), 16),
], ids=["rotation", "straight_through", "heads", "cross_entropy"])
def test_a_bridged_codebook_trains_as_the_references(options, width):
    torch.manual_seed(0)
    bridge = _bridge(width)
    reference = vqp.VectorQuantize(dim=16, codebook_size=64, vq_bridge=bridge, **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, vq_bridge=copy.deepcopy(bridge), **options)
    assert set(ours.state_dict()) == set(reference.state_dict())
    assert {name for name, _ in ours.named_parameters()} == {name for name, _ in reference.named_parameters()}
    compare_training_steps(reference, ours, (2, 30, 16), 4, ["_codebook.embed"], optimizer=torch.optim.Adam)
    # Decoding takes the codebook itself, without the bridge, as the reference's does.
    indices = torch.randint(0, 64, (2, 5, 2) if options.get("heads") else (2, 5))
    torch.testing.assert_close(ours.get_output_from_indices(indices), reference.get_output_from_indices(indices))


def test_top_k_codes_of_a_bridged_codebook_are_the_references():
    torch.manual_seed(1)
    bridge = _bridge(16)
    reference = vqp.VectorQuantize(dim=16, codebook_size=64, vq_bridge=bridge)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, vq_bridge=copy.deepcopy(bridge))
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 10, 16)
    out_ref, idx_ref, loss_ref = reference(x, topk=3)
    out, idx, loss = ours(x, topk=3)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)


def test_k_means_sets_the_codebook_the_bridge_takes_in_the_first_training_call():
    # As the reference: k-means on the first training batch sets the codebook, then the bridge makes the
    # searched codes from it. k-means draws its own samples (lockstep's seed, the reference's generator), so the
    # reference is given lockstep's initialised state and must then find the same codes for the same batch.
    torch.manual_seed(2)
    bridge = _bridge(16)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=16, vq_bridge=copy.deepcopy(bridge), kmeans_init=True)
    x = torch.randn(2, 30, 16)
    ours.eval()
    ours(x)  # evaluation runs no k-means (docs/python/vq.md)
    assert not bool(ours._codebook.initted)
    ours.train()
    out, idx, loss = ours(x)
    assert bool(ours._codebook.initted) and ours.codebook.abs().sum() > 0
    reference = vqp.VectorQuantize(dim=16, codebook_size=16, vq_bridge=bridge, kmeans_init=True)
    reference.load_state_dict(lockstep.reference_state_dict(ours))
    out_ref, idx_ref, loss_ref = reference(x)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    # Then trained alike through the bridge.
    compare_training_steps(reference, ours, (2, 30, 16), 3, ["_codebook.embed"], optimizer=torch.optim.Adam)


@pytest.mark.parametrize("options, width", [
    (dict(), 16),
    (dict(codebook_dim=8, quant_grad_frac=0.5), 8),
    (dict(shared_codebook=True, commitment_weight=0.5), 16),
    (dict(beam_size=2), 16),  # each path's top-k codes of each layer's bridged codebook
    (dict(beam_size=2, eval_beam_size=3, beam_score_quantizer_weights=[1.0, 0.5, 0.25]), 16),
    (dict(codebook_size=(8, 32, 16)), 16),  # each layer its size
    (dict(codebook_size=(8, 32, 16), beam_size=2), 16),
    # QINCo's MLPs take each layer's codebook through the bridge, as the reference's codebook_transform_fn
    (dict(implicit_neural_codebook=True, mlp_kwargs=dict(depth=1)), 16),
], ids=["plain", "projected", "shared", "beam", "eval_beam_weighted", "sizes", "sizes_beam", "implicit"])
def test_residual_layers_each_take_their_codebook_through_the_one_bridge(options, width):
    # As the reference's ResidualVQ: the one module in every layer (`layers.q._codebook.vq_bridge.*`), each
    # layer's codebook through it, all trained through it.
    torch.manual_seed(3)
    bridge = _bridge(width)
    options = {**dict(num_quantizers=3, codebook_size=32), **options}
    reference = vqp.ResidualVQ(dim=16, vq_bridge=bridge, **options)
    ours = lockstep.ResidualVQ(dim=16, vq_bridge=copy.deepcopy(bridge), **options)
    assert set(ours.state_dict()) == set(reference.state_dict())
    assert {name for name, _ in ours.named_parameters()} == {name for name, _ in reference.named_parameters()}
    compare_training_steps(reference, ours, (2, 30, 16), 3, optimizer=torch.optim.Adam)
    reference.eval(), ours.eval()
    x = torch.randn(2, 7, 16)
    out_ref, idx_ref, _ = reference(x)
    out, idx, _ = ours(x)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    # Decoding takes the codebooks themselves, without the bridge, as the reference's does.
    torch.testing.assert_close(ours.get_output_from_indices(idx), reference.get_output_from_indices(idx))


@pytest.mark.parametrize("options, shape", [
    (dict(), (2, 30, 16)),
    (dict(codebook_dim=8, quant_grad_frac=0.5), (2, 30, 16)),
    (dict(shared_codebook=True), (2, 30, 16)),
    (dict(beam_size=2), (1, 30, 16)),
    (dict(codebook_size=(8, 32, 16)), (2, 30, 16)),
    (dict(implicit_neural_codebook=True, mlp_kwargs=dict(depth=1)), (2, 30, 16)),
], ids=["plain", "projected", "shared", "beam", "sizes", "implicit"])
def test_residual_layers_k_means_each_from_the_residual_their_bridged_predecessors_leave(options, shape):
    # As the reference's first training call: layer q's k-means runs on the residual that the layers before it
    # leave, each having searched its codebook through the bridge after its own k-means (compare_first_k_means),
    # then train alike.
    torch.manual_seed(4)
    bridge = nn.Sequential(nn.Linear(options.get("codebook_dim", 16), options.get("codebook_dim", 16)), nn.Tanh())
    options = {**dict(num_quantizers=3, codebook_size=16, kmeans_init=True), **options}
    ours = lockstep.ResidualVQ(dim=16, vq_bridge=copy.deepcopy(bridge), **options)
    x = torch.randn(*shape) * 2
    ours.eval()
    ours(x)  # evaluation runs no k-means (docs/python/vq.md)
    assert not any(bool(layer._codebook.initted) for layer in ours.layers)
    ours.train()
    first_call = ours(x)
    assert all(bool(layer._codebook.initted) for layer in ours.layers)
    reference = vqp.ResidualVQ(dim=16, vq_bridge=bridge, **options)
    compare_first_k_means(reference, ours, x, first_call, 1 if options.get("shared_codebook") else 3)
    compare_training_steps(reference, ours, shape, 3, optimizer=torch.optim.Adam)


def test_what_the_reference_refuses_with_a_bridge_is_refused():
    with pytest.raises(AssertionError, match="ema_update must be False"):
        lockstep.VectorQuantize(dim=16, codebook_size=64, vq_bridge=_bridge(16), ema_update=True)
    with pytest.raises(AssertionError, match="learnable_codebook must be set to True"):
        lockstep.VectorQuantize(dim=16, codebook_size=64, vq_bridge=_bridge(16), learnable_codebook=False)
    with pytest.raises(TypeError, match="vq_bridge must be a module"):
        lockstep.VectorQuantize(dim=16, codebook_size=64, vq_bridge=3)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=64, vq_bridge=nn.Linear(16, 8))
    with pytest.raises(ValueError, match=r"the shape it takes, \[1, 64, 16\], got \[1, 64, 8\]"):
        ours(torch.randn(2, 3, 16))
