"""Residual quantizers (vector_quantize_pytorch's ResidualVQ, ResidualFSQ and ResidualLFQ: their
arguments and return values). Each layer quantizes what the layers before it left, in liblockstep."""
import random
import re
from types import MappingProxyType

import torch
from torch import nn

from . import _in_place, _ops
from ._quantizer import (LockstepQuantizer, as_indices, checked_temperature, identity, only_defaults, padding_mask,
                         refuse)
from .fsq import fsq_options
from .lfq import activation_term, bit_mask, in_compute_dtype, lfq_options, lfq_padding_mask
from .vq import _Codebook, module_options, vq_options


def refuse_layer_layout(module_name, layer_kwargs, allowed):
    """TypeError for a layer argument about the layer's own input or index layout (`allowed`: name ->
    (accepted values, what to use instead)), which the stack decides: named, never dropped."""
    for name, (accepted, instead) in allowed.items():
        if name in layer_kwargs and layer_kwargs[name] not in accepted:
            refuse(module_name, name, layer_kwargs[name], instead)


class _Residual(LockstepQuantizer):
    """What the three share: liblockstep's residual quantizer (quant/residual.h) under the
    reference's layer names, and decoding from indices."""

    def __init__(self, name, options, seed, process_group, collective_timeout, rename=None, persistent=None,
                 held=None):
        super().__init__(name, "residual", options, seed, process_group, collective_timeout, rename, persistent,
                         held)
        self.dim = self._core.dim
        self.num_quantizers = options["num_quantizers"]
        self.quantize_dropout = options["quantize_dropout"]

    def _fixed_dropout(self, seed):
        """forward(rand_quantize_dropout_fixed_seed=seed) -> {"dropout_layers": the layers this call runs}, the
        reference's pick (random.Random(seed) draws the last layer kept, rounded up to quantize_dropout_multiple_of);
        {} where the call drops no layer (evaluation, no quantize dropout) or no seed is given."""
        if seed is None or not (self.training and self.quantize_dropout):
            return {}
        options = self._spec[2]
        last = random.Random(seed).randrange(options["quantize_dropout_cutoff_index"], self.num_quantizers)
        multiple = options["quantize_dropout_multiple_of"]
        kept = -(-(last + 1) // multiple) * multiple  # last + 1 rounded up to the multiple
        return {"dropout_layers": min(kept, self.num_quantizers)}

    @staticmethod
    def _residual_options(num_quantizers, quantize_dropout, cutoff_index, multiple_of):
        return dict(num_quantizers=int(num_quantizers), quantize_dropout=bool(quantize_dropout),
                    quantize_dropout_cutoff_index=int(cutoff_index), quantize_dropout_multiple_of=int(multiple_of))

    def _all_loss_names(self, names):
        # A call with quantize dropout runs a prefix of the layers, and every layer returns the same
        # losses: layer 0's names, for every layer.
        first = {name.split(".", 1)[1] for name in names if name.startswith("layer0.")}
        return {f"layer{q}.{name}" for q in range(self.num_quantizers) for name in first} | set(names)

    def _per_layer_losses(self, losses, device):
        """{"layer<q>.<name>": loss} -> (num_quantizers,): each layer's losses summed, 0 for a dropped layer."""
        zero = torch.zeros((), device=device)
        per_layer = [sum((v for k, v in losses.items() if k.startswith(f"layer{q}.")), zero)
                     for q in range(self.num_quantizers)]
        return torch.stack(per_layer)

    def get_codes_from_indices(self, indices):
        """Indices (b, ..., q) as forward returns them, q up to num_quantizers (fewer, or -1 for a
        dropped layer, with quantize dropout) -> each layer's code as it enters the sum (scaled where
        the layers are), (num_quantizers, b, ..., codebook_dim); zeros where a layer was dropped."""
        indices = as_indices(f"lockstep.{type(self).__name__}", indices)
        if indices.shape[-1] < self.num_quantizers:
            if not self.quantize_dropout:
                raise ValueError(f"lockstep.{type(self).__name__}: indices for {indices.shape[-1]} of "
                                 f"{self.num_quantizers} layers need quantize_dropout=True (the reference's rule)")
            pad = indices.new_full((*indices.shape[:-1], self.num_quantizers - indices.shape[-1]), -1)
            indices = torch.cat([indices, pad], dim=-1)
        dropped = indices == -1
        if getattr(self, "implicit_neural_codebook", False):  # each layer's codes from the codes before it
            flat = indices.reshape(indices.shape[0], -1, indices.shape[-1])
            codes = self._core.layer_codes(flat)
            return codes.reshape(codes.shape[0], *indices.shape[:-1], codes.shape[-1])
        codebooks = self.codebooks
        codes = torch.stack([codebooks[q][indices[..., q].clamp_min(0)] for q in range(self.num_quantizers)])
        scales = self._code_scales()
        if scales is not None:
            codes = codes * scales.reshape(self.num_quantizers, *([1] * (codes.ndim - 2)), -1)
        return codes.masked_fill(dropped.movedim(-1, 0).unsqueeze(-1), 0.0)

    def _code_scales(self):
        """(num_quantizers, codebook_dim) factors of each layer's codes, or None."""
        return None

    @staticmethod
    def _one_token_per_item(forward, x, **kwargs):
        """forward on (b, dim) input, one token per item as the reference takes it: run as (b, 1, dim),
        the token axis dropped from the output, indices and each layer's codes."""
        out, idx, *rest = forward(x.unsqueeze(1), **kwargs)
        if kwargs.get("return_all_codes"):
            rest[-1] = rest[-1].squeeze(2)  # (num_quantizers, b, 1, dim) -> (num_quantizers, b, dim)
        return (out.squeeze(1), idx.squeeze(1), *rest)

    def _layer_codebook(self, q):
        """Layer q's every code in index order, from liblockstep's layer (an FSQ's or an LFQ's)."""
        return self._core.layer(q).indices_to_codes(torch.arange(self.codebook_size, device=self.device))

    def get_output_from_indices(self, indices):
        """Indices (b, ..., num_quantizers) as forward returns them (-1 for a dropped layer) -> the
        summed codes, projected out: (b, ..., dim)."""
        indices = as_indices(f"lockstep.{type(self).__name__}", indices)
        flat = indices.reshape(indices.shape[0], -1, indices.shape[-1])
        out = self._core.decode(flat)
        return out.reshape(*indices.shape[:-1], out.shape[-1])


class _Layers(nn.Module):
    """ResidualVQ's `layers`: the holder of each layer's tensors, indexable and iterable as the reference's
    ModuleList."""

    def _in_order(self):
        return [self._modules[key] for key in sorted(self._modules, key=int)]

    def __getitem__(self, q):
        return self._in_order()[q]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._in_order())


