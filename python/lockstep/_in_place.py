"""The reference's in_place_codebook_optimizer (VectorQuantize's, and each layer's of ResidualVQ): an
optimizer of a codebook's parameters stepped on the in-place loss. liblockstep's VQ sums that loss's gradient
over the global batch in each training call's backward (Vq::keep_in_place_gradient); the optimizer steps on it
once backward has accumulated the codebook's gradient, or when the caller asks (manual). docs/python/vq.md."""
import weakref
from collections import defaultdict

import torch


def parameters_of(optimizer):
    return [p for group in optimizer.param_groups for p in group["params"]]


def gradients(optimizer, grad, codebook):
    """{parameter: gradient} of the in-place loss for the optimizer's parameters, from liblockstep's gradient
    `grad` at the codes (None: none) through `codebook`'s vq_bridge when it has one."""
    if grad is None:
        return None
    embed = codebook.embed
    bridge = codebook._modules.get("vq_bridge")
    wanted = [p for p in parameters_of(optimizer) if p.requires_grad]
    if bridge is None:
        return {p: grad for p in wanted if p is embed}
    with torch.enable_grad():
        bridged = bridge(embed)
        grads = torch.autograd.grad(bridged, wanted, grad.to(bridged.dtype), allow_unused=True)
    return {p: g for p, g in zip(wanted, grads) if g is not None}


def step_alone(optimizer, grads):
    """A step on `grads` alone, as the reference's step in forward takes it: the gradients backward is
    accumulating for the caller's optimizer are set aside meanwhile, then put back."""
    if grads is None:
        return
    params = parameters_of(optimizer)
    kept = [p.grad for p in params]
    try:
        for p in params:
            p.grad = grads.get(p)
        optimizer.step()
    finally:
        for p, grad in zip(params, kept):
            p.grad = grad


def add_and_step(optimizer, grads):
    """The reference's update_in_place_optimizer: `grads` added to the parameters' gradients, a step, zero_grad."""
    for p, grad in (grads or {}).items():
        p.grad = grad if p.grad is None else p.grad + grad
    optimizer.step()
    optimizer.zero_grad()


def after_backward(embed, owner, method, *args):
    """Calls owner.method(*args) each time backward has accumulated `embed`'s gradient (every use of the
    codebook in that graph done). A weak reference: a strong one would make the module and its codebook a
    cycle. Returns the hook's handle."""
    owner = weakref.ref(owner)

    def hook(_):
        module = owner()
        if module is not None:
            getattr(module, method)(*args)

    return embed.register_post_accumulate_grad_hook(hook)


def rebind(optimizer, params):
    """The optimizer of a copied module, whose parameters the copy made anew (liblockstep's tensors took their
    places): the module's `params`, in the same order, take theirs, with their state."""
    old = parameters_of(optimizer)
    if len(old) != len(params):
        raise RuntimeError(f"lockstep: the copied in-place optimizer holds {len(old)} parameters, the copy's "
                           f"codebook {len(params)}")
    moved = dict(zip(map(id, old), params))
    for group in optimizer.param_groups:
        group["params"] = [moved[id(p)] for p in group["params"]]
    optimizer.state = defaultdict(dict, {moved.get(id(p), p): state for p, state in optimizer.state.items()})
