"""Vector quantization with an EMA codebook (vector_quantize_pytorch.VectorQuantize's arguments
and return values)."""
import math
from collections import namedtuple

import torch
from torch import nn

from . import _C, _in_place, _ops
from ._quantizer import (LockstepQuantizer, as_indices, check_floating, checked_temperature,
                         declare_reference_signature, declared_arguments, padding_mask)


def vq_options(dim, codebook_size, codebook_dim=None, heads=1, separate_codebook_per_head=False, decay=0.8,
               eps=1e-5, freeze_codebook=False, kmeans_init=False, kmeans_iters=10, sync_kmeans=True,
               use_cosine_sim=False, layernorm_after_project_in=False, threshold_ema_dead_code=0, channel_last=True,
               accept_image_fmap=False, accept_3d_fmap=False, commitment_weight=1.0,
               commitment_use_cross_entropy_loss=False, orthogonal_reg_weight=0.0,
               orthogonal_reg_active_codes_only=False, orthogonal_reg_max_codes=None,
               codebook_diversity_loss_weight=0.0, codebook_diversity_temperature=100.0,
               stochastic_sample_codes=False, sample_codebook_temp=1.0, straight_through=False, rotation_trick=None,
               directional_reparam=False, directional_reparam_variance=5e-3, sync_codebook=None,
               sync_affine_param=False, ema_update=None, vq_bridge=None, manual_ema_update=False,
               learnable_codebook=None, in_place_codebook_optimizer=None, manual_in_place_optimizer_update=False,
               affine_param=False, affine_param_batch_decay=0.99, affine_param_codebook_decay=0.9,
               sync_update_v=0.0, return_zeros_for_masked_padding=True, route_gradients_to_input=True):
    """vector-quantize-pytorch's VectorQuantize arguments -> liblockstep's VQ options
    (quant/option_specs.h); TypeError naming an option lockstep does not implement."""
    if in_place_codebook_optimizer is not None and not callable(in_place_codebook_optimizer):
        raise TypeError("lockstep.VectorQuantize: in_place_codebook_optimizer must make an optimizer from the "
                        f"codebook's parameters (torch.optim.Adam, say), got {type(in_place_codebook_optimizer).__name__}")
    # As the reference: the EMA by default; learnable_codebook=True (with ema_update=False) learns the
    # codebook by gradient; ema_update=False alone keeps it as it is; DiVeQ (directional_reparam) and a
    # vq_bridge (a module the codebook passes through before the search) learn it.
    bridged = vq_bridge is not None
    ema_update = (not directional_reparam and not bridged) if ema_update is None else bool(ema_update)
    learnable_codebook = (bool(directional_reparam) or bridged) if learnable_codebook is None else bool(learnable_codebook)
    if bridged and not callable(vq_bridge):
        raise TypeError(f"lockstep.VectorQuantize: vq_bridge must be a module (codebook (codebooks, codebook_size, "
                        f"codebook_dim) -> the same shape), got {type(vq_bridge).__name__}")
    rotation_trick = (not directional_reparam and dim > 1) if rotation_trick is None else rotation_trick
    # straight_through (the reference's Gumbel-softmax straight-through): its soft gradient is detached again by
    # the output's straight-through estimator there, so it is that estimator, as rotation_trick=False gives.
    # The reference's assertions, with its exception type.
    for broken, what in ((bridged and not learnable_codebook, "learnable_codebook must be set to True if vq_bridge is "
                          "passed in"),
                         (bridged and ema_update, "ema_update must be False if vq_bridge is passed in"),
                         (learnable_codebook and ema_update, "learnable_codebook=True needs ema_update=False (the "
                          "codebook is learned by gradient or by the EMA, not both)"),
                         (learnable_codebook and use_cosine_sim, "learnable_codebook=True is not compatible with "
                          "use_cosine_sim=True"),
                         (sum(map(bool, (straight_through, rotation_trick, directional_reparam))) > 1,
                          "take at most one of straight_through, rotation_trick and directional_reparam"),
                         (directional_reparam and not threshold_ema_dead_code, "directional_reparam needs dead-code "
                          "replacement (threshold_ema_dead_code > 0)"),
                         (not 0 <= sync_update_v <= 1, f"sync_update_v={sync_update_v} must lie in [0, 1]"),
                         (sync_update_v > 0 and not learnable_codebook, "sync_update_v > 0 needs learnable_codebook"),
                         (straight_through and learnable_codebook, "straight_through is not taken with a learnable "
                          "codebook"),
                         (orthogonal_reg_active_codes_only and separate_codebook_per_head and heads > 1,
                          "orthogonal regularization for only active codes is not compatible with separate codebooks "
                          "per head")):
        if broken:
            raise AssertionError(f"lockstep.VectorQuantize: {what}, as in the reference")
    # decay, eps, heads, the EMA and estimator flags (as decided above), ...: the same names. The statistics of
    # affine_param are the global batch's whatever sync_affine_param says (docs/python/vq.md).
    options = declared_arguments("vq", locals(), besides=("codebook_dim", "orthogonal_reg_max_codes"))
    options["cosine"] = bool(use_cosine_sim)
    if codebook_dim is not None:
        options["codebook_dim"] = int(codebook_dim)
    # The regulariser over this rank's active codes only, and at most max_codes of them (drawn from the call's
    # (seed, step), the same on every rank; None: all). The reference's 0 takes no code (a NaN loss).
    if orthogonal_reg_max_codes is not None and int(orthogonal_reg_max_codes) < 1:
        raise ValueError(f"lockstep.VectorQuantize: orthogonal_reg_max_codes={orthogonal_reg_max_codes} must be at "
                         "least 1, or None for every code")
    options["orthogonal_reg_max_codes"] = 0 if orthogonal_reg_max_codes is None else int(orthogonal_reg_max_codes)
    # The module's, not liblockstep's: how inputs are laid out, and what padding returns (liblockstep gives
    # 0 there, the module the input when False).
    options["accept_image_fmap"] = bool(accept_image_fmap)
    options["accept_3d_fmap"] = bool(accept_3d_fmap)
    options["channel_last"] = bool(channel_last)
    # sync_codebook=False: every statistic of this rank alone (None and True: over the process group).
    options["sync_codebook"] = sync_codebook is None or bool(sync_codebook)
    # The commitment loss as the cross entropy of each token's chosen code under its logits (liblockstep's).
    options["commitment_use_cross_entropy_loss"] = bool(commitment_use_cross_entropy_loss)
    options["return_zeros_for_masked_padding"] = bool(return_zeros_for_masked_padding)
    options["freeze_codebook"] = bool(freeze_codebook)  # each forward's default
    options["vq_bridge"] = vq_bridge  # run by the module, in torch, on the codebook before each search
    # An optimizer of the codebook's parameters stepped on the in-place loss, in backward (docs/python/vq.md).
    options["in_place_codebook_optimizer"] = in_place_codebook_optimizer
    options["manual_in_place_optimizer_update"] = bool(manual_in_place_optimizer_update)
    return options


