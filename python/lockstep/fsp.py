"""Finite scalar perturbation (vector_quantize_pytorch.FSP's arguments and return values): CDF-activated
bins, perturbed within a bin in training, with a regulariser on each channel's batch moments."""
import math

import torch

from . import _C
from ._quantizer import LockstepQuantizer, as_indices, check_floating, declared_arguments


def build_cdf_act(act_name):
    """(the CDF activation `act_name`, its inverse), as vector_quantize_pytorch.finite_scalar_perturbation's
    build_cdf_act: "tanh", "sigmoid", "normal", "laplace" or "cauchy", computed by liblockstep (the functions
    FSP itself runs); AssertionError for another name, as there."""
    try:
        _C.fsp_activate(act_name, torch.zeros(0))  # liblockstep knows the names
    except ValueError as e:
        raise AssertionError(f"lockstep: CDF activation {act_name!r} not available: {e}") from None

    def act(z):
        return _C.fsp_activate(act_name, z)

    def inv_act(p):
        return _C.fsp_invert(act_name, p)

    act.__name__, inv_act.__name__ = f"{act_name}_act", f"{act_name}_inv_act"
    return act, inv_act


# The reference's module-level pairs, by their names there (tanh_act, tanh_inv_act, ...).
tanh_act, tanh_inv_act = build_cdf_act("tanh")
sigmoid_act, sigmoid_inv_act = build_cdf_act("sigmoid")
normal_act, normal_inv_act = build_cdf_act("normal")
laplace_act, laplace_inv_act = build_cdf_act("laplace")
cauchy_act, cauchy_inv_act = build_cdf_act("cauchy")


class FSP(LockstepQuantizer):
    """FSP(levels, dim=None, ...) as vector-quantize-pytorch's: forward(z) takes (..., dim) (or
    (b, dim, ...) with channel_first) and returns (quantized, indices, norm_loss, info). The bins,
    the perturbation, the regulariser (over the global batch in training) and its gradient run in
    liblockstep (quant/fsp.h)."""

    def __init__(self, levels, dim=None, channel_first=False, projection_has_bias=True, act_name="tanh",
                 quantize_rate=0.0, need_inv_act=False, vector_norm="var_tanh", *, seed=None, process_group=None,
                 collective_timeout=300.0):
        levels = [int(level) for level in levels]
        # levels, projection_has_bias, quantize_rate, need_inv_act, vector_norm: the same names.
        options = declared_arguments("fsp", locals(), besides=("dim",))
        options.update(dim=0 if dim is None else int(dim), activation=str(act_name))
        # The reference keeps its level and basis tensors out of its state dict.
        super().__init__("fsp", "fsp", options, seed, process_group, collective_timeout,
                         persistent=lambda name: name not in ("_levels", "_basis"))
        self.codebook_dim = len(levels)
        self.dim = self._core.dim
        self.codebook_size = self._core.codebook_size
        self.has_projections = self.dim != self.codebook_dim
        self.channel_first = bool(channel_first)
        self.act_name = str(act_name)
        self.need_inv_act = bool(need_inv_act)
        self.quantize_rate = float(quantize_rate)

    def __repr__(self):
        return (f"lockstep.FSP(levels={self._levels.long().tolist()}, codebook_size={self.codebook_size}, "
                f"codebook_dim={self.codebook_dim}, dim={self.dim}, act_name='{self.act_name}', "
                f"need_inv_act={self.need_inv_act}, quantize_rate={self.quantize_rate})")

    def indices_to_level_indices(self, indices):
        """Indices (...) -> each channel's bin (..., len(levels)), the first level least significant."""
        return self._core.level_indices(as_indices("lockstep.FSP", indices))

    def level_indices_to_indices(self, level_indices):
        """Each channel's bin (..., len(levels)) -> the index (...), int32 as the reference's."""
        return (level_indices.long() * self._basis.to(level_indices.device)).sum(-1).to(torch.int32)

    def indices_to_codes(self, indices, eps=1e-6):
        """Indices as forward returns them -> forward's evaluation output (the bins' values, projected
        out); channel first with channel_first. `eps`: need_inv_act's clamp before the inverse, as there."""
        shape = indices.shape
        flat = as_indices("lockstep.FSP", indices).reshape(1, -1)
        codes = self._core.decode_clamped(flat, float(eps)).reshape(*shape, self.dim)
        return codes.movedim(-1, 1) if self.channel_first else codes

    def forward(self, z, eps=None):
        # The clamp epsilon, as the reference's `eps or finfo.eps`: None and 0 leave float32's machine epsilon.
        eps = float(eps) if eps else None
        check_floating("lockstep.FSP", z)
        if self.channel_first:
            z = z.movedim(1, -1)
        if z.shape[-1] != self.dim:
            raise ValueError(f"lockstep.FSP: expected dimension of {self.dim} but found dimension of {z.shape[-1]}")
        shape = z.shape
        # (b, n, dim): the first axis the batch (n given, not -1, which an empty batch leaves ambiguous)
        tokens = z.reshape(shape[0], math.prod(shape[1:-1]), self.dim) if z.ndim > 1 else z.reshape(1, 1, self.dim)
        out, indices, losses = self._quantize(tokens.float(), fsp_eps=eps)
        out = out.to(z.dtype).reshape(shape)
        indices = indices.reshape(shape[:-1]).to(torch.int32)
        info = self._info(tokens, eps)
        info["level_indices"] = info["level_indices"].reshape(*shape[:-1], self.codebook_dim)
        if self.channel_first:
            out = out.movedim(-1, 1)
        return out, indices, losses["norm"], info

    @torch.compiler.disable
    def _info(self, tokens, eps=None):
        """The reference's fourth return value, of this rank's tokens (liblockstep's Fsp::diagnostics):
        level indices (float, as there), the batch statistics and, in training with quantize_rate < 1,
        the share of accepted perturbations (the same draws as the call's)."""
        group = self._lazy_group() if self.training else None
        level_indices, mean, variance, skewness, kurtosis, accept_rate = self._core.diagnostics(
            tokens.float(), self.training, self.seed, self._steps, group, eps)
        info = {"level_indices": level_indices.float(),
                "norm_info": {"mean": mean, "variance": variance, "skewness": skewness, "kurtosis": kurtosis}}
        if accept_rate is not None:
            info["p_accept_prob"] = accept_rate
        return info
