"""lockstep.VectorQuantize(in_place_codebook_optimizer=...) beside vector-quantize-pytorch's: an optimizer of the
user's stepping the codebook's parameters on the in-place loss (each token's squared distance to its code). The
reference steps in forward (all-reducing the gradient there) and searches again; lockstep takes the gradient over
the global batch in the training call's backward and steps once backward has accumulated the codebook's gradient,
so the codebooks move alike while the call's output is of the codebook before its step (docs/python/vq.md). Under
DDP on 2 processes: test_ddp.py."""
import copy

import pytest
import torch
from torch import nn

import lockstep
from reference_steps import compare_call, weighted_backward

vqp = pytest.importorskip("vector_quantize_pytorch")


def adam(parameters):
    return torch.optim.Adam(parameters, lr=0.05)


def _bridge():
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh())


def _pair(**options):
    """The reference's module and lockstep's from its state, each with its in-place optimizer."""
    torch.manual_seed(0)
    bridge = options.pop("vq_bridge", None)
    bridge = bridge() if bridge is not None else None  # made from the seed: the same weights in any test order
    reference = vqp.VectorQuantize(dim=16, codebook_size=32, in_place_codebook_optimizer=adam, vq_bridge=bridge,
                                   **options)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=32, in_place_codebook_optimizer=adam,
                                   vq_bridge=copy.deepcopy(bridge), **options)
    ours.load_reference_state_dict(reference.state_dict())
    if bridge is not None:
        ours._codebook.vq_bridge.load_state_dict(reference._codebook.vq_bridge.state_dict())
    return reference, ours


def _first_search(reference, x, options):
    """The codes the reference's first search picks (before its in-place step): nearest in its codebook."""
    x = reference.project_in(x)
    codebook = reference._codebook.embed.detach()
    if reference._codebook.vq_bridge is not None:
        codebook = reference._codebook.vq_bridge(codebook).detach()
    heads = options.get("heads", 1)
    tokens = x.reshape(x.shape[0], x.shape[1], heads, -1).permute(2, 0, 1, 3).reshape(heads, -1, codebook.shape[-1])
    return torch.cdist(tokens, codebook).argmin(-1).reshape(heads, x.shape[0], x.shape[1]).permute(1, 2, 0).squeeze(-1)


LEARNABLE = dict(learnable_codebook=True, ema_update=False)


# (The reference's masked forward with heads fails in its commitment loss: no masked case with heads.)
@pytest.mark.parametrize("options, masked", [
    (LEARNABLE, False), (LEARNABLE, True),
    (dict(LEARNABLE, heads=2, separate_codebook_per_head=True, codebook_dim=8), False),
    (dict(vq_bridge=_bridge), False),
    (dict(vq_bridge=_bridge), True),
    # An EMA codebook made a parameter by the orthogonal regulariser: the gradient is taken at the codes searched,
    # before the call's EMA refresh moves them; the step lands on the refreshed codebook, as the reference's.
    (dict(orthogonal_reg_weight=0.5), False),
], ids=["learnable", "learnable-lens", "heads", "bridge", "bridge-lens", "orthogonal-ema"])
def test_the_in_place_optimizer_moves_the_codebook_as_the_references(options, masked):
    reference, ours = _pair(**options)
    names = [name for name, _ in reference._codebook.named_parameters()]
    assert names == [name for name, _ in ours._codebook.named_parameters()]
    lens = torch.tensor([20, 7]) if masked else None
    for step in range(4):
        x = torch.randn(2, 20, 16)
        expected_indices = _first_search(reference, x, options)
        out_ref, idx_ref, _, breakdown_ref = reference(x, lens=lens, return_loss_breakdown=True)
        out, idx, loss, breakdown = ours(x, lens=lens, return_loss_breakdown=True)
        # Ours are the codes before the step: the reference's first search (its output is of its second).
        kept = torch.ones(2, 20, dtype=torch.bool) if lens is None else torch.arange(20) < lens[:, None]
        assert torch.equal(idx[kept], expected_indices[kept]), step
        torch.testing.assert_close(breakdown.inplace_optimize, breakdown_ref.inplace_optimize, atol=1e-6, rtol=1e-5)
        # Backward steps the in-place optimizer (the reference stepped in forward); the gradients the caller's
        # backward leaves are the caller's and stay.
        (out.sum() + loss).backward()
        for name, parameter in ours._codebook.named_parameters():
            torch.testing.assert_close(parameter, reference._codebook.get_parameter(name), atol=1e-5, rtol=1e-5,
                                       msg=lambda m, name=name: f"step {step}, {name}: {m}")
            assert parameter.grad is not None, name
        ours.zero_grad()


