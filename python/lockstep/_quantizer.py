"""What every lockstep module shares: the liblockstep quantizer it runs, whose parameters and
buffers it registers as its own (the same tensors, so optimizers, state_dict() and .to() act on
what liblockstep computes with), and the randomness it draws from (seed, step)."""
import copy
import datetime
import functools
import inspect
import math
import re
import warnings
import weakref

import torch
import torch.distributed as dist
from torch import nn

from . import _C, _ops


def identity(t):
    """The reference's default `init_fn`: t itself."""
    return t


def declare_reference_signature(cls, options_function):
    """Gives cls.__init__ the signature a user of the reference expects (inspect, IDEs, the import-compatibility
    test): `options_function`'s parameters, which declare the reference's constructor in its order with its
    defaults, then lockstep's own keyword-only options (seed, process_group, collective_timeout)."""
    own = [p for p in inspect.signature(cls.__init__).parameters.values()
           if p.name in ("seed", "process_group", "collective_timeout")]
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += list(inspect.signature(options_function).parameters.values())
    parameters += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
    cls.__init__.__signature__ = inspect.Signature(parameters)
    return cls


_CASTS = {"bool": bool, "int": int, "float": float, "str": str,
          "int_list": lambda v: [int(x) for x in v], "float_list": lambda v: [float(x) for x in v]}


@functools.lru_cache(maxsize=None)
def _declared(section):
    return tuple(_C.declared_options(section))


def declared_arguments(section, arguments, besides=()):
    """The options liblockstep declares for `section` (one line each in quant/*_options.def, or
    option_specs.cpp) that the reference's constructor takes under the same name and meaning, from
    `arguments` (the options function's locals()), each cast to the option's type: {key: value}. An
    option the reference spells otherwise, or whose value it gives another meaning (None for "the
    default"), is named in `besides` and mapped by the module; the rest keep liblockstep's default."""
    return {key: _CASTS[kind](arguments[key]) for key, kind in _declared(section)
            if key in arguments and key not in besides}


# Training forwards freed with no backward between, after which a module whose update waits for backward says so.
_UNBACKWARDED_WARNING = 10


def _freed_unbackwarded(module_ref, step):
    """The output of a training call at `step` was freed: a step unmoved since means no backward reached it (nor
    any later call); after _UNBACKWARDED_WARNING such calls in a row, one warning naming the way out."""
    module = module_ref()
    if module is None:
        return
    if module.step != step:
        module._unbackwarded = 0
        return
    module._unbackwarded += 1
    if module._unbackwarded == _UNBACKWARDED_WARNING and not module._warned_unbackwarded:
        module._warned_unbackwarded = True
        warnings.warn(
            f"lockstep.{type(module).__name__}: {_UNBACKWARDED_WARNING} training forwards in a row were never "
            "backwarded: its codebook statistics and random draws move in backward, so they have not moved. To "
            "train it without a backward (EMA alone), call lockstep.update_in_forward(model): each training "
            "forward is then a whole step, reduced over the process group (every rank must make it); "
            "docs/python/vector-quantize-pytorch.md, 'Training without a backward'.", RuntimeWarning, stacklevel=1)


def update_in_forward(model, enabled=True):
    """Makes every training forward of each lockstep module in `model` a whole step: the codebook update and
    the random draws' advance happen in forward, reduced over the process group through lockstep's checked
    channel, so EMA-only training (no backward reaches the quantizer) learns on several ranks too. Every rank
    must then make the same training forwards (a disagreement is a CollectiveMismatch on each, a rank that
    stops calling is named after the collective timeout); evaluation forwards stay local. Returns `model`."""
    for module in model.modules():
        if isinstance(module, LockstepQuantizer):
            module.update_in_forward = bool(enabled)
    return model


