"""Training steps of a lockstep module beside its vector-quantize-pytorch counterpart, from the same
state, with every result compared after each step (the VQ-family tests share it)."""
import torch


def compare_training_steps(reference, ours, shape, steps, state_keys=(), scale=1.0):
    """Both modules, from the reference's state, on the same inputs (randn(shape) * scale): indices
    equal; output, losses (when the modules return them), input gradient and the `state_keys` entries
    of the state dicts (EMA codebooks) within 1e-5."""
    ours.load_reference_state_dict(reference.state_dict())
    for step in range(steps):
        x = torch.randn(*shape) * scale
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        out_ref, idx_ref, *loss_ref = reference(xs[0])
        out, idx, *loss = ours(xs[1])
        assert torch.equal(idx, idx_ref.to(idx.dtype)), step
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        assert len(loss) == len(loss_ref)
        if loss:  # per layer for the residual quantizers
            torch.testing.assert_close(loss[0], loss_ref[0].reshape(loss[0].shape), atol=1e-5, rtol=1e-5)
        loss_ref = loss_ref[0].sum() if loss_ref else 0
        loss = loss[0].sum() if loss else 0
        weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        ((out_ref * weights).sum() + loss_ref).backward()
        ((out * weights).sum() + loss).backward()
        torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
        for key in state_keys:
            torch.testing.assert_close(ours.state_dict()[key], reference.state_dict()[key], atol=1e-5, rtol=1e-5)