@pytest.mark.parametrize("options", [
    dict(learnable_codebook=True, ema_update=False),
    dict(vq_bridge=_bridge),
], ids=["learnable", "bridge"])
def test_a_manual_update_steps_on_the_in_place_and_the_callers_gradients_as_the_references(options):
    reference, ours = _pair(manual_in_place_optimizer_update=True, **options)
    for step in range(3):
        xs = [torch.randn(2, 20, 16).requires_grad_(True)]
        xs.append(xs[0].detach().clone().requires_grad_(True))
        # Nothing stepped in forward: the reference's second search found what its first did.
        compare_call(reference(xs[0]), ours(xs[1]), xs, step)
        reference.update_in_place_optimizer()
        ours.update_in_place_optimizer()
        for name, parameter in ours._codebook.named_parameters():
            torch.testing.assert_close(parameter, reference._codebook.get_parameter(name), atol=1e-5, rtol=1e-5,
                                       msg=lambda m, name=name: f"step {step}, {name}: {m}")
            assert parameter.grad is None  # zero_grad, as the reference's


def test_a_forward_never_backwarded_and_an_evaluation_step_nothing():
    torch.manual_seed(2)
    options = dict(dim=16, codebook_size=32, learnable_codebook=True, ema_update=False, in_place_codebook_optimizer=adam)
    plain = lockstep.VectorQuantize(**options)
    previewed = copy.deepcopy(plain)
    x = torch.randn(2, 20, 16)
    before = plain.codebook.detach().clone()
    previewed(torch.randn(2, 5, 16))  # a training forward whose outputs are dropped
    previewed.eval()
    previewed(torch.randn(2, 5, 16))[2].backward()  # evaluation: no in-place loss
    assert torch.equal(previewed.codebook, before)
    previewed.train()
    for module in (plain, previewed):
        module(x)[2].backward()
    assert not torch.equal(plain.codebook, before)
    torch.testing.assert_close(previewed.codebook, plain.codebook, atol=0, rtol=0)


def test_a_copy_steps_its_own_codebook():
    torch.manual_seed(3)
    original = lockstep.VectorQuantize(dim=16, codebook_size=32, learnable_codebook=True, ema_update=False,
                                       in_place_codebook_optimizer=adam)
    original(torch.randn(2, 10, 16))[2].backward()  # the optimizer holds Adam state now
    copied = copy.deepcopy(original)
    held = [p for group in copied.in_place_codebook_optimizer.param_groups for p in group["params"]]
    assert held[0] is copied._codebook.embed and held[0] in copied.in_place_codebook_optimizer.state
    before = original.codebook.detach().clone()
    copied(torch.randn(2, 10, 16))[2].backward()
    assert torch.equal(original.codebook, before)
    assert not torch.equal(copied.codebook, before)