class _ResidualVqLayer(nn.Module):
    """A layer of ResidualVQ (its `_codebook` tensors; `in_place_codebook_optimizer` when given). It finds its
    quantizer by handle: a reference to it would be a cycle."""

    @property
    def codebook(self):
        """The layer's codebook, as a VectorQuantize's `codebook`: (codebook_size, codebook_dim)."""
        embed = self._codebook.embed
        return embed if embed.shape[0] > 1 else embed[0]

    def update_in_place_optimizer(self):
        """The layer's in-place optimizer's step, as VectorQuantize.update_in_place_optimizer (what
        manual_in_place_optimizer_update=True leaves to the caller)."""
        optimizer = self.__dict__.get("in_place_codebook_optimizer")
        if optimizer is not None:
            module = _ops._module(self._quantizer_handle)
            _in_place.add_and_step(optimizer, module._in_place_gradients(self._index))


class ResidualVQ(_Residual):
    """ResidualVQ(dim=, num_quantizers=, codebook_size=, ...) as vector-quantize-pytorch's: each layer
    a VectorQuantize (its arguments are passed on) quantizing what the layers before left; forward(x)
    returns (quantized, indices (b, n, num_quantizers), per-layer commitment losses). Each layer's
    buffers carry the reference's names (`layers.0._codebook.embed`, ...)."""
    _maps_hint = " or (b, dim) vectors, or (b, dim, h, w) maps with accept_image_fmap=True"

    def __init__(self, *, dim, num_quantizers=None, codebook_size, codebook_dim=None, shared_codebook=False,
                 diveq=False, heads=1, quantize_dropout=False, quantize_dropout_cutoff_index=0,
                 quantize_dropout_multiple_of=1, accept_image_fmap=False, implicit_neural_codebook=False,
                 mlp_kwargs=MappingProxyType({}), beam_size=None, eval_beam_size=None, beam_score_quantizer_weights=None,
                 quant_grad_frac=0.0, return_zeros_for_masked_padding=True, seed=None, process_group=None,
                 collective_timeout=300.0, **vq_kwargs):
        mlp_kwargs = mlp_kwargs or MappingProxyType({})  # None as the reference's default, an empty dict
        mlp = dict(mlp_kwargs)
        unknown = set(mlp) - {"dim_hidden", "depth"}
        if unknown:  # the reference passes dim and l2norm_output itself: anything else is a TypeError there too
            raise TypeError(f"lockstep.ResidualVQ: mlp_kwargs takes dim_hidden and depth, got {sorted(unknown)}")
        if eval_beam_size is not None and beam_size is None:  # the reference's assertion
            raise AssertionError("lockstep.ResidualVQ: eval_beam_size needs beam_size, as the reference's")
        if heads != 1:  # the reference's own assertion
            raise AssertionError("lockstep.ResidualVQ: heads must be 1 (residual vq is not compatible with "
                                 "multi-headed codes, as in the reference)")
        # codebook_size: one size for every layer, or one per layer (the number of layers then taken from it).
        sizes = [int(k) for k in codebook_size] if isinstance(codebook_size, (tuple, list)) else None
        if num_quantizers is None:
            if sizes is None:
                raise AssertionError("lockstep.ResidualVQ: give num_quantizers, or codebook_size as a tuple of each "
                                     "layer's size (the reference's rule)")
            num_quantizers = len(sizes)
        if sizes is not None and len(sizes) != num_quantizers:
            raise AssertionError(f"lockstep.ResidualVQ: codebook_size={tuple(sizes)} names {len(sizes)} layers, "
                                 f"num_quantizers={num_quantizers}")
        refuse_layer_layout("lockstep.ResidualVQ", vq_kwargs, {
            "accept_3d_fmap": ((False,), "False: the stack takes tokens, or image maps with accept_image_fmap"),
            "channel_last": ((True,), "True: the stack takes (b, n, dim) tokens")})
        if shared_codebook:  # the stack refreshes a shared codebook after its last layer, as the reference's
            vq_kwargs["manual_ema_update"] = False
        layer = vq_options(dim, sizes[0] if sizes else codebook_size, codebook_dim, **vq_kwargs)
        own = module_options(layer)
        bridge = own["vq_bridge"]  # each layer's codebook through the one module, in torch, before liblockstep's search
        in_place = own["in_place_codebook_optimizer"]
        freeze_codebook = own["freeze_codebook"]  # the layers' setting
        options = {f"vq.{key}": value for key, value in layer.items()}
        options.update(self._residual_options(num_quantizers, quantize_dropout, quantize_dropout_cutoff_index,
                                              quantize_dropout_multiple_of))
        # The reference's frac_gradient: a share <= 0 detaches.
        options["quant_grad_frac"] = max(0.0, float(quant_grad_frac))
        if sizes is not None and len(set(sizes)) > 1:
            if shared_codebook:  # the reference's assertion
                raise AssertionError(f"lockstep.ResidualVQ: shared_codebook needs one codebook size, got {tuple(sizes)}")
            options["codebook_sizes"] = sizes
        # One codebook for every layer: each layer's statistics move it, recomputed once per call (liblockstep).
        options["shared_codebook"] = bool(shared_codebook)
        # DiVeQ over the stack: liblockstep sets the layers' options as the reference does (no EMA, learned
        # codebooks, codes as the layers' outputs, no commitment loss, quant_grad_frac 1).
        options["diveq"] = bool(diveq)
        # QINCo's implicit neural codebooks: liblockstep's MLPs (quant/implicit_codebook.h), learned codebooks.
        if implicit_neural_codebook and vq_kwargs.get("use_cosine_sim"):  # learned codebooks: the reference's assertion
            raise AssertionError("lockstep.ResidualVQ: implicit_neural_codebook learns the codebooks, which cosine "
                                 "similarity does not take, as in the reference")
        options["implicit_neural_codebook"] = bool(implicit_neural_codebook)
        options["mlp_hidden"] = int(mlp.get("dim_hidden") or 0)
        options["mlp_depth"] = int(mlp.get("depth", 4))
        # Beam search over the layers' codes (liblockstep's Residual::quantize_beam), the reference's widths.
        options["beam_size"] = int(beam_size or 0)
        options["eval_beam_size"] = int(eval_beam_size or 0)
        if beam_score_quantizer_weights is not None:
            if len(beam_score_quantizer_weights) != num_quantizers:  # the reference's assertion
                raise AssertionError(f"lockstep.ResidualVQ: beam_score_quantizer_weights has "
                                     f"{len(beam_score_quantizer_weights)} weights, num_quantizers={num_quantizers}")
            options["beam_score_weights"] = [float(w) for w in beam_score_quantizer_weights]
        super().__init__("residual-vq", options, seed, process_group, collective_timeout,
                         rename=lambda name: re.sub(r"^layer(\d+)\.", r"layers.\1._codebook.", name))
        self.codebook_sizes = tuple(sizes) if sizes is not None else (int(codebook_size),) * num_quantizers
        self.uniform_codebook_size = len(set(self.codebook_sizes)) == 1
        self.codebook_size = self.codebook_sizes[0]  # the first layer's, as the reference
        self.codebook_dim = int(codebook_dim) if codebook_dim is not None else int(dim)
        self.has_projections = self.codebook_dim != int(dim)
        self.diveq = bool(diveq)
        self.implicit_neural_codebook = bool(implicit_neural_codebook)
        self.quant_grad_frac = float(quant_grad_frac) if not diveq else 1.0
        self.shared_codebook = bool(shared_codebook)
        self.beam_size = beam_size
        self.eval_beam_size = eval_beam_size if eval_beam_size is not None else beam_size
        self.accept_image_fmap = accept_image_fmap
        self.return_zeros_for_masked_padding = bool(return_zeros_for_masked_padding)
        self.freeze_codebook = freeze_codebook
        self.sync_codebook = own["sync_codebook"]
        # Each layer's in-place optimizer over its codebook's parameters, as the reference's layers make theirs.
        # A shared codebook's in-place update is manual, as the reference sets it for its layers: the first
        # layer's update_in_place_optimizer() steps the one codebook on every layer's in-place gradient.
        self._in_place_manual = own["manual_in_place_optimizer_update"] or bool(shared_codebook)
        self._in_place = in_place is not None
        for layer in (self.layers if bridge is not None else ()):  # `layers.q._codebook.vq_bridge.*`, as there
            layer._codebook.add_module("vq_bridge", bridge)
        for layer in (self._in_place_layers() if self._in_place else ()):
            layer.in_place_codebook_optimizer = in_place(layer._codebook.parameters())
        self._start_in_place_updates()

    def _in_place_layers(self):
        """The layers with an in-place optimizer: every layer, or the first alone when they share its codebook
        (the reference's other layers hold optimizers of the codebooks they had before sharing, which no
        gradient reaches)."""
        return [self.layers[0]] if self.shared_codebook else list(self.layers)

    def _register_ops(self):
        super()._register_ops()
        layers = self._modules["layers"]  # made when the tensors were adopted: indexable, as a ModuleList
        layers.__class__ = _Layers
        for q, layer in enumerate(layers):
            layer.__class__ = _ResidualVqLayer
            layer._quantizer_handle, layer._index = self._handle, q
            codebook = layer._modules["_codebook"]  # update_ema(), as the reference's layers' Codebook
            codebook.__class__ = _Codebook
            codebook._quantizer_handle, codebook._layer_index = self._handle, q
        if self.__dict__.get("_in_place"):  # a copy's (deepcopy, unpickling): its optimizers take the new tensors
            for layer in self._in_place_layers():
                _in_place.rebind(layer.in_place_codebook_optimizer, list(layer._codebook.parameters()))
            self._start_in_place_updates()

    def _start_in_place_updates(self):
        """With in-place optimizers: liblockstep keeps each layer's in-place gradient, and unless
        manual_in_place_optimizer_update each layer's optimizer steps once backward has accumulated the layer's
        codebook gradient (VectorQuantize's, docs/python/vq.md)."""
        for q, layer in enumerate(self._in_place_layers() if self._in_place else ()):
            self._core.layer(q).keep_in_place_gradient(True)
            if not self._in_place_manual:
                _in_place.after_backward(layer._codebook.embed, self, "_in_place_step", q)

    def _in_place_gradients(self, q):
        layer = self.layers[q]
        return _in_place.gradients(layer.in_place_codebook_optimizer,
                                   self._core.layer(q).take_in_place_gradient(), layer._codebook)

    def _in_place_step(self, q):
        _in_place.step_alone(self.layers[q].in_place_codebook_optimizer, self._in_place_gradients(q))

    def _all_loss_names(self, names):
        names = super()._all_loss_names(names)
        return names | ({f"layer{q}.in_place" for q in range(self.num_quantizers)} if self._in_place else set())

    def _reduces_over_group(self):
        return self.sync_codebook

    def _codebook_learned_by_commitment(self):
        return self._spec[2].get("vq.learnable_codebook", False) and not self._spec[2].get("vq.orthogonal_reg_weight")

    @property
    def codebooks(self):
        """Every layer's codebook, (num_quantizers, codebook_size, codebook_dim): the layers' `_codebook.embed`;
        a tuple of each layer's (codebook_size_q, codebook_dim) when the sizes differ, as the reference."""
        codebooks = tuple(self._layer_embed(q)[0] for q in range(self.num_quantizers))
        return torch.stack(codebooks) if self.uniform_codebook_size else codebooks

    def _layer_embed(self, q):
        """Layer q's codebook tensor (a buffer, or a parameter when learned; the first layer's when shared)."""
        return self.get_submodule(f"layers.{q}._codebook").embed

    def forward(self, x, mask=None, indices=None, return_all_codes=False, sample_codebook_temp=None,
                freeze_codebook=False, beam_size=None, rand_quantize_dropout_fixed_seed=None):
        if x.ndim == 2 and not self.accept_image_fmap and mask is None and indices is None:
            return self._one_token_per_item(self.forward, x, return_all_codes=return_all_codes,
                                            freeze_codebook=freeze_codebook, beam_size=beam_size,
                                            sample_codebook_temp=sample_codebook_temp,
                                            rand_quantize_dropout_fixed_seed=rand_quantize_dropout_fixed_seed)
        per_call = {} if indices is not None else self._fixed_dropout(rand_quantize_dropout_fixed_seed)
        if sample_codebook_temp is not None:  # the layers' sampling temperature for this call
            per_call["sample_codebook_temp"] = checked_temperature("lockstep.ResidualVQ", sample_codebook_temp)
        # Padded sequences: every layer keeps masked tokens out of its statistics and loss.
        mask = padding_mask("lockstep.ResidualVQ", x, mask, None)  # for (b, n, d) tokens only
        if indices is not None:
            indices = self._given_indices(x, indices, mask)
        # The layers' freeze_codebook holds unless forward freezes them (the reference's forward default,
        # False, overrides its layers' setting: a deliberate difference).
        # A beam given to forward replaces the module's (beam_size in training, eval_beam_size in evaluation).
        beam = beam_size if beam_size is not None else (self.beam_size if self.training else self.eval_beam_size)
        if self.training and self._in_place and beam is not None and int(beam) > 1:  # the reference's assertion
            raise AssertionError("lockstep.ResidualVQ: beam search takes each layer's top-k codes, which are not "
                                 "taken in training with an in_place_codebook_optimizer, as the reference's")
        if self.training and self._in_place and self.implicit_neural_codebook and self.num_quantizers > 1 and not (
                self.freeze_codebook or freeze_codebook):
            # The reference's in-place step of a layer after the first backwards through the layers before it (its
            # MLP's condition), whose graph the step before freed: a RuntimeError at every such training call.
            raise RuntimeError("lockstep.ResidualVQ: an in_place_codebook_optimizer with implicit_neural_codebook "
                               "trains nothing: the reference's in-place step of a layer after the first backwards "
                               "through the graph of the layers before it a second time, a RuntimeError in each "
                               "training call (evaluation, and training with freeze_codebook, run as there)")
        bridged = self._bridged_codebooks(self._initialised_codebooks(x, mask, freeze_codebook, beam_size, per_call))
        out, idx, losses = self._quantize_any(x, self.accept_image_fmap, True, self.num_quantizers, mask,
                                              self.freeze_codebook or bool(freeze_codebook),
                                              beam_size=None if beam_size is None else int(beam_size),
                                              codebook=bridged, **per_call)
        if mask is not None and not self.return_zeros_for_masked_padding:
            out = torch.where(mask.unsqueeze(-1), out, x)  # padding passes through
        losses = {name: loss for name, loss in losses.items() if not name.endswith(".in_place")}  # values only
        losses = self._per_layer_losses(losses, out.device)  # one commitment loss per layer, in order
        if indices is not None:
            # The training call's state update rides on the backward of what is returned (the reference
            # updates in forward): the cross entropy carries the call's graph at weight 0.
            return out, self._cross_entropy(x, indices, bridged) + 0.0 * losses.sum()
        return (out, idx, losses, self.get_codes_from_indices(idx)) if return_all_codes else (out, idx, losses)

    def _given_indices(self, x, indices, mask):
        """forward(x, indices=...)'s indices as one (b, n, num_quantizers) tensor (a list of each layer's
        (b, n) is stacked on the last axis); ValueError for what the reference refuses."""
        if isinstance(indices, (list, tuple)):
            indices = torch.stack(list(indices), dim=-1)
        if self.accept_image_fmap or x.ndim != 3 or mask is not None:
            raise ValueError("lockstep.ResidualVQ: indices= takes tokens (b, n, dim) and no mask, as the reference")
        if tuple(indices.shape) != (*x.shape[:-1], self.num_quantizers):
            raise ValueError(f"lockstep.ResidualVQ: indices must have shape {(*x.shape[:-1], self.num_quantizers)}, "
                             f"got {tuple(indices.shape)}")
        if (indices == -1).any():
            raise ValueError("lockstep.ResidualVQ: some of the given indices are -1 (a layer dropped by quantize "
                             "dropout); take indices from the module in evaluation mode, as the reference requires")
        return indices.long()

    def _cross_entropy(self, x, indices, bridged=None):
        """The sum over layers of the cross entropy of each layer's given code (liblockstep's logits: minus
        the distance, or the cosine similarity) at the residual the given codes of the layers before it
        leave, the codebooks as this call found them (through the vq_bridge: `bridged`, (L, 1, K, d)). The
        reference gives every layer the unquantized input (a deliberate difference, docs/python/residual.md)."""
        residual, total = x.float(), 0.0
        for q in range(self.num_quantizers):
            layer = self._core.layer(q)
            codebook = None if bridged is None else bridged[q]
            logits = layer.code_logits(residual, codebook)
            total = total + torch.nn.functional.cross_entropy(logits.movedim(-1, 1), indices[..., q])
            codes = layer.decode(indices[..., q]) if codebook is None else codebook[0][indices[..., q]]
            residual = residual - codes
        return total

    def _bridge(self):
        return self.layers[0]._codebook._modules.get("vq_bridge")

    def _initialised_codebooks(self, x, mask, freeze_codebook, beam_size, per_call):
        """The layers' codebook tensors (the first layer's alone when shared) for the vq_bridge to read, once the
        layers' k-means has run (kmeans_init, a training call with gradients, layers not yet initialised), each
        layer's from its residual after the layers before it searched their bridged codebooks, as the reference's
        first call initialises them (liblockstep's stack called back for each layer's bridged codes). Under compile
        through the custom op at every call, as VectorQuantize's, so that the bridge comes after it."""
        embeds = [self._layer_embed(q) for q in range(1 if self.shared_codebook else self.num_quantizers)]
        if self._bridge() is None or not self._spec[2].get("vq.kmeans_init"):
            return embeds
        run = self.training and torch.is_grad_enabled()
        if not torch.compiler.is_compiling() and (not run or self._layers_initialised()):
            return embeds
        tokens = self._tokens_of(x, self.accept_image_fmap)[0].float()
        copies = [embed.clone() for embed in embeds]  # the k-means writes the codebooks themselves
        return _ops.residual_initialise(tokens.detach(), copies, self._handle, run, mask,
                                        bool(self.freeze_codebook or freeze_codebook),
                                        None if beam_size is None else int(beam_size),
                                        per_call.get("sample_codebook_temp"), per_call.get("dropout_layers", 0))

    def _layers_initialised(self):
        """Whether every layer's codebook holds k-means' codes (or needs none)."""
        return all(bool(layer._codebook.initted) for layer in self.layers)

    def _bridged_layer(self, q, embeds=None):
        """Layer q's codebook through the vq_bridge, (1, K_q, codebook_dim), from `embeds` (the layers' codebook
        tensors as _initialised_codebooks gives them; their own when None)."""
        embed = self._layer_embed(q) if embeds is None else embeds[0 if self.shared_codebook else q]
        return self._bridge()(embed)

    def _bridged_codebooks(self, embeds=None):
        """Each layer's codebook through the vq_bridge, (num_quantizers, 1, K, codebook_dim), differentiable (sizes that
        differ by layer padded to the largest with zeros, which liblockstep leaves out); None without one. Decoding
        from indices takes the codebooks themselves, as the reference's does."""
        if self._bridge() is None:
            return None
        largest = max(self.codebook_sizes)
        bridged = [self._bridged_layer(q, embeds) for q in range(self.num_quantizers)]
        return torch.stack([nn.functional.pad(codes, (0, 0, 0, largest - codes.shape[-2])) for codes in bridged])


