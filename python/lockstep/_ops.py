"""The quantizers as torch custom ops, which torch.compile traces without a graph break. A training forward
with gradients runs the call once, with its graph, which liblockstep's binding keeps (not the compiled graph);
backward reduces and applies the state update, then differentiates that graph, as eager's backward does.

No op writes any of its arguments (each declares mutates_args=(), which torch.library.opcheck's schema test
holds them to): the state a call changes (the step, codebooks, statistics, parameters a codebook update
writes) is the module's, which an op finds by its handle, as it reads the rest of the module's state. The
parameters an op takes are the slots of their gradients; a tensor the op's update may write is passed as a
copy (the k-means ops' codebooks) or not at all (a whole step's parameters)."""
import itertools
import weakref
from typing import List, Optional

import torch

from . import _C

_modules = weakref.WeakValueDictionary()  # handle -> LockstepQuantizer: the ops take plain ints
_next_handle = [0]
# Ticket -> a training forward's recorded call (its graph, its state update), until its backward takes it or
# the compiled graph that holds the ticket, an int64 scalar, is freed.
_recorded = {}
_tickets = itertools.count(1)


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
def quantize(x: torch.Tensor, parameters: List[torch.Tensor], handle: int, training: bool, grad_mode: bool,
             mask: Optional[torch.Tensor] = None, freeze_codebook: bool = False,
             codebook: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """[quantized, int64 indices, one scalar per loss of the module's loss_names, a ticket (int64 scalar on
    the CPU) to the recorded call, for backward; 0 when no backward follows] for x (b, n, dim); `parameters`:
    the module's parameters, the slots of their gradients (none without grad mode: a training call then is a
    whole step on one process, whose update may write them); `mask` (b, n) bool keeps padding out of statistics
    and losses; `freeze_codebook` keeps the codebooks; `codebook`: the codes a module of the user's made (SimVQ's
    codebook_transform)."""
    module = _module(handle)
    step = module._steps
    group = module._lazy_group() if training else None
    loss_names, _ = module._compile_signature()
    if training and not grad_mode and module._ranks() == 1:  # no backward will come: a whole step, as eager's
        if parameters:
            raise RuntimeError("lockstep::quantize: a whole step (training, no grad mode) writes the parameters; "
                               "pass none")
        call = _C.Call(mask=mask, freeze_codebook=freeze_codebook, codebook=codebook, update_in_forward=True)
        out, indices, losses = module._core.quantize(x, True, module.seed, step, group, call)
        absent = [torch.zeros((), device=x.device) for _ in loss_names]  # one each: outputs may not alias
        return ([out, indices] + [losses.get(name, zero) for name, zero in zip(loss_names, absent)]
                + [torch.zeros((), dtype=torch.int64)])
    call = _C.Call(mask=mask, freeze_codebook=freeze_codebook, codebook=codebook)
    if not (training and grad_mode):  # no backward will come
        values = module._core.quantize_values(x, training, module.seed, step, group, grad_mode, list(loss_names),
                                              call)
        return values + [torch.zeros((), dtype=torch.int64)]
    values, recorded = module._core.quantize_recorded(x, training, module.seed, step, group, list(loss_names), call)
    number = next(_tickets)
    ticket = torch.tensor(number, dtype=torch.int64)
    _recorded[number] = recorded
    # A forward never backwarded (a training forward on some ranks only) leaves nothing behind.
    weakref.finalize(ticket, _recorded.pop, number, None)
    return values + [ticket]


@quantize.register_fake
def _(x, parameters, handle, training, grad_mode, mask=None, freeze_codebook=False, codebook=None):
    loss_names, index_shape = _module(handle)._compile_signature()
    indices = x.new_empty((*x.shape[:2], *index_shape), dtype=torch.int64)
    ticket = torch.empty((), dtype=torch.int64, device="cpu")
    return [torch.empty_like(x), indices] + [x.new_empty(()) for _ in loss_names] + [ticket]


def calls_waiting():
    """How many training forwards' recorded calls wait for their backward (tests: none once graphs are freed)."""
    return len(_recorded)


@torch.library.custom_op("lockstep::quantize_backward", mutates_args=())
def quantize_backward(x: torch.Tensor, handle: int, training: bool, grad_quantized: torch.Tensor,
                      grad_losses: List[torch.Tensor], mask: Optional[torch.Tensor] = None,
                      freeze_codebook: bool = False, ticket: Optional[torch.Tensor] = None,
                      codebook: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """[grad of x, grad of each of the module's parameters (the forward's slots), grad of `codebook` when given]:
    the graph the forward of `ticket` recorded, differentiated once; first the training step's state update, and
    the module's step + 1. `mask` and `freeze_codebook` are the recorded call's."""
    module = _module(handle)
    recorded = None if ticket is None else _recorded.pop(int(ticket), None)
    if recorded is None:
        raise RuntimeError(f"lockstep: the recorded call of ticket {ticket} is gone: differentiated already (a second "
                           "backward through a compiled quantizer's retained graph is not supported) or freed")
    group = module._lazy_group() if training else None
    parameters = [module.get_parameter(name) for name in module._parameter_names]
    return module._core.backward_recorded(recorded, training, module._steps, group, grad_quantized, grad_losses,
                                          parameters)


@quantize_backward.register_fake
def _(x, handle, training, grad_quantized, grad_losses, mask=None, freeze_codebook=False, ticket=None,
      codebook=None):
    module = _module(handle)
    parameters = [torch.empty(p.shape, dtype=p.dtype, device=p.device)
                  for p in map(module.get_parameter, module._parameter_names)]
    given = [] if codebook is None else [torch.empty_like(codebook)]
    return [torch.empty_like(x)] + parameters + given


def _setup_context(ctx, inputs, output):
    # Trailing arguments left at their defaults may be absent (torch 2.11's tracing drops them).
    x, parameters, handle, training = inputs[:4]
    mask = inputs[5] if len(inputs) > 5 else None
    freeze_codebook = inputs[6] if len(inputs) > 6 else False
    codebook = inputs[7] if len(inputs) > 7 else None
    ctx.save_for_backward(x, mask, output[-1], codebook)
    ctx.handle, ctx.training, ctx.freeze_codebook, ctx.parameters = handle, training, freeze_codebook, len(parameters)


def _backward(ctx, grads):
    x, mask, ticket, codebook = ctx.saved_tensors
    grad_quantized = grads[0] if grads[0] is not None else torch.zeros_like(x)
    grad_losses = [g if g is not None else x.new_zeros(()) for g in grads[2:-1]]
    result = quantize_backward(x, ctx.handle, ctx.training, grad_quantized, grad_losses, mask, ctx.freeze_codebook,
                               ticket, codebook)
    # One entry per input the op was given (see _setup_context): x, parameters, then Nones but for a
    # given codebook's, the eighth.
    grads = (result[0], result[1:1 + ctx.parameters])
    grads = grads + (None,) * (len(ctx.needs_input_grad) - len(grads))
    if codebook is not None:
        grads = grads[:7] + (result[-1],) + grads[8:]
    return grads


quantize.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("lockstep::vq_initialise", mutates_args=())
def vq_initialise(x: torch.Tensor, passed: torch.Tensor, handle: int, run: bool, mask: Optional[torch.Tensor] = None,
                  codebook: bool = False) -> torch.Tensor:
    """A copy of `passed`, or with `codebook` of the module's codebook (`passed` then a copy of it, the slot of its
    gradient, since the k-means writes the codebook itself), taken once VQ's k-means initialisation on tokens x
    (b, n, dim) has run (Vq::initialise, its collectives over the module's group; nothing unless `run`, nothing
    once initialised): what reads the initialised codebook takes it, so that the graph keeps the op and its order
    (a vq_bridge's codebook, RandomProjectionQuantizer's tokens). The gradient passes to `passed`."""
    module = _module(handle)
    if run:
        module._core.initialise(x, True, module.seed, module._steps, module._lazy_group(), mask)
    return (module._codebook.embed if codebook else passed).clone()


@vq_initialise.register_fake
def _(x, passed, handle, run, mask=None, codebook=False):
    return torch.empty_like(passed)


def _initialise_backward(ctx, grad):
    return (None, grad) + (None,) * (ctx.inputs - 2)


def _initialise_setup(ctx, inputs, output):
    ctx.inputs = len(inputs)  # trailing arguments left at their defaults may be absent


vq_initialise.register_autograd(_initialise_backward, setup_context=_initialise_setup)


@torch.library.custom_op("lockstep::residual_initialise", mutates_args=())
def residual_initialise(x: torch.Tensor, passed: List[torch.Tensor], handle: int, run: bool,
                        mask: Optional[torch.Tensor] = None, freeze_codebook: bool = False,
                        beam_size: Optional[int] = None, sample_codebook_temp: Optional[float] = None,
                        dropout_layers: int = 0) -> List[torch.Tensor]:
    """Copies of the layers' codebooks (the first layer's alone when shared), taken once ResidualVQ's layers have
    run their k-means initialisation on tokens x (b, n, dim) (liblockstep's stack, each layer's codes before it
    made by the module's vq_bridge from its initialised codebook; its collectives over the module's group; nothing
    unless `run`, nothing once initialised): the bridge reads the copies, so the graph keeps the op before it.
    `passed`: copies of those codebooks, the slots of their gradients (the k-means writes the codebooks
    themselves), to which the gradients pass."""
    module = _module(handle)
    if run and not module._layers_initialised():  # else the stack's call is waste
        def bridged(layer):
            with torch.no_grad():
                return module._bridged_layer(layer).float()

        call = _C.Call(mask=mask, freeze_codebook=freeze_codebook, beam_size=beam_size,
                       sample_codebook_temp=sample_codebook_temp, dropout_layers=dropout_layers)
        module._core.initialise(x, True, module.seed, module._steps, module._lazy_group(), call, bridged)
    return [module._layer_embed(q).clone() for q in range(len(passed))]


@residual_initialise.register_fake
def _(x, passed, handle, run, mask=None, freeze_codebook=False, beam_size=None, sample_codebook_temp=None,
      dropout_layers=0):
    return [torch.empty_like(codebook) for codebook in passed]


def _residual_initialise_backward(ctx, grads):
    given = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
             for g, (shape, dtype, device) in zip(grads, ctx.passed)]
    return (None, given) + (None,) * (ctx.inputs - 2)


def _residual_initialise_setup(ctx, inputs, output):
    ctx.passed = [(codebook.shape, codebook.dtype, codebook.device) for codebook in inputs[1]]  # for missing gradients
    ctx.inputs = len(inputs)


residual_initialise.register_autograd(_residual_initialise_backward, setup_context=_residual_initialise_setup)