def test_what_the_reference_refuses_with_an_in_place_optimizer_is_refused():
    with pytest.raises(ValueError, match="empty parameter list"):  # an EMA codebook has no parameter, as there
        lockstep.VectorQuantize(dim=16, codebook_size=32, in_place_codebook_optimizer=adam)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=32, learnable_codebook=True, ema_update=False,
                                   in_place_codebook_optimizer=adam)
    with pytest.raises(AssertionError, match="topk"):
        ours(torch.randn(2, 5, 16), topk=2)
    ours.eval()
    assert ours(torch.randn(2, 5, 16), topk=2)[1].shape == (2, 5, 2)
    with pytest.raises(TypeError, match="in_place_codebook_optimizer must make an optimizer"):
        lockstep.VectorQuantize(dim=16, codebook_size=32, learnable_codebook=True, ema_update=False,
                                in_place_codebook_optimizer=torch.optim.Adam([torch.zeros(1, requires_grad=True)]))
    rvq = lockstep.ResidualVQ(dim=16, num_quantizers=2, codebook_size=32, learnable_codebook=True, ema_update=False,
                              in_place_codebook_optimizer=adam, eval_beam_size=2, beam_size=2)
    with pytest.raises(AssertionError, match="top-k"):  # a beam's top-k codes in training, as the reference
        rvq(torch.randn(2, 5, 16))
    rvq.eval()
    assert rvq(torch.randn(2, 5, 16))[1].shape == (2, 5, 2)


@pytest.mark.parametrize("layers", [2, 3])
def test_implicit_codebooks_with_an_in_place_optimizer_fail_in_training_as_the_references_and_run_elsewhere(layers):
    # The reference's in-place step of a layer after the first backwards through the graph of the layers before
    # it (its MLP's condition), which the step before freed: a RuntimeError in its forward (3 layers) or in the
    # backward after it (2). lockstep raises one in forward, naming why; evaluation and frozen training calls,
    # which take no in-place step, run as the reference's.
    torch.manual_seed(5)
    options = dict(dim=16, num_quantizers=layers, codebook_size=32, in_place_codebook_optimizer=adam,
                   implicit_neural_codebook=True, mlp_kwargs=dict(depth=1))
    reference = vqp.ResidualVQ(**options)
    ours = lockstep.ResidualVQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    x = torch.randn(2, 10, 16)
    reference.eval(), ours.eval()
    out_ref, idx_ref, _ = reference(x)
    out, idx, _ = ours(x)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    reference.train(), ours.train()
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    compare_call(reference(xs[0], freeze_codebook=True), ours(xs[1], freeze_codebook=True), xs)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out_ref, _, loss_ref = reference(x.clone().requires_grad_(True))
        weighted_backward(out_ref, loss_ref)
    with pytest.raises(RuntimeError, match="implicit_neural_codebook"):
        ours(x.clone().requires_grad_(True))


def test_a_frozen_codebook_is_not_stepped():
    torch.manual_seed(4)
    ours = lockstep.VectorQuantize(dim=16, codebook_size=32, learnable_codebook=True, ema_update=False,
                                   in_place_codebook_optimizer=adam)
    before = ours.codebook.detach().clone()
    out, _, loss, breakdown = ours(torch.randn(2, 10, 16, requires_grad=True), freeze_codebook=True,
                                   return_loss_breakdown=True)
    assert float(breakdown.inplace_optimize) == 0.0
    (out.sum() + loss).backward()
    assert torch.equal(ours.codebook, before)


def _residual_pair(**options):
    torch.manual_seed(5)
    options = dict(dim=16, num_quantizers=3, codebook_size=32, learnable_codebook=True, ema_update=False,
                   in_place_codebook_optimizer=adam, **options)
    reference = vqp.ResidualVQ(**options)
    ours = lockstep.ResidualVQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    assert len(ours.layers) == 3 and isinstance(ours.layers[2].in_place_codebook_optimizer, torch.optim.Adam)
    return reference, ours


def _layer_codebooks(module):
    return [layer._codebook.embed.detach().clone() for layer in module.layers]