class ResidualFSQ(_Residual):
    """ResidualFSQ(levels=, num_quantizers=, dim=None, ...) as vector-quantize-pytorch's: FSQ layers with
    the symmetric bound, layer q seeing the residual scaled by levels^q; by default (bound_hard_clamp)
    the input is first squashed to tanh(x / c) c, c = 1 + 1/(L-1), and the layers clamp. forward(x) takes
    (b, n, dim) tokens, or (b, dim, ...) maps with is_channel_first, and returns (quantized, indices
    (b, n, num_quantizers), or (b, num_quantizers, ...) for maps)."""
    _maps_hint = " or channel-first maps (b, dim, ...) with is_channel_first=True"

    def __init__(self, *, levels, num_quantizers, dim=None, is_channel_first=False, quantize_dropout=False,
                 quantize_dropout_cutoff_index=0, quantize_dropout_multiple_of=1, soft_clamp_input_value=None,
                 bound_hard_clamp=True, seed=None, process_group=None, collective_timeout=300.0, **fsq_kwargs):
        if soft_clamp_input_value is not None and bound_hard_clamp:  # the reference's assertion
            raise AssertionError("lockstep.ResidualFSQ: soft_clamp_input_value needs bound_hard_clamp=False (the hard "
                                 "clamp sets its own), as in the reference")
        if "preserve_symmetry" in fsq_kwargs:  # as the reference, which sets it for its layers
            raise TypeError("lockstep.ResidualFSQ: preserve_symmetry is always True for the layers")
        refuse_layer_layout("lockstep.ResidualFSQ", fsq_kwargs, {
            "num_codebooks": ((1,), "1: each layer quantizes the whole residual"),
            "keep_num_codebooks_dim": ((None, False), "None: indices are (b, n, num_quantizers)"),
            "channel_first": ((None, False), "False; is_channel_first=True takes channel-first maps"),
            "return_indices": ((True,), "True"),
            "orthogonal_rotation": ((False,), "False; FSQ takes True")})
        layer, _ = fsq_options(levels, bound_hard_clamp=bound_hard_clamp, **fsq_kwargs)
        options = {f"fsq.{key}": value for key, value in layer.items()}
        if dim is not None:
            options["fsq.dim"] = int(dim)
        options.update(self._residual_options(num_quantizers, quantize_dropout, quantize_dropout_cutoff_index,
                                              quantize_dropout_multiple_of))
        if soft_clamp_input_value is not None:  # one value, or one per dimension
            options["soft_clamp"] = [float(c) for c in torch.as_tensor(soft_clamp_input_value).reshape(-1).tolist()]
        # The per-layer scales are constants, outside the state dict as in the reference.
        super().__init__("residual-fsq", options, seed, process_group, collective_timeout,
                         persistent=lambda name: not re.fullmatch(r"scale\d+", name))
        self.levels = layer["levels"]
        self.codebook_size = self._core.codebook_size
        self.is_channel_first = is_channel_first

    @property
    def codebooks(self):
        """Every layer's implicit codebook, (num_quantizers, codebook_size, len(levels)), unscaled."""
        return torch.stack([self._layer_codebook(q) for q in range(self.num_quantizers)])

    def _code_scales(self):
        return torch.stack([self._core.buffers()[f"scale{q}"].reshape(-1).expand(len(self.levels))
                            for q in range(self.num_quantizers)])

    def forward(self, x, return_all_codes=False, rand_quantize_dropout_fixed_seed=None):
        out, idx, _ = self._quantize_any(x, self.is_channel_first, True, self.num_quantizers,
                                         **self._fixed_dropout(rand_quantize_dropout_fixed_seed))
        codes = self.get_codes_from_indices(idx) if return_all_codes else None  # (q, b, ..., d)
        if self.is_channel_first:  # the reference moves the layer axis first too: (b, q, ...)
            idx = idx.movedim(-1, 1)
        idx = idx.to(torch.int32)  # the FSQ layers' index type, as the reference
        return (out, idx, codes) if return_all_codes else (out, idx)


