"""Training steps of a lockstep module beside its vector-quantize-pytorch counterpart, from the same
state, with every result compared after each step (the VQ-family tests share it)."""
import torch


def compare_training_steps(reference, ours, shape, steps, state_keys):
    """Both modules, from the reference's state, on the same inputs: indices equal; output, losses,
    input gradient and the `state_keys` entries of the state dicts (EMA codebooks) within 1e-5."""
    assert sorted(ours.state_dict()) == sorted(reference.state_dict())
    ours.load_state_dict(reference.state_dict())
    for step in range(steps):
        x = torch.randn(*shape)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        out_ref, idx_ref, loss_ref = reference(xs[0])
        out, idx, loss = ours(xs[1])
        assert torch.equal(idx, idx_ref.to(idx.dtype)), step
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss, loss_ref.reshape(loss.shape), atol=1e-5, rtol=1e-5)
        weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        ((out_ref * weights).sum() + loss_ref.sum()).backward()
        ((out * weights).sum() + loss.sum()).backward()
        torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-5, rtol=1e-5)
        for key in state_keys:
            torch.testing.assert_close(ours.state_dict()[key], reference.state_dict()[key], atol=1e-5, rtol=1e-5)