def test_a_residual_stacks_manual_in_place_updates_are_the_references():
    """Each layer's optimizer, stepped by the caller after backward: nothing moves in forward, so outputs,
    indices, losses and every layer's codebook equal the reference's."""
    reference, ours = _residual_pair(manual_in_place_optimizer_update=True)
    for step in range(3):
        x = torch.randn(2, 20, 16, requires_grad=True)  # an encoder's output (the estimator's gradient path)
        out_ref, idx_ref, loss_ref = reference(x)
        out, idx, loss = ours(x)
        assert torch.equal(idx, idx_ref), step
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
        weighted_backward(out_ref, loss_ref)
        weighted_backward(out, loss)
        for module in (reference, ours):
            for layer in module.layers:
                layer.update_in_place_optimizer()
        for q, (a, b) in enumerate(zip(_layer_codebooks(ours), _layer_codebooks(reference))):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, q=q: f"step {step}, layer {q}: {m}")


def test_a_shared_codebooks_in_place_update_is_manual_and_the_first_layers_as_the_references():
    """The reference makes a shared codebook's in-place update manual: nothing steps in backward, and the first
    layer's update_in_place_optimizer() steps the one codebook on every layer's in-place gradient added to the
    caller's (the reference's other layers hold optimizers of the codebooks they had before sharing)."""
    torch.manual_seed(6)
    options = dict(dim=16, num_quantizers=3, codebook_size=32, learnable_codebook=True, ema_update=False,
                   in_place_codebook_optimizer=adam, shared_codebook=True)
    reference, ours = vqp.ResidualVQ(**options), lockstep.ResidualVQ(**options)
    ours.load_reference_state_dict(reference.state_dict())
    for step in range(3):
        xs = [torch.randn(2, 20, 16).requires_grad_(True)]
        xs.append(xs[0].detach().clone().requires_grad_(True))
        compare_call(reference(xs[0]), ours(xs[1]), xs, step)
        before = ours.layers[0]._codebook.embed.detach().clone()
        for module in (reference, ours):
            module.layers[0].update_in_place_optimizer()
        assert not torch.equal(ours.layers[0]._codebook.embed, before), step
        for q in range(3):  # one codebook, where the reference's moved
            torch.testing.assert_close(ours.layers[q]._codebook.embed, reference.layers[q]._codebook.embed,
                                       atol=1e-5, rtol=1e-5, msg=lambda m, q=q: f"step {step}, layer {q}: {m}")


def test_a_residual_stacks_layers_step_in_backward():
    """Each layer's optimizer steps in backward on its in-place gradient alone: layer 0 moves as the reference's
    (its input is the stack's; the later layers' inputs are what the reference's stepped codes leave), and the
    stack ends where the same stack stepped by hand on the in-place gradients alone ends."""
    reference, ours = _residual_pair()
    by_hand = copy.deepcopy(ours)
    for layer in by_hand.layers:  # the same optimizers, stepped by the test after each backward
        layer.in_place_codebook_optimizer = adam(layer._codebook.parameters())
    by_hand._in_place_manual = True
    by_hand = copy.deepcopy(by_hand)  # made anew: no hooks
    start = _layer_codebooks(ours)
    for step in range(3):
        x = torch.randn(2, 20, 16, requires_grad=True)
        reference(x)
        for module in (ours, by_hand):
            out, _, loss = module(x)
            (out.sum() + loss.sum()).backward()
        for layer in by_hand.layers:
            layer.zero_grad()  # the caller's gradients are not the in-place step's
            layer.update_in_place_optimizer()
        torch.testing.assert_close(ours.layers[0]._codebook.embed, reference.layers[0]._codebook.embed,
                                   atol=1e-5, rtol=1e-5)
        for q, (a, b) in enumerate(zip(_layer_codebooks(ours), _layer_codebooks(by_hand))):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=lambda m, q=q: f"step {step}, layer {q}: {m}")
    assert all(not torch.equal(a, b) for a, b in zip(_layer_codebooks(ours), start))