class ResidualLFQ(_Residual):
    """ResidualLFQ(dim=, num_quantizers=, codebook_size=, ...) as vector-quantize-pytorch's: LFQ layers
    (its arguments are passed on), layer q with codebook scale 2^-q; forward(x) takes (b, n, dim) tokens
    or (b, dim, ...) feature maps and returns (quantized, indices (..., num_quantizers), per-layer aux
    losses)."""
    _maps_hint = " or channel-first maps (b, dim, h, w, ...) of two or more spatial axes"

    def __init__(self, *, dim, num_quantizers, codebook_size, quantize_dropout=False, quantize_dropout_cutoff_index=0,
                 quantize_dropout_multiple_of=1, soft_clamp_input_value=None, seed=None, process_group=None,
                 collective_timeout=300.0, **lfq_kwargs):
        if soft_clamp_input_value is not None and soft_clamp_input_value < lfq_kwargs.get("codebook_scale", 1.0):
            raise AssertionError("lockstep.ResidualLFQ: soft_clamp_input_value must be >= codebook_scale, as in the "
                                 "reference")
        if "codebook_scale" in lfq_kwargs:  # as the reference, which sets 2^-q for layer q
            raise TypeError("lockstep.ResidualLFQ: codebook_scale is set per layer (2^-q)")
        refuse_layer_layout("lockstep.ResidualLFQ", lfq_kwargs, {
            "channel_first": ((None, False), "None: maps of two or more spatial axes are taken channel first"),
            "keep_num_codebooks_dim": ((None, False), "None: indices are (..., num_quantizers)"),
            "orthogonal_rotation": ((False,), "False; LFQ takes True")})
        bits = int(codebook_size).bit_length() - 1
        layer, module = lfq_options(dim=bits, codebook_size=codebook_size, **lfq_kwargs)
        layer.pop("dim")  # the layers take the residual's dimension
        options = {f"lfq.{key}": value for key, value in layer.items()}
        options["lfq.dim"] = int(dim)
        options.update(self._residual_options(num_quantizers, quantize_dropout, quantize_dropout_cutoff_index,
                                              quantize_dropout_multiple_of))
        if soft_clamp_input_value is not None:  # layer q's soft clamp: the value times 2^-q, as the reference's
            options["soft_clamp"] = [float(soft_clamp_input_value)]
        super().__init__("residual-lfq", options, seed, process_group, collective_timeout)
        self.codebook_size = codebook_size
        self.inv_temperature = module["inv_temperature"]
        self._soft_clamp, self._spherical = soft_clamp_input_value, bool(layer["spherical"])
        self._activated = module["straight_through_activation"] is not None
        for q in range(self.num_quantizers if self._activated else 0):  # one module in every layer, as there
            self._owner(f"layers.{q}.activation")[0].add_module("activation", module["straight_through_activation"])

    @property
    def codebooks(self):
        """Every layer's codebook, (num_quantizers, codebook_size, log2(codebook_size)): codes of
        +-2^-q (on the sphere when spherical)."""
        return torch.stack([self._layer_codebook(q) for q in range(self.num_quantizers)])

    def _reference_constants(self):
        return {f"layers.{q}.mask": bit_mask(self.codebook_size) for q in range(self.num_quantizers)}

    def _activation_gradient(self, x, indices, channel_first):
        """straight_through_activation, as each of the reference's layers applies it: a term of value 0 whose
        gradient turns liblockstep's straight-through identity at layer q's tokens t_q into the module's.
        t_q, layer q's residual after its soft clamp and sphere, is made again here in torch from the
        input and the codes of the layers before it (a dropped layer adds nothing); the term passes out
        through the projection's weight, detached, as LFQ's."""
        tokens = x.movedim(1, -1) if channel_first else x
        residual = in_compute_dtype(tokens)
        if "project_in" in self._modules:
            residual = nn.functional.linear(residual, self.project_in.weight, self.project_in.bias)
        # Layer q's codes, +-2^-q per bit (over sqrt(bits) on the sphere), in torch operations (they compile).
        bits = (indices.clamp_min(0).unsqueeze(-1) & bit_mask(self.codebook_size).to(indices.device)) != 0
        bits_per_code = bits.shape[-1]
        value = 2.0 ** -torch.arange(self.num_quantizers, device=x.device, dtype=residual.dtype).unsqueeze(-1)
        value = value / (bits_per_code**0.5 if self._spherical else 1.0)
        codes = torch.where(bits, value, -value)  # (..., num_quantizers, bits)
        change = torch.zeros_like(residual)
        activation = self.get_submodule("layers.0.activation")
        for q in range(self.num_quantizers):
            t = residual
            if self._soft_clamp is not None:  # halved layer by layer, as the reference's
                clamp = self._soft_clamp * 0.5**q
                t = (t / clamp).tanh() * clamp
            if self._spherical:
                t = nn.functional.normalize(t, dim=-1) * 2.0**-q
            t = t.unsqueeze(-2)  # (..., 1, bits): one codebook's bits, as the reference's layers see them
            taken = (indices[..., q] >= 0).unsqueeze(-1)
            change = change + torch.where(taken, (activation(t) - t).squeeze(-2), 0.0)
            residual = residual - codes[..., q, :]
        return activation_term(self, change, channel_first)

    def forward(self, x, mask=None, return_all_codes=False, rand_quantize_dropout_fixed_seed=None):
        mask = lfq_padding_mask("lockstep.ResidualLFQ", x, mask, x.ndim >= 4)
        out, idx, losses = self._quantize_any(x, x.ndim >= 4, True, self.num_quantizers, mask,
                                              **self._fixed_dropout(rand_quantize_dropout_fixed_seed))
        if self.training and self._activated:
            out = out + self._activation_gradient(x, idx, x.ndim >= 4).to(out.dtype)
        result = (out, idx, self._per_layer_losses(losses, out.device))
        return (*result, self.get_codes_from_indices(idx)) if return_all_codes else result