def refuse(module_name, name, value, supported):
    """TypeError naming an option given a value lockstep does not implement, and what it does."""
    raise TypeError(f"{module_name}: option {name}={value!r} is not supported by lockstep (only {supported}); "
                    "see docs/python/vector-quantize-pytorch.md for the options and deliberate differences")


def checked_temperature(module_name, value):
    """forward(sample_codebook_temp=value) as a float >= 0 (0: no sampling); ValueError otherwise."""
    value = float(value)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{module_name}: sample_codebook_temp={value} must be a finite number >= 0")
    return value


# The reference's names of the per-call arguments _quantize takes under its own (for errors).
_CALL_ARGUMENTS = {"dropout_layers": "rand_quantize_dropout_fixed_seed", "accumulate": "accum_ema_update",
                   "token_codes": "codebook_transform_fn", "fsp_eps": "eps"}


def only_defaults(module_name, function, given, names):
    """For reference options lockstep implements only at their default: TypeError naming the first of
    `names` that `given` (the caller's locals()) sets to another value than `function`'s signature."""
    parameters = inspect.signature(function).parameters
    for name in names:
        default = parameters[name].default
        if given[name] != default:
            refuse(module_name, name, given[name], repr(default))


def check_floating(module_name, x):
    """TypeError for integer or bool input: quantized in float32 and cast back, its codes would come
    back truncated without a word."""
    if not x.is_floating_point():
        raise TypeError(f"{module_name}: the input must be floating point, got {x.dtype}")


def as_indices(module_name, indices):
    """Code indices as int64; TypeError for floating-point, complex or bool values (a float index would
    be truncated to another code without a word)."""
    indices = torch.as_tensor(indices)
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise TypeError(f"{module_name}: indices must be integers, got {indices.dtype}")
    return indices.long()


def reference_state_dict(module):
    """module.state_dict(), which is already in vector-quantize-pytorch's layout (the reference's keys,
    shapes and dtypes; lockstep's (seed, step) in its metadata): kept for code written before it was."""
    return module.state_dict()


# The entry of a module's state-dict metadata (state_dict()._metadata[prefix]) that holds its (seed, step):
# not a key, so a strict load into the reference never sees it (docs/python/torch.md, "Where (seed, step) lives").
_METADATA_KEY = "lockstep"


def _reference_layout(module, state, prefix, local_metadata):
    """state_dict()'s post hook: the module's entries under `prefix` as the reference holds them (its
    constants such as LFQ's `mask` put in, affine flags in its form, its dtypes), and (seed, step) in the
    module's metadata."""
    for key, value in module._reference_constants().items():
        state[prefix + key] = value.to(module.device)
    module._affine_to_reference(state, prefix)
    for key in [k for k in state if k.startswith(prefix) and k.rsplit(".", 1)[-1] == "initted"]:
        state[key] = state[key].bool()  # a VQ codebook's flag: liblockstep's float 0/1, the reference's bool
    local_metadata[_METADATA_KEY] = (module.seed, module.step)


def padding_mask(module_name, x, mask, lens):
    """The forward's `mask` (b, n) bool or `lens` (b,) lengths, as the reference takes them, as a bool
    mask on x's device (None when neither is given); ValueError for both, or a wrong shape or type."""
    if mask is not None and lens is not None:
        raise ValueError(f"{module_name}: give mask or lens, not both")
    if lens is None and mask is None:
        return None
    if x.ndim != 3:
        raise ValueError(f"{module_name}: mask and lens are for tokens (b, n, dim), as in the reference; "
                         f"got an input of shape {tuple(x.shape)}")
    if lens is not None:
        lens = torch.as_tensor(lens, device=x.device)
        if lens.shape != (x.shape[0],) or lens.is_floating_point() or lens.is_complex():
            raise ValueError(f"{module_name}: lens must hold one integer length per item, shape ({x.shape[0]},); "
                             f"got {lens.dtype} of shape {tuple(lens.shape)}")
        return torch.arange(x.shape[1], device=x.device) < lens[:, None]
    mask = torch.as_tensor(mask, device=x.device)
    if mask.shape != x.shape[:2] or mask.dtype != torch.bool:
        raise ValueError(f"{module_name}: mask must be bool of shape (b, n) = {tuple(x.shape[:2])}; "
                         f"got {mask.dtype} of shape {tuple(mask.shape)}")
    return mask