def _reference_name(name):
    """The reference keeps its codebook's tensors under `_codebook.` and its projections (codebook_dim) at the top."""
    return name if name.startswith(("project_in.", "project_out.")) else f"_codebook.{name}"


# The reference's fourth return value with return_loss_breakdown=True: each term unweighted.
LossBreakdown = namedtuple("LossBreakdown", ["commitment", "codebook_diversity", "orthogonal_reg", "inplace_optimize"])


def _padding_apart(indices):
    """Indices as forward returns them -> (int64 indices with code 0 at padding, bool mask of the
    padding, the -1s of a masked forward); ValueError for any other negative index."""
    indices = as_indices("lockstep.VectorQuantize", indices)
    padding = indices == -1
    if (indices < -1).any():
        raise ValueError(f"lockstep.VectorQuantize: indices must be -1 (padding) or lie in [0, codebook_size); "
                         f"got {int(indices.min())}")
    return indices.masked_fill(padding, 0), padding


def _unweighted(losses, name, weight, device):
    """Loss `name` of a call divided by its weight; zero where the term is off (weight 0), as the reference."""
    if weight <= 0 or name not in losses:
        return torch.zeros((), device=device)
    return losses[name] / weight


# What vq_options returns that is the module's, not liblockstep's: input layout, padding, forward defaults.
MODULE_KEYS = ("accept_image_fmap", "accept_3d_fmap", "channel_last", "sync_codebook",
               "return_zeros_for_masked_padding", "freeze_codebook", "commitment_use_cross_entropy_loss", "vq_bridge",
               "in_place_codebook_optimizer", "manual_in_place_optimizer_update")


