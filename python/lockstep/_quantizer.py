"""What every lockstep module shares: the liblockstep quantizer it runs, whose parameters and
buffers it registers as its own (the same tensors, so optimizers, state_dict() and .to() act on
what liblockstep computes with), and the randomness it draws from (seed, step)."""
import torch
from torch import nn

from . import _C


def refuse_unsupported(module_name, given, supported_defaults):
    """TypeError naming the first option given a value lockstep does not implement."""
    for name, default in supported_defaults.items():
        value = given[name]
        if value != default:
            raise TypeError(
                f"{module_name}: option {name}={value!r} is not supported by lockstep "
                f"(only {default!r}); see docs/python.md for the options and deliberate differences"
            )


class LockstepQuantizer(nn.Module):
    def __init__(self, name, section, options, seed=0):
        super().__init__()
        self._core = _C.Quantizer(name, section, options)
        # Randomness (noise dropout, sampled codes, k-means seeds) is a pure function of (seed, step),
        # the step advancing once per training forward: no collective is needed to agree on it.
        self.seed = int(seed)
        self.step = 0
        for dotted, tensor in self._core.parameters().items():
            tensor.__class__ = nn.Parameter  # the same tensor, now registrable as a parameter
            owner, name = self._owner(dotted)
            owner.register_parameter(name, tensor)
        for dotted, tensor in self._core.buffers().items():
            owner, name = self._owner(dotted)
            owner.register_buffer(name, tensor)

    def _owner(self, dotted):
        """The (sub)module that holds `dotted` ("project_in.weight"), made on first use."""
        *path, name = dotted.split(".")
        owner = self
        for part in path:
            if part not in owner._modules:
                owner.add_module(part, nn.Module())
            owner = owner._modules[part]
        return owner, name

    def _quantize_any(self, x, channel_first, keep_codebook_axis, num_codebooks):
        """(b, n, dim) tokens, or (b, dim, ...) maps when `channel_first` -> (quantized in x's
        layout and dtype, indices (b, n[, c]) or (b, ...[, c]), {name: loss}), as the reference
        shapes them: the codebook axis kept for one codebook when `keep_codebook_axis`."""
        if channel_first:
            x = x.movedim(1, -1)
            spatial = x.shape[1:-1]
            x = x.reshape(x.shape[0], -1, x.shape[-1])
        if x.shape[-1] != self.dim:
            raise ValueError(f"lockstep.{type(self).__name__}: expected dimension {self.dim} but found {x.shape[-1]}")
        out, indices, losses = self._quantize(x.float())
        out = out.to(x.dtype)
        if num_codebooks == 1 and keep_codebook_axis:
            indices = indices.unsqueeze(-1)
        if channel_first:
            out = out.reshape(out.shape[0], *spatial, out.shape[-1]).movedim(-1, 1)
            indices = indices.reshape(indices.shape[0], *spatial, *indices.shape[2:])
        return out, indices, losses

    def _quantize(self, x):
        """x: (b, n, dim) float32 -> (quantized, int64 indices, {name: loss})."""
        quantized, indices, losses = self._core.quantize(x, self.training, self.seed, self.step)
        if self.training:
            self.step += 1
        return quantized, indices, losses
