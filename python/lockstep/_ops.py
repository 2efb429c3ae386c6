"""The quantizers as torch custom ops, which torch.compile traces without a graph break: forward
computes values only; backward recomputes the call with its graph (the same (seed, step), so the same
draws), differentiates it, then reduces and applies the state update, as eager's backward does."""
import weakref
from typing import List, Optional

import torch

_modules = weakref.WeakValueDictionary()  # handle -> LockstepQuantizer: the ops take plain ints
_next_handle = [0]


def register(module):
    """A handle for `module`, by which the ops below find it."""
    _next_handle[0] += 1
    _modules[_next_handle[0]] = module
    return _next_handle[0]


def _module(handle):
    module = _modules.get(handle)
    if module is None:
        raise RuntimeError(f"lockstep: the quantizer of handle {handle} no longer exists")
    return module


@torch.library.custom_op("lockstep::quantize", mutates_args=())
def quantize(x: torch.Tensor, step: torch.Tensor, parameters: List[torch.Tensor], handle: int, training: bool,
             grad_mode: bool, mask: Optional[torch.Tensor] = None, freeze_codebook: bool = False) -> List[torch.Tensor]:
    """[quantized, int64 indices, one scalar per loss of the module's loss_names] for x (b, n, dim);
    `mask` (b, n) bool keeps padding out of statistics and losses; `freeze_codebook` keeps the codebooks."""
    module = _module(handle)
    group = module._lazy_group() if training else None
    loss_names, _ = module._compile_signature()
    return module._core.quantize_values(x, training, module.seed, step, group, grad_mode, list(loss_names), mask,
                                        freeze_codebook)


@quantize.register_fake
def _(x, step, parameters, handle, training, grad_mode, mask=None, freeze_codebook=False):
    loss_names, index_shape = _module(handle)._compile_signature()
    indices = x.new_empty((*x.shape[:2], *index_shape), dtype=torch.int64)
    return [torch.empty_like(x), indices] + [x.new_empty(()) for _ in loss_names]


@torch.library.custom_op("lockstep::quantize_backward", mutates_args=())
def quantize_backward(x: torch.Tensor, step: torch.Tensor, parameters: List[torch.Tensor], handle: int,
                      training: bool, grad_quantized: torch.Tensor, grad_losses: List[torch.Tensor],
                      mask: Optional[torch.Tensor] = None, freeze_codebook: bool = False) -> List[torch.Tensor]:
    """[grad of x, grad of each parameter]; then the training step's state update, and step + 1."""
    module = _module(handle)
    group = module._lazy_group() if training else None
    loss_names, _ = module._compile_signature()
    return module._core.quantize_backward(x, training, module.seed, step, group, list(loss_names),
                                          grad_quantized, grad_losses, parameters, mask,
                                          freeze_codebook)


@quantize_backward.register_fake
def _(x, step, parameters, handle, training, grad_quantized, grad_losses, mask=None, freeze_codebook=False):
    return [torch.empty_like(x)] + [torch.empty_like(p) for p in parameters]


def _setup_context(ctx, inputs, output):
    # Trailing arguments left at their defaults may be absent (torch 2.11's tracing drops them).
    x, step, parameters, handle, training = inputs[:5]
    mask = inputs[6] if len(inputs) > 6 else None
    freeze_codebook = inputs[7] if len(inputs) > 7 else False
    ctx.save_for_backward(x, step, mask, *parameters)
    ctx.handle, ctx.training, ctx.freeze_codebook = handle, training, freeze_codebook


def _backward(ctx, grads):
    x, step, mask, *parameters = ctx.saved_tensors
    grad_quantized = grads[0] if grads[0] is not None else torch.zeros_like(x)
    grad_losses = [g if g is not None else x.new_zeros(()) for g in grads[2:]]
    result = quantize_backward(x, step, parameters, ctx.handle, ctx.training, grad_quantized, grad_losses, mask,
                               ctx.freeze_codebook)
    # One entry per input the op was given (see _setup_context): x, step, parameters, then Nones.
    grads = (result[0], None, result[1:])
    return grads + (None,) * (len(ctx.needs_input_grad) - len(grads))


quantize.register_autograd(_backward, setup_context=_setup_context)