def _module_channel(module_name, group, timeout):
    """lockstep's checked channel for a module's statistics over `group`, made by liblockstep at its first
    use (a backward). It meets under the group's own store and name, which every member agrees on and no
    other group shares, numbered by the channels this process made over the group in the order of their
    first uses (a module each); its first collective compares the module and the group's ranks across
    ranks. Ranks in no common group never meet, whatever order each made its modules in."""
    from .distributed import _store_of  # noqa: PLC0415 (distributed registers a backend on import)
    store = _store_of(group)
    name = group.group_name
    ranks = dist.get_process_group_ranks(group)
    rank, size = dist.get_rank(group), dist.get_world_size(group)

    def make_gloo(prefix):  # lockstep's own Gloo group, for a process group without one (NCCL alone)
        return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, datetime.timedelta(seconds=timeout))

    identity = f"lockstep.{module_name} over process group {name!r} of global ranks {ranks}"
    return _C.LazyGroup(group, store, timeout, f"lockstep/python/{name}", numbered=True, identity=identity,
                        make_gloo=make_gloo, global_ranks=ranks)


class LockstepQuantizer(nn.Module):
    # How the module takes feature maps, for the error naming what it takes (" or ..."; "" for none).
    _maps_hint = ""

    def __init__(self, name, section, options, seed=None, process_group=None, collective_timeout=300.0,
                 rename=None, persistent=None, held=None):
        super().__init__()
        self.register_state_dict_post_hook(_reference_layout)  # state_dict() in the reference's layout
        if seed is None:  # torch's global generator draws the initial state, as in the reference
            self._core = _C.make_quantizer(name, section, options)
        else:  # the seed alone decides it, whatever torch's global generator holds
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed))
                self._core = _C.make_quantizer(name, section, options)
        # Statistics are reduced over `process_group` (torch.distributed's default group when None
        # and torch.distributed is initialised) through lockstep's checked channel, in the backward of
        # a training forward: a forward never communicates (docs/python/distributed.md).
        self._process_group = process_group
        self._collective_timeout = float(collective_timeout)
        self._group = None
        # Randomness (noise dropout, sampled codes, k-means seeds, dead-code samples) is a pure function
        # of (seed, step), the step counting the backwards that reached this module's outputs, which
        # every rank runs: no collective is needed to agree on it. liblockstep advances it in backward.
        self.seed = 0 if seed is None else int(seed)
        self._steps = torch.zeros((), dtype=torch.int64)
        # A training forward is a whole step (update and draws in forward) when True (update_in_forward), or
        # on one process when nothing can backward; else the update waits for backward.
        self.update_in_forward = False
        self._unbackwarded = 0  # training calls in a row whose outputs were freed unbackwarded, for the warning
        self._drawn_at = 0
        self._ema_held = False  # statistics held back by accum_ema_update, for the next call's update
        self._warned_unbackwarded = False
        rename = rename or (lambda dotted: dotted)  # to the reference's names ("_codebook.embed")
        persistent = persistent or (lambda name: True)  # buffers the reference keeps out of its state dict
        held = held or (lambda dotted: True)  # liblockstep's tensors the module holds (a user's module replaces some)
        self._spec = (name, section, dict(options))  # rebuilds the quantizer for a copy (__setstate__)
        # (liblockstep's name, the module's name, is a parameter, is persistent) of each tensor
        self._core_names = [(dotted, rename(dotted), True, True) for dotted in self._core.parameters() if held(dotted)]
        self._core_names += [(dotted, rename(dotted), False, persistent(rename(dotted)))
                             for dotted in self._core.buffers() if held(dotted)]
        self._adopt_core_tensors(copies=False)
        self._register_ops()

    def _register_ops(self):
        # torch.compile runs the quantizer as the custom op lockstep::quantize (_ops.py), which finds
        # the module by this handle; the parameters it differentiates are passed by name.
        self._handle = _ops.register(self)
        # Each tensor once: a codebook shared by residual layers is one parameter under several names, and the op's
        # backward may not return one gradient twice (aliased outputs).
        distinct = {}
        for _, renamed, is_parameter, _ in self._core_names:
            if is_parameter:
                distinct.setdefault(id(self.get_parameter(renamed)), renamed)
        self._parameter_names = list(distinct.values())
        self._signature = None

    def _adopt_core_tensors(self, copies):
        """Registers liblockstep's tensors as the module's own. With `copies`, the module already holds
        tensors of those names (a deep copy's, an unpickled module's): their values, devices and
        gradients pass to liblockstep's tensors, which then take their places."""
        for owner, name, is_parameter, persistent, tensor in self._core_entries():
            if copies:
                prior = (owner._parameters if is_parameter else owner._buffers)[name]
                with torch.no_grad():
                    tensor.data = prior.data
                if is_parameter:
                    tensor.requires_grad_(prior.requires_grad)
                    tensor.grad = prior.grad
            if is_parameter:
                tensor.__class__ = nn.Parameter  # the same tensor, now registrable as a parameter
                owner._parameters[name] = tensor
            else:
                owner.register_buffer(name, tensor, persistent=persistent)

    def _core_entries(self):
        """(owner module, name, is parameter, is persistent, liblockstep's tensor) of each tensor. Found
        by name each time: a list of owners kept on the module would be a reference cycle, and the
        module (with its checked group and heartbeat) would outlive its last use until a GC pass."""
        held = {**self._core.parameters(), **self._core.buffers()}
        for dotted, renamed, is_parameter, persistent in self._core_names:
            yield (*self._owner(renamed), is_parameter, persistent, held[dotted])

    def __getstate__(self):
        # liblockstep's quantizer is rebuilt from _spec, its checked group made anew when needed.
        state = dict(self.__dict__)
        for key in ("_core", "_group", "_handle", "_signature"):
            state.pop(key, None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        # A module pickled by an earlier lockstep: what it did not hold yet (the reference's state-dict layout,
        # the whole-step bookkeeping).
        if _reference_layout not in self._state_dict_hooks.values():
            self.register_state_dict_post_hook(_reference_layout)
        for name, value in (("update_in_forward", False), ("_unbackwarded", 0), ("_warned_unbackwarded", False),
                            ("_drawn_at", 0), ("_ema_held", False)):
            self.__dict__.setdefault(name, value)
        self._core = _C.make_quantizer(*self._spec)
        self._group = None
        self._adopt_core_tensors(copies=True)
        self._register_ops()

    def __deepcopy__(self, memo):
        """copy.deepcopy (an EMA of the weights, say): new tensors and quantizer; the same process group."""
        if self._process_group is not None:
            memo[id(self._process_group)] = self._process_group
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return copied

    def _apply(self, fn, recurse=True):
        """.to(), .cuda(), .bfloat16() and the like: liblockstep's tensors follow the device and keep
        their dtype (quantization runs in float32), and stay the very tensors liblockstep holds;
        torch would replace buffers by copies, and cast them."""
        entries = list(self._core_entries())
        for owner, name, is_parameter, _, _ in entries:
            (owner._parameters if is_parameter else owner._buffers).pop(name)
        try:
            super()._apply(fn, recurse)
        finally:
            for owner, name, is_parameter, _, tensor in entries:
                (owner._parameters if is_parameter else owner._buffers)[name] = tensor
        # Where fn sends a tensor of the module's: a cast (.half()) keeps the device, a move (.cuda()) changes it.
        probe = entries[0][-1].detach().new_empty(0) if entries else torch.zeros(0, device=self.device)
        device = fn(probe).device
        self._device = device  # a module without tensors still knows where its results belong
        with torch.no_grad():
            for *_, tensor in entries:
                if tensor.device != device:
                    moved = tensor.data.to(device)
                    if not torch._has_compatible_shallow_copy_type(tensor, moved):  # e.g. "meta"
                        raise RuntimeError(f"lockstep.{type(self).__name__}: cannot move to device {device}: "
                                           "liblockstep's tensors can follow a move only to a CPU or CUDA device")
                    tensor.data = moved
                    if tensor.grad is not None:
                        tensor.grad = tensor.grad.to(device)
        return self

    def load_reference_state_dict(self, state_dict, strict=True):
        """load_state_dict(state_dict, strict): the reference's state dicts load as they are (kept for code
        written before they did)."""
        return self.load_state_dict(state_dict, strict=strict)

    @property
    def step(self):
        """Training steps taken: backwards that reached this module's training outputs."""
        return int(self._steps)

    @step.setter
    def step(self, value):
        self._steps.fill_(int(value))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # (seed, step) from the metadata (or from `_extra_state`, where lockstep kept them before); a state
        # dict without them, as the reference's, keeps the module's own.
        saved = local_metadata.get(_METADATA_KEY)
        earlier = state_dict.pop(prefix + "_extra_state", None)
        if saved is None and earlier is not None:
            saved = earlier.tolist()
        if saved is not None:
            self.seed, self.step = (int(v) for v in saved)
        self._check_reference_constants(state_dict, prefix, error_msgs)
        self._affine_from_reference(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _check_reference_constants(self, state_dict, prefix, error_msgs):
        """The reference's constants that lockstep derives from the options (LFQ's `mask`) leave the state
        dict here; one of another value means another configuration, named in load_state_dict's error."""
        for key, expected in self._reference_constants().items():
            value = state_dict.pop(prefix + key, None)
            if value is not None and not torch.equal(value.cpu(), expected):
                error_msgs.append(f"the checkpoint's {prefix + key} is {value.tolist()}, where this "
                                  f"lockstep.{type(self).__name__}'s is {expected.tolist()}: it was saved with "
                                  "another configuration")

    def _affine_from_reference(self, state_dict, prefix):
        """A VQ codebook's affine statistics as the reference keeps them (`codebook_mean_needs_init` flags;
        `batch_mean` absent before its first forward) -> lockstep's (`affine_initted`; every buffer present),
        in place on the entries under `prefix`."""
        for key in [k for k in state_dict if k.startswith(prefix) and k.endswith("codebook_mean_needs_init")]:
            at = key[:-len("codebook_mean_needs_init")]
            flags = [state_dict.pop(key), state_dict.pop(at + "codebook_variance_needs_init", True)]
            needs_init = any(bool(flag) for flag in flags)
            has_batch = at + "batch_mean" in state_dict
            for name in ("batch_mean", "batch_variance"):
                if at + name not in state_dict:  # the module's own value, unused until its statistics are set
                    state_dict[at + name] = self.get_buffer(at[len(prefix):] + name).detach()
            state_dict[at + "affine_initted"] = torch.tensor(float(has_batch and not needs_init))

    def _affine_to_reference(self, state_dict, prefix):
        """The inverse of _affine_from_reference, in place on the entries under `prefix`: `affine_initted`
        -> the reference's two `*_needs_init` flags, the batch statistics left out before they exist."""
        for key in [k for k in state_dict if k.startswith(prefix) and k.endswith("affine_initted")]:
            at = key[:-len("affine_initted")]
            initted = bool(state_dict.pop(key))
            for name in ("codebook_mean_needs_init", "codebook_variance_needs_init"):
                state_dict[at + name] = torch.tensor(not initted, device=self.device)
            if not initted:  # the reference registers them at its first training forward
                for name in ("batch_mean", "batch_variance"):
                    state_dict.pop(at + name, None)

    def _reference_constants(self):
        """{key: value} of the constants the reference stores that lockstep derives from the options."""
        return {}

    def _owner(self, dotted):
        """The (sub)module that holds `dotted` ("project_in.weight"), made on first use."""
        *path, name = dotted.split(".")
        owner = self
        for part in path:
            if part not in owner._modules:
                owner.add_module(part, nn.Module())
            owner = owner._modules[part]
        return owner, name

    def _quantize_any(self, x, channel_first, keep_codebook_axis, num_codebooks, mask=None, freeze_codebook=False,
                      **vq_call):
        """(b, n, dim) tokens, or (b, dim, ...) maps when `channel_first` -> (quantized in x's
        layout and dtype, indices (b, n[, c]) or (b, ...[, c]), {name: loss}), as the reference
        shapes them: the codebook axis kept for one codebook when `keep_codebook_axis`. `mask`
        (b, n) bool, for tokens only: padding counts in no statistic or loss (0 and -1 there).
        `freeze_codebook`: a training call that leaves the codebooks as they are. `vq_call`: VQ's per-call EMA
        arguments (ema_update_weight, accumulate, ema_update), for _quantize; `topk` (VQ): each token's k
        best codes, the quantized output (..., k, dim) and the indices (..., k)."""
        x, spatial = self._tokens_of(x, channel_first)
        out, indices, losses = self._quantize(x.float(), mask, freeze_codebook, **vq_call)
        out = out.to(x.dtype)
        if num_codebooks == 1 and keep_codebook_axis:
            indices = indices.unsqueeze(-1)
        if channel_first:
            out = out.reshape(out.shape[0], *spatial, *out.shape[2:]).movedim(-1, 1)
            indices = indices.reshape(indices.shape[0], *spatial, *indices.shape[2:])
            losses = {name: (loss.reshape(loss.shape[0], *spatial, *loss.shape[2:]) if loss.ndim > 1 else loss)
                      for name, loss in losses.items()}
        return out, indices, losses

    def _tokens_of(self, x, channel_first):
        """forward's input -> (tokens (b, n, dim) as liblockstep takes them, a map's spatial shape or None);
        TypeError or ValueError for an input of another kind or shape."""
        name = f"lockstep.{type(self).__name__}"
        check_floating(name, x)
        spatial = None
        if channel_first:
            if x.ndim < 2:
                raise ValueError(f"{name}: expected a channel-first map (b, {self.dim}, ...), got shape {tuple(x.shape)}")
            x = x.movedim(1, -1)
            spatial = x.shape[1:-1]
            x = x.reshape(x.shape[0], math.prod(spatial), x.shape[-1])  # -1 is ambiguous for an empty batch
        elif x.ndim != 3:
            raise ValueError(f"{name}: expected tokens (b, n, {self.dim}){self._maps_hint}, got shape {tuple(x.shape)}")
        if x.shape[-1] != self.dim:
            raise ValueError(f"{name}: expected dimension {self.dim} but found {x.shape[-1]}")
        return x, spatial

    def _lazy_group(self):
        """lockstep's checked channel over the process group, described here and made by liblockstep at
        its first collective, in a backward (making it is a rendezvous: never in a forward)."""
        if not (dist.is_available() and dist.is_initialized()) or not self._reduces_over_group():
            return None
        group = self._process_group if self._process_group is not None else dist.group.WORLD
        if dist.get_world_size(group) == 1:
            return None
        if self._group is None:
            # lockstep.distributed's wrapper (the group itself, or one made over it): one checked channel,
            # so the module's collectives and the user's are numbered in one sequence, a pairing of the
            # two is a CollectiveMismatch, and one worker issues them all on the group in one order.
            from .distributed import channel_of  # noqa: PLC0415 (distributed registers a backend on import)
            self._group = channel_of(group)
        if self._group is None:
            self._group = _module_channel(type(self).__name__, group, self._collective_timeout)
        return self._group

    def _quantize(self, x, mask=None, freeze_codebook=False, topk=None, codebook=None, **vq_call):
        """x: (b, n, dim) float32 -> (quantized, int64 indices, {name: loss}). Issues no collective.
        `topk` (VQ): (quantized (b, n, k, dim), indices (b, n, k), {"code": each code's loss (b, n, k), ...});
        `vq_call`: a forward's own arguments, passed to the binding (VQ's ema_update_weight, accumulate,
        ema_update, sample_codebook_temp, token_codes; LFQ's inv_temperature; FSP's fsp_eps), eager only;
        `codebook`: SimVQ's codes from a module of the user's, differentiable."""
        if not torch.compiler.is_compiling():
            self._drawn_at = self.step  # the step this call draws at (LFQ's loss breakdown draws the same)
        # The arguments a call gives (accumulate=False is no argument): the plain path otherwise.
        vq_call = {key: value for key, value in vq_call.items()
                   if value is not None and not (key == "accumulate" and not value)}
        if topk is not None or vq_call:
            if torch.compiler.is_compiling():
                named = ", ".join(_CALL_ARGUMENTS.get(key, key) for key in vq_call) or "topk"
                raise ValueError(f"lockstep.{type(self).__name__}: forward's {named} runs in eager mode only "
                                 "(torch.compile takes the call without them)")
            group = self._lazy_group() if self.training else None
            now = self._forward_time_ema(vq_call) or self._whole_step_now(x, codebook, vq_call.get("token_codes"))
            if topk is not None:
                call = _C.Call(mask=mask, freeze_codebook=bool(freeze_codebook), codebook=codebook,
                               sample_codebook_temp=vq_call.get("sample_codebook_temp"),
                               token_codes=vq_call.get("token_codes"), update_in_forward=now)
                out, indices, code_loss, losses = self._core.topk(x, int(topk), self.training, self.seed,
                                                                    self._steps, group, call)
                if not now:
                    self._watch_for_backward(out)
                return out, indices, {"code": code_loss, **losses}
            call = _C.Call(mask=mask, freeze_codebook=bool(freeze_codebook), codebook=codebook,
                           update_in_forward=now, **vq_call)
            result = self._core.quantize(x, self.training, self.seed, self._steps, group, call)
            if not now:
                self._watch_for_backward(result[0])
            return result
        if torch.compiler.is_compiling():
            if freeze_codebook and self._codebook_learned_by_commitment():
                # The custom op's backward gives such a codebook a zero gradient where eager gives none,
                # and an optimizer with momentum or weight decay would still move it.
                raise ValueError(f"lockstep.{type(self).__name__}: freeze_codebook with a learnable codebook is not "
                                 "supported under torch.compile (the codebook would get a zero gradient, not "
                                 "none); freeze it in eager mode, or leave it out of the optimizer")
            if self.update_in_forward and self.training:
                raise ValueError(f"lockstep.{type(self).__name__}: update_in_forward runs in eager mode only (under "
                                 "torch.compile a training call's update waits for its backward)")
            loss_names, _ = self._compile_signature()
            # The slots of the parameters' gradients; none without them (a whole step, whose update may write them).
            grad_mode = torch.is_grad_enabled()
            parameters = [self.get_parameter(name) for name in self._parameter_names] if grad_mode else []
            values = torch.ops.lockstep.quantize(x, parameters, self._handle, self.training, grad_mode, mask,
                                                 bool(freeze_codebook), codebook)
            return values[0], values[1], dict(zip(loss_names, values[2:-1]))  # last: the ticket to the recorded call
        group = self._lazy_group() if self.training else None
        now = self._forward_time_ema(vq_call) or self._whole_step_now(x, codebook)
        call = _C.Call(mask=mask, freeze_codebook=bool(freeze_codebook), codebook=codebook, update_in_forward=now)
        result = self._core.quantize(x, self.training, self.seed, self._steps, group, call)
        if not now:
            self._watch_for_backward(result[0])
        return result

    def _forward_time_ema(self, vq_call):
        """Whether this eager call, on one process, is a whole step for the reference's forward-time EMA arguments
        (ema_update_weight, accum_ema_update, ema_update), which describe this forward's update, made in forward
        there, or as the call that applies the statistics calls with accum_ema_update held back."""
        if not self.training or self._ranks() > 1:
            return False
        given = any(key in vq_call for key in ("ema_update_weight", "accumulate", "ema_update"))
        if not (given or self._ema_held):
            return False
        self._ema_held = bool(vq_call.get("accumulate"))
        return True

    def _whole_step_now(self, *inputs):
        """Whether this eager training call is a whole step (_is_whole_step, or as a module calling it decided)."""
        if not self.training:
            return False
        decided = getattr(self, "_decided_whole_step", None)  # a module calling this one decided for its call
        return decided if decided is not None else self._is_whole_step(*inputs)

    def _is_whole_step(self, *inputs, parameters=None):
        """Whether a training call with these tensors is a whole step (its update and the step's advance in
        forward): when the module asks for it (update_in_forward, over the process group through the checked
        channel), or on one process when nothing can backward (grad mode off, or no input or parameter that
        requires grad; `parameters`: those of a module calling this one, in place of its own), as the reference
        updates in every training forward. Several ranks otherwise keep forward free of collectives (G3)."""
        if self.update_in_forward:
            return True
        if self._ranks() > 1:
            return False
        inputs_need_grad = any(t.requires_grad for t in inputs if torch.is_tensor(t))
        if not torch.is_grad_enabled():
            # An input that requires grad under no_grad is a reentrant checkpoint's first pass
            # (torch.utils.checkpoint): its recompute in backward makes the step, which this call would make twice.
            return not inputs_need_grad
        return not (inputs_need_grad or any(p.requires_grad for p in (self.parameters() if parameters is None
                                                                        else parameters)))

    def _ranks(self):
        """The size of the process group the module's statistics are reduced over (1 without one)."""
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self._process_group if self._process_group is not None else dist.group.WORLD)

    def _watch_for_backward(self, out):
        """A training call whose update waits for backward: when its output is freed and no backward has moved
        the step since (_freed_unbackwarded), it counts towards the warning."""
        if self.training:
            weakref.finalize(out, _freed_unbackwarded, weakref.ref(self), self.step)

    @torch.compiler.assume_constant_result
    def _compile_signature(self):
        """(names of every loss a call may return, shape of a token's indices): what the custom op's
        outputs are, found once by quantizing one token in each mode (with no state change)."""
        if self._signature is None:
            names = set()
            with torch.no_grad():
                held = [*self._core.parameters().values(), *self._core.buffers().values()]
                token = torch.zeros(1, 1, self._core.dim, device=held[0].device if held else "cpu")
                for training in (False, True):
                    _, indices, losses = self._core.quantize(token, training, self.seed, self._steps, None)
                    names |= set(losses)
            self._signature = (tuple(sorted(self._all_loss_names(names))), tuple(indices.shape[2:]))
        return self._signature

    def _reduces_over_group(self):
        """Whether the statistics are the process group's (False: this rank's alone, VectorQuantize's
        sync_codebook=False)."""
        return True

    def _codebook_learned_by_commitment(self):
        """Whether a codebook is a parameter that only the commitment loss trains (learnable_codebook)."""
        return False

    def _all_loss_names(self, names):
        """The loss names any call may return, from those of one call in each mode."""
        return names

    @property
    def device(self):
        """Where the module's tensors are: the device of the last .to()/.cuda(), the CPU before one."""
        return getattr(self, "_device", torch.device("cpu"))