def module_options(options):
    """Takes the module's own keys (MODULE_KEYS) out of vq_options' dict; returns them by name."""
    return {key: options.pop(key) for key in MODULE_KEYS}


class _Codebook(nn.Module):
    """VectorQuantize's `_codebook` (and each ResidualVQ layer's, `_layer_index` naming the layer): the
    reference's Codebook tensors (embed, cluster_size, embed_avg, ...) and its update_ema(). It finds its
    quantizer by handle: a reference to it would be a cycle."""

    def update_ema(self):
        """The codebook recomputed from its EMA statistics (Laplace-smoothed cluster sizes; unit length with
        cosine similarity), in liblockstep, as the reference's Codebook.update_ema: what training calls leave
        to the caller with manual_ema_update=True. Every rank holds the same statistics: no collective."""
        core = _ops._module(self._quantizer_handle)._core
        layer = self.__dict__.get("_layer_index")
        (core if layer is None else core.layer(layer)).update_ema()


class VectorQuantize(LockstepQuantizer):
    """VectorQuantize(dim, codebook_size, ...) as vector-quantize-pytorch's: forward(x) takes
    (b, n, dim) tokens (or (b, dim, n) with channel_last=False, (b, dim, h, w) with accept_image_fmap=True,
    (b, dim, t, h, w) with accept_3d_fmap=True) and returns (quantized, indices, commitment_loss). The
    search, the EMA update of the codebook (its buffers are `_codebook.embed`, `_codebook.cluster_size`,
    `_codebook.embed_avg`, `_codebook.initted`, as the reference names them), k-means initialisation and
    dead-code replacement run in liblockstep."""
    _maps_hint = (" or (b, dim) vectors, or (b, dim, h, w) maps with accept_image_fmap=True, or (b, dim, t, h, w) "
                  "with accept_3d_fmap=True")

    def __init__(self, dim, codebook_size, *reference_args, seed=None, process_group=None, collective_timeout=300.0,
                 **options):
        options = vq_options(dim, codebook_size, *reference_args, **options)
        heads = options["heads"]
        own = module_options(options)
        super().__init__("vq", "vq", options, seed, process_group, collective_timeout, rename=_reference_name)
        self.dim = self._core.dim
        self.codebook_size = codebook_size
        self.heads = heads
        self.accept_image_fmap = own["accept_image_fmap"]
        self.accept_3d_fmap = own["accept_3d_fmap"]
        self.channel_last = own["channel_last"]
        self.sync_codebook = own["sync_codebook"]
        self.return_zeros_for_masked_padding = own["return_zeros_for_masked_padding"]
        self.freeze_codebook = own["freeze_codebook"]
        self.commitment_use_cross_entropy_loss = own["commitment_use_cross_entropy_loss"]
        self.codebook_diversity_loss_weight = options["codebook_diversity_loss_weight"]
        self.codebook_diversity_temperature = options["codebook_diversity_temperature"]
        self.has_projections = any(name.startswith("project_in.") for name in self._parameter_names)
        self.commitment_weight = options["commitment_weight"]
        self.orthogonal_reg_weight = options["orthogonal_reg_weight"]
        if own["vq_bridge"] is not None:  # where the reference holds it: `_codebook.vq_bridge.*` in the state dict
            self._codebook.add_module("vq_bridge", own["vq_bridge"])
        # As the reference makes it: over the codebook's parameters (embed when learned, a vq_bridge's); an
        # EMA codebook has none, and torch's optimizers refuse an empty list.
        factory = own["in_place_codebook_optimizer"]
        self.manual_in_place_optimizer_update = own["manual_in_place_optimizer_update"]
        self.in_place_codebook_optimizer = None if factory is None else factory(self._codebook.parameters())
        self._start_in_place_updates()

    def _start_in_place_updates(self):
        """With an in-place optimizer: liblockstep keeps each training call's in-place gradient, and unless
        manual_in_place_optimizer_update the optimizer steps on it once backward has accumulated the codebook's
        gradient (docs/python/vq.md)."""
        self._in_place_hook = None
        if getattr(self, "in_place_codebook_optimizer", None) is None:
            return
        self._core.keep_in_place_gradient(True)
        embed = self._codebook.embed
        if not self.manual_in_place_optimizer_update and isinstance(embed, nn.Parameter):
            self._in_place_hook = _in_place.after_backward(embed, self, "_in_place_step")

    def _in_place_gradients(self):
        return _in_place.gradients(self.in_place_codebook_optimizer, self._core.take_in_place_gradient(),
                                   self._codebook)

    def _in_place_step(self):
        _in_place.step_alone(self.in_place_codebook_optimizer, self._in_place_gradients())

    def update_in_place_optimizer(self):
        """The in-place optimizer's step, as the reference's (what manual_in_place_optimizer_update=True leaves to
        the caller): the in-place loss's gradient of the training calls backwarded since the last step (the
        global batch's, reduced in their backward) added to the parameters' gradients, a step, then zero_grad.
        Communicates nothing: the gradients the caller's backward left are the caller's framework's (DDP
        averages them), where the reference all-reduces them here."""
        if self.in_place_codebook_optimizer is not None:
            _in_place.add_and_step(self.in_place_codebook_optimizer, self._in_place_gradients())

    def _bridged_codebook(self, x, channel_first, mask):
        """The codebook through the vq_bridge (differentiable), for liblockstep to search and quantize to; None
        without one. With kmeans_init, a training call's bridge takes the codebook k-means set from x first, as
        the reference's (liblockstep's search would run it after the bridge). Decoding from indices takes
        embed itself, as the reference's does."""
        bridge = self._codebook._modules.get("vq_bridge")
        if bridge is None:
            return None
        return bridge(self._initialised_embed(x, channel_first, mask))

    def _initialised_embed(self, x, channel_first, mask):
        """embed, once a training call that may change state (a backward may follow, or it is a whole step) has
        run k-means on x, when kmeans_init: what the reference's search of this call reads."""
        embed = self._codebook.embed
        if self.training and self._spec[2].get("kmeans_init"):
            tokens = self._tokens_of(x, channel_first)[0]
            run = torch.is_grad_enabled() or self._is_whole_step(tokens)
            embed = self._initialised_first(tokens, embed, run, mask)
        return embed

    def _codebook_as_found(self, x, channel_first, mask, bridged):
        """The codebook the cross entropy after this call takes: as the call searched it. A whole step updates an
        EMA codebook before forward returns, where the reference's cross entropy takes its codes from before
        the update; a copy is taken first where a call may be one (a learned codebook, which the update leaves,
        stays itself)."""
        if bridged is not None or not self.training or isinstance(self._codebook.embed, nn.Parameter):
            return bridged
        if self._ranks() > 1 and not self.update_in_forward:  # the update waits for backward: embed stays as found
            return None
        return self._initialised_embed(x, channel_first, mask).detach().clone()

    def _register_ops(self):
        super()._register_ops()
        codebook = self._modules["_codebook"]  # made when the tensors were adopted
        codebook.__class__ = _Codebook
        codebook._quantizer_handle = self._handle
        optimizer = self.__dict__.get("in_place_codebook_optimizer")
        if optimizer is not None:  # a copy's (deepcopy, unpickling): its optimizer takes the adopted tensors
            _in_place.rebind(optimizer, list(self._codebook.parameters()))
            self._start_in_place_updates()

    @property
    def codebook(self):
        embed = self._codebook.embed
        return embed if embed.shape[0] > 1 else embed[0]

    def get_codes_from_indices(self, indices):
        """Indices as forward returns them -> the codebook's vectors (before any projection out), as
        the reference gives them: separate codebooks per head concatenated, (b, n, heads * codebook_dim);
        one codebook, (b, n, codebook_dim) or (b, n, heads, codebook_dim); channel first with
        accept_image_fmap. A -1 (padding, as a masked forward returns it) gives zeros."""
        codebook = self._codebook.embed  # (codebooks, codebook_size, codebook_dim)
        indices, padding = _padding_apart(indices)
        if codebook.shape[0] == 1:
            codes = codebook[0][indices].masked_fill(padding.unsqueeze(-1), 0.0)
        else:
            flat = indices.reshape(indices.shape[0], -1, self.heads)  # (b, n, heads)
            gone = padding.reshape(flat.shape).unsqueeze(-1)
            per_head = [codebook[h][flat[..., h]].masked_fill(gone[..., h, :], 0.0) for h in range(self.heads)]
            codes = torch.cat(per_head, dim=-1).reshape(*indices.shape[:-1], -1)
        return codes.movedim(-1, 1) if self._channel_first_maps(codes.ndim) else codes

    def get_output_from_indices(self, indices):
        """Indices as forward returns them -> forward's quantized output (projected out), from
        liblockstep's decode: (b, n, dim), or channel first with accept_image_fmap. A -1 (padding, as a
        masked forward returns it) gives zeros, as forward gives at padding by default."""
        indices, padding = _padding_apart(indices)
        spatial = indices.shape[1:-1] if self.heads > 1 else indices.shape[1:]
        flat = indices.reshape(indices.shape[0], -1, *([self.heads] if self.heads > 1 else []))
        padding = padding.reshape(flat.shape[0], flat.shape[1], -1).any(-1, keepdim=True)  # (b, n, 1)
        out = self._core.decode(flat).masked_fill(padding, 0.0)
        out = out.reshape(out.shape[0], *spatial, out.shape[-1])
        projected = any(name.startswith("project_out.") for name in self._parameter_names)
        if self.heads > 1 and self._codebook.embed.shape[0] == 1 and not projected:
            # One codebook for every head, no projection: the reference returns the codes per head.
            out = out.reshape(*out.shape[:-1], self.heads, -1)
        return out.movedim(-1, 1) if self._channel_first_maps(out.ndim) else out

    def _channel_first_maps(self, ndim):
        """Whether a result of `ndim` axes is laid out channel first: maps, and with channel_last=False
        sequences (b, dim, n), as the reference lays them out (not a single token's (b, dim))."""
        return self.accept_image_fmap or self.accept_3d_fmap or (not self.channel_last and ndim > 2)

    def _reduces_over_group(self):
        return self.sync_codebook

    def _all_loss_names(self, names):
        # With an in-place optimizer a training call with gradients reports the in-place loss too (the
        # signature's calls run without gradients).
        return set(names) | ({"in_place"} if self.in_place_codebook_optimizer is not None else set())

    def _codebook_learned_by_commitment(self):
        return self._spec[2].get("learnable_codebook", False) and not self.orthogonal_reg_weight

    def _cross_entropy(self, x, indices, codebook=None, token_codes=None):
        """forward(x, indices=...): the cross entropy of the given codes (-1 ignored) under each code's
        logit for each token (minus the distance, or the cosine similarity; liblockstep's), as the
        reference's; the codebook as this call found it (the step's EMA update waits for backward)."""
        logits = self._core.code_logits(x, codebook, token_codes)  # (b, n[, heads], K)
        expected = logits.shape[:-1]
        if tuple(indices.shape) != tuple(expected):
            raise ValueError(f"lockstep.VectorQuantize: indices must have shape {tuple(expected)}, "
                             f"got {tuple(indices.shape)}")
        return torch.nn.functional.cross_entropy(logits.movedim(-1, 1), indices.long(), ignore_index=-1)

    def _cross_entropy_commitment(self, x, idx, mask, codebook=None):
        """commitment_use_cross_entropy_loss: commitment_weight times the cross entropy of each token's chosen
        code under its logits (liblockstep's, the codebook as this call found it), padding ignored, as the
        reference's; x as forward took it (tokens, or maps channel first), idx as forward returns them."""
        if self.accept_image_fmap or self.accept_3d_fmap:
            x = x.movedim(1, -1).reshape(x.shape[0], -1, x.shape[1])
        chosen = idx.reshape(x.shape[0], x.shape[1], *([self.heads] if self.heads > 1 else []))
        if mask is not None:
            chosen = chosen.masked_fill(~mask.reshape(*mask.shape, *([1] * (chosen.ndim - 2))), -1)
        weight = self.commitment_weight if self.commitment_weight > 0 else 0.0
        return self._cross_entropy(x, chosen, codebook) * weight

    def forward(self, x, indices=None, mask=None, lens=None, topk=None, sample_codebook_temp=None,
                freeze_codebook=None, return_loss_breakdown=False, codebook_transform_fn=None, ema_update_weight=None,
                accum_ema_update=False, ema_update=None):
        # The reference's forward arguments, in its order; those lockstep does not implement are named.
        if topk is not None:
            topk = min(int(topk), self.codebook_size)
            if self.heads != 1 or topk < 1:  # the reference's assertion
                raise AssertionError("lockstep.VectorQuantize: topk codes need one head and topk > 0, as the "
                                     f"reference's; got heads={self.heads}, topk={topk}")
            if self.training and self.in_place_codebook_optimizer is not None:
                raise AssertionError("lockstep.VectorQuantize: topk codes are not taken in training with an "
                                     "in_place_codebook_optimizer, as the reference's")
        # This call's EMA update, as the reference's forward takes it (a top-k search updates nothing).
        vq_call = dict(ema_update_weight=ema_update_weight, accumulate=bool(accum_ema_update),
                       ema_update=None if ema_update is None else bool(ema_update))
        if sample_codebook_temp is not None:  # this call's sampling temperature (stochastic_sample_codes)
            vq_call["sample_codebook_temp"] = checked_temperature("lockstep.VectorQuantize", sample_codebook_temp)
        # A training forward that leaves the codebook as it is (the module's setting unless given).
        freeze_codebook = self.freeze_codebook if freeze_codebook is None else bool(freeze_codebook)
        # channel_last=False: sequences come (b, dim, n) and go back so; a mask or lens counts along n.
        transposed = not self._channel_first_maps(2) and not self.channel_last and x.ndim == 3
        if transposed:
            x = x.transpose(1, 2)
        # Padded sequences: a masked token counts in no statistic (on any rank) and no loss.
        mask = padding_mask("lockstep.VectorQuantize", x, mask, lens)  # for (b, n, d) tokens only, as there
        if indices is not None and (x.ndim != 3 or mask is not None or topk is not None):
            raise ValueError("lockstep.VectorQuantize: indices= takes tokens (b, n, dim) and no mask or topk (the "
                             "reference's cross entropy fails on other shapes and ignores a mask)")
        only_one = x.ndim == 2  # one token per item, (b, dim), as the reference takes it
        maps = self.accept_image_fmap or self.accept_3d_fmap
        bridged = self._bridged_codebook(x.unsqueeze(1) if only_one else x, maps, mask)
        if codebook_transform_fn is not None:  # each token's own codes, from the user's function of the codebook
            vq_call["token_codes"] = self._codes_per_token(codebook_transform_fn, x.unsqueeze(1) if only_one else x,
                                                           maps, bridged)
        if indices is not None or (self.commitment_use_cross_entropy_loss and topk is None):
            found = self._codebook_as_found(x.unsqueeze(1) if only_one else x, maps, mask, bridged)
        out, idx, losses = self._quantize_any(x.unsqueeze(1) if only_one else x, maps, False, self.heads, mask,
                                              freeze_codebook, topk=topk, codebook=bridged, **vq_call)
        in_place = losses.pop("in_place", None)  # a value for the breakdown; the optimizer steps in backward
        if mask is not None and not self.return_zeros_for_masked_padding:
            kept = mask.reshape(*mask.shape, *([1] * (out.ndim - mask.ndim)))
            out = torch.where(kept, out, x.unsqueeze(2) if topk is not None else x)  # padding passes through
        if transposed:
            out = out.movedim(-1, 1)
        if indices is not None:
            # The training call's state update rides on the backward of what is returned (the reference
            # updates in forward): the cross entropy carries the call's graph at weight 0.
            anchor = sum(losses.values()) if losses else out.sum()
            return out, self._cross_entropy(x, indices, found, vq_call.get("token_codes")) + 0.0 * anchor
        if self.commitment_use_cross_entropy_loss and topk is None and "commitment" in losses:
            # The call's state update rides on the backward of what it returned: the cross entropy carries the
            # squared commitment's graph at weight 0.
            losses["commitment"] = (self._cross_entropy_commitment(x.unsqueeze(1) if only_one else x, idx, mask, found)
                                    + 0.0 * losses["commitment"])
        if only_one:
            out, idx = out.squeeze(1), idx.squeeze(1)
        if topk is not None:
            loss = self._topk_loss(losses, only_one)
        else:
            loss = sum(losses.values()) if losses else torch.zeros((), device=out.device)
        if not return_loss_breakdown:
            return out, idx, loss
        zero = torch.zeros((), device=out.device)
        if topk is not None:
            commitment = losses["code"].squeeze(1) if only_one else losses["code"]
        else:
            commitment = _unweighted(losses, "commitment", self.commitment_weight, out.device)
        orthogonal = _unweighted(losses, "orthogonal", self.orthogonal_reg_weight, out.device)
        diversity = _unweighted(losses, "diversity", self.codebook_diversity_loss_weight, out.device)
        return out, idx, loss, LossBreakdown(commitment, diversity, orthogonal, zero if in_place is None else in_place)

    def _initialised_first(self, tokens, passed=None, run=True, mask=None):
        """`passed` (tokens when None) once k-means has initialised the codebook from tokens (b, n, dim) as forward
        takes them, when kmeans_init, not yet done and `run` (a call that may change state; whatever the mode for
        RandomProjectionQuantizer's, which runs in evaluation and is initialised by its first call, as the
        reference's). Under compile through the custom op at every call (a copy once initialised): what reads
        the codebook takes its output, so the op comes first."""
        if not self._spec[2].get("kmeans_init") or (not torch.compiler.is_compiling()
                                                    and (not run or bool(self._codebook.initted))):
            return tokens if passed is None else passed
        if passed is None:
            return _ops.vq_initialise(tokens.float(), tokens, self._handle, run, mask)
        return _ops.vq_initialise(tokens.float(), passed.clone(), self._handle, run, mask, codebook=True)

    def _codes_per_token(self, transform, x, maps, bridged):
        """forward(codebook_transform_fn=transform): transform(codebook) as the reference takes it, each token's own
        codes (h, b, n, K, d) (n a map's positions; h the heads with separate codebooks, else 1 with b the (batch,
        head) pairs), as (codebooks, tokens, K, d) in liblockstep's order of a codebook's tokens, which it searches
        each alone; the codebook through the vq_bridge first when there is one (`bridged`), then moved by
        affine_param's statistics, as there."""
        embed = self._codebook.embed
        learned = self._spec[2].get("learnable_codebook", False)
        # A copy of an EMA codebook: its update in backward writes embed before the function's backward runs.
        codebook = bridged if bridged is not None else embed if learned else embed.detach().clone()
        if self._spec[2].get("affine_param"):  # liblockstep's move, by the statistics through the last update
            codebook = self._core.searched_codebook(codebook)
        codes = transform(codebook)
        tokens, _ = self._tokens_of(x, maps)
        b, n = tokens.shape[:2]
        k, d = embed.shape[-2:]
        separate = self.heads > 1 and self._spec[2].get("separate_codebook_per_head", False)
        expected = (self.heads, b, n, k, d) if separate else (1, b * self.heads, n, k, d)
        if codes.shape[-2:] != (k, d) or codes.numel() != math.prod(expected):
            raise ValueError(f"lockstep.VectorQuantize: codebook_transform_fn must give each token's codes "
                             f"{expected}, got {tuple(codes.shape)}")
        codes = codes.reshape(expected).float()
        if separate or self.heads == 1:
            return codes.reshape(expected[0], b * n, k, d)
        # The heads of a shared codebook: the reference's (batch, head) pairs, liblockstep's tokens by (b, n, head).
        return codes.reshape(b, self.heads, n, k, d).transpose(1, 2).reshape(1, b * n * self.heads, k, d)

    def _topk_loss(self, losses, only_one):
        """The reference's loss of a top-k call: each code's commitment loss (..., k), times commitment_weight
        when it is > 0 (in training a weight of 0 leaves a scalar 0), plus the call's scalar terms."""
        code = losses["code"].squeeze(1) if only_one else losses["code"]
        scalars = sum((value for name, value in losses.items() if name != "code"), torch.zeros((), device=code.device))
        if self.commitment_weight > 0:
            return code * self.commitment_weight + scalars
        return scalars if self.training else code + scalars

    def update_indices(self, x, indices, mask=None):
        """The EMA update (and, in training, dead-code replacement) of x's tokens with codes chosen elsewhere
        (a beam search, a top-k forward), as the reference's update_indices: x and indices as forward takes
        and returns them (-1: not counted), `mask` (b, n) for tokens. Unlike a forward it communicates now:
        the statistics are reduced over the process group at once, so every rank of it must call this; then
        the step advances (docs/python/vq.md)."""
        maps = self.accept_image_fmap or self.accept_3d_fmap
        if maps and mask is not None:
            raise AssertionError("lockstep.VectorQuantize: update_indices takes no mask with feature maps, as the "
                                 "reference's")
        if not maps and not self.channel_last and x.ndim == 3:
            x = x.transpose(1, 2)
        indices = torch.as_tensor(indices, device=x.device)
        if maps:  # (b, dim, ...) -> tokens (b, n, dim); indices (b, ...[, heads]) -> (b, n[, heads])
            x = x.movedim(1, -1).reshape(x.shape[0], -1, x.shape[1])
            indices = indices.reshape(x.shape[0], x.shape[1], *([self.heads] if self.heads > 1 else []))
        elif x.ndim == 2:  # one token per item
            x, indices = x.unsqueeze(1), indices.unsqueeze(1)
        check_floating("lockstep.VectorQuantize", x)
        mask = padding_mask("lockstep.VectorQuantize", x, mask, None)
        group = self._lazy_group()
        self._core.update_indices(x.float(), as_indices("lockstep.VectorQuantize", indices), self.seed, self._steps,
                                  group, self.training, _C.Call(mask=mask))

    update_ema_indices = update_indices  # the reference's other name for it


declare_reference_signature(VectorQuantize, vq_options)
