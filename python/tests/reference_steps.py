"""Training steps of a lockstep module beside its vector-quantize-pytorch counterpart, from the same
state, with every result compared after each step (the VQ-family tests share it)."""
import torch
from vector_quantize_pytorch.vector_quantize_pytorch import orthogonal_loss_fn

import lockstep


def weighted_backward(out, loss):
    """Backward of the output times a fixed weight (each element its own) plus the losses summed: the same
    gradient for both modules, whatever their shapes."""
    ((out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum() + loss.sum()).backward()


def compare_call(results_ref, results, xs, step=None):
    """One call of each module, (out, indices, loss) on its copy of the input (xs: the reference's, then ours):
    indices equal, output and loss within 1e-5; then the same weighted backward of both and the input gradients
    within 1e-5."""
    (out_ref, idx_ref, loss_ref), (out, idx, loss) = results_ref, results
    assert torch.equal(idx, idx_ref), step
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    weighted_backward(out_ref, loss_ref)
    weighted_backward(out, loss)
    torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)


def backward_and_compare_gradients(reference, ours, xs, out_ref, out, loss_ref, loss, optimizers=(), rtol=1e-5,
                                   step=None):
    """Backward of the same weighted sum of both modules' outputs plus their losses; the input gradients
    (xs: the reference's input, then ours) within 1e-5 absolute, each parameter's within 5e-5 (it sums
    over every token), both `rtol` relative; then a step of each optimizer."""
    weighted_backward(out_ref, torch.as_tensor(loss_ref))
    weighted_backward(out, torch.as_tensor(loss))
    torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=rtol)
    reference_parameters = dict(reference.named_parameters())
    for name, parameter in ours.named_parameters():
        if parameter.grad is not None or reference_parameters[name].grad is not None:
            torch.testing.assert_close(parameter.grad, reference_parameters[name].grad, atol=5e-5, rtol=rtol,
                                       msg=lambda m, name=name: f"step {step}, {name}: {m}")
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()


def compare_training_steps(reference, ours, shape, steps, state_keys=(), scale=1.0, orthogonal=None,
                           optimizer=None):
    """Both modules, from the reference's state, on the same inputs (randn(shape) * scale): indices
    equal; output, losses (when the modules return them), input gradients and the `state_keys`
    entries of the state dicts (EMA codebooks) within 1e-5, parameter gradients within 5e-5.

    `orthogonal`: (weight, codebooks(reference) -> each layer's codebook[, taken(codebook, indices) -> the
    codes the regulariser takes]) when the orthogonal regulariser is on. lockstep's EMA update waits for
    backward, so the regulariser's value is of the codebook before the step's update; the reference's after
    it (docs/python/vq.md). The expected loss is the reference's with that term taken before. `optimizer`: a
    torch.optim class stepping both modules' parameters (a learnable codebook among them) after each
    backward."""
    ours.load_reference_state_dict(reference.state_dict())
    optimizers = [optimizer(m.parameters(), lr=1e-2) for m in (reference, ours)] if optimizer else []
    for step in range(steps):
        x = torch.randn(*shape) * scale
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        if orthogonal:
            taken = orthogonal[2] if len(orthogonal) > 2 else (lambda codebook, indices: codebook)
            before = [c.detach().clone() for c in orthogonal[1](reference)]
        out_ref, idx_ref, *loss_ref = reference(xs[0])
        out, idx, *loss = ours(xs[1])
        assert torch.equal(idx, idx_ref.to(idx.dtype)), step
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        assert len(loss) == len(loss_ref)
        if loss:  # per layer for the residual quantizers
            expected = loss_ref[0].detach()
            if orthogonal:
                after = torch.stack([orthogonal_loss_fn(taken(c.detach(), idx_ref)) for c in orthogonal[1](reference)])
                before = torch.stack([orthogonal_loss_fn(taken(c, idx_ref)) for c in before])
                expected = expected - orthogonal[0] * (after - before).reshape(expected.shape)
            torch.testing.assert_close(loss[0].detach(), expected.reshape(loss[0].shape), atol=1e-5, rtol=1e-5)
        loss_ref = loss_ref[0].sum() if loss_ref else 0
        loss = loss[0].sum() if loss else 0
        backward_and_compare_gradients(reference, ours, xs, out_ref, out, loss_ref, loss, optimizers, step=step)
        for key in state_keys:
            torch.testing.assert_close(ours.state_dict()[key], reference.state_dict()[key], atol=1e-5, rtol=1e-5)


def compare_first_k_means(reference, ours, x, first_call, layers):
    """lockstep's residual stack `ours` has just run its first training call on x (`first_call`: its out, indices,
    losses), its layers initialised by k-means, whose samples are its own draws: the reference, given that state,
    must take at each of the first `layers` layers the input whose sum the layer's k-means statistics hold (a
    centre's sum is its points', so the codes' sums are the data's), then find the same codes, output and losses
    for x."""
    reference.load_state_dict(lockstep.reference_state_dict(ours))
    inputs = []
    hooks = [layer.register_forward_pre_hook(lambda module, args: inputs.append(args[0].detach()))
             for layer in reference.layers]
    out_ref, idx_ref, loss_ref = reference(x)
    for hook in hooks:
        hook.remove()
    for q in range(layers):
        sums = ours.state_dict()[f"layers.{q}._codebook.embed_avg"].sum(dim=(0, 1))
        torch.testing.assert_close(sums, inputs[q].reshape(-1, inputs[q].shape[-1]).sum(0), atol=1e-3, rtol=1e-4)
    out, idx, loss = first_call
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