class ResidualSimVQ(_Residual):
    """ResidualSimVQ(dim=, num_quantizers=, codebook_size=, ...) as vector-quantize-pytorch's: SimVQ layers
    (its arguments are passed on), each with its own frozen codebook and map, quantizing what the layers
    before left; forward(x) takes (b, n, dim) tokens or (b, dim, ...) with channel_first and returns
    (quantized, indices (..., num_quantizers), per-layer commitment losses). The layers' tensors carry
    the reference's names (`layers.0.frozen_codebook`, `layers.0.code_transform.weight`)."""
    _maps_hint = " or (b, dim) vectors, or channel-first maps (b, dim, ...) with channel_first=True"

    def __init__(self, *, dim, num_quantizers, codebook_size, heads=1, quantize_dropout=False,
                 quantize_dropout_cutoff_index=0, quantize_dropout_multiple_of=1, channel_first=False,
                 rotation_trick=True, seed=None, process_group=None, collective_timeout=300.0, **sim_vq_kwargs):
        if heads != 1:  # the reference's assertion
            raise AssertionError("lockstep.ResidualSimVQ: heads must be 1 (residual vq is not compatible with "
                                 "multi-headed codes, as in the reference)")
        transform = sim_vq_kwargs.pop("codebook_transform", None)
        if transform is not None and not callable(transform):
            raise TypeError(f"lockstep.ResidualSimVQ: codebook_transform must be a module (frozen codes -> codes "
                            f"(codebook_size, dim)), got {type(transform).__name__}")
        init_fn = sim_vq_kwargs.pop("init_fn", None)
        unknown = set(sim_vq_kwargs) - {"input_to_quantize_commit_loss_weight", "commitment_weight",
                                        "frozen_codebook_dim"}
        if unknown:
            raise TypeError(f"lockstep.ResidualSimVQ: unexpected SimVQ argument(s) {sorted(unknown)}")
        layer = dict(dim=int(dim), codebook_size=int(codebook_size), rotation_trick=bool(rotation_trick),
                     **{k: (int(v) if k == "frozen_codebook_dim" else float(v)) for k, v in sim_vq_kwargs.items()
                        if v is not None})
        options = {f"simvq.{key}": value for key, value in layer.items()}
        options.update(self._residual_options(num_quantizers, quantize_dropout, quantize_dropout_cutoff_index,
                                              quantize_dropout_multiple_of))
        drawn = torch.get_rng_state() if seed is None and transform is not None else None
        super().__init__("residual-simvq", options, seed, process_group, collective_timeout,
                         rename=lambda name: re.sub(r"^layer(\d+)\.", r"layers.\1.", name),
                         held=None if transform is None else (lambda dotted: ".code_transform." not in dotted))
        self.codebook_size = int(codebook_size)
        self.channel_first = bool(channel_first)
        self._transform = transform is not None
        if transform is not None:
            # The reference's layers share the one module and draw their frozen codes one after the other
            # (liblockstep drew each layer's map between them): drawn again so, from the same state.
            if drawn is not None:
                torch.set_rng_state(drawn)
                with torch.no_grad():
                    for q in range(self.num_quantizers):
                        frozen = self.get_buffer(f"layers.{q}.frozen_codebook")
                        frozen.copy_(torch.randn(frozen.shape) * frozen.shape[1] ** -0.5)
            for q in range(self.num_quantizers):
                self._owner(f"layers.{q}.frozen_codebook")[0].add_module("code_transform", transform)
        if init_fn is not None and init_fn is not identity:  # each layer's frozen codes, as the reference's layers
            with torch.no_grad():
                for q in range(self.num_quantizers):
                    frozen = self.get_buffer(f"layers.{q}.frozen_codebook")
                    frozen.copy_(torch.as_tensor(init_fn(frozen.clone())).reshape(frozen.shape))

    @property
    def codebooks(self):
        """Every layer's implicit codebook, (num_quantizers, codebook_size, dim): its frozen codes through
        its map (the shared codebook_transform when given), differentiable."""
        if self._transform:
            return torch.stack([self.get_submodule(f"layers.{q}.code_transform")(
                self.get_buffer(f"layers.{q}.frozen_codebook")) for q in range(self.num_quantizers)])
        return torch.stack([torch.nn.functional.linear(self.get_buffer(f"layers.{q}.frozen_codebook"),
                                                       self.get_parameter(f"layers.{q}.code_transform.weight"))
                            for q in range(self.num_quantizers)])

    def get_codes_from_indices(self, indices):
        """As the reference: (num_quantizers, b, ..., dim), channel first ((q, b, dim, ...)) with channel_first."""
        codes = super().get_codes_from_indices(indices)
        return codes.movedim(-1, 2) if self.channel_first else codes

    def get_output_from_indices(self, indices):
        if self._transform:  # the layers' codes summed, as the reference's (its map runs here)
            return self.get_codes_from_indices(indices).sum(0)
        out = super().get_output_from_indices(indices)
        return out.movedim(-1, 1) if self.channel_first else out

    def forward(self, x, return_all_codes=False, rand_quantize_dropout_fixed_seed=None):
        if x.ndim == 2 and not self.channel_first:
            return self._one_token_per_item(self.forward, x, return_all_codes=return_all_codes,
                                            rand_quantize_dropout_fixed_seed=rand_quantize_dropout_fixed_seed)
        given = {"codebook": self.codebooks} if self._transform else {}  # every layer's, for liblockstep
        given.update(self._fixed_dropout(rand_quantize_dropout_fixed_seed))
        out, idx, losses = self._quantize_any(x, self.channel_first, True, self.num_quantizers, **given)
        result = (out, idx, self._per_layer_losses(losses, out.device))
        return (*result, self.get_codes_from_indices(idx)) if return_all_codes else result
