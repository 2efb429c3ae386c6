"""Residual quantizers (vector_quantize_pytorch.ResidualVQ's arguments and return values)."""
import re

import torch

from ._quantizer import LockstepQuantizer, only_defaults, refuse
from .vq import vq_options


class ResidualVQ(LockstepQuantizer):
    """ResidualVQ(dim=, num_quantizers=, codebook_size=, ...) as vector-quantize-pytorch's: each layer
    a VectorQuantize (its arguments are passed on) quantizing what the layers before left; forward(x)
    returns (quantized, indices (b, n, num_quantizers), per-layer commitment losses). Each layer's
    buffers carry the reference's names (`layers.0._codebook.embed`, ...)."""

    def __init__(self, *, dim, num_quantizers, codebook_size, codebook_dim=None, shared_codebook=False,
                 diveq=False, heads=1, quantize_dropout=False, quantize_dropout_cutoff_index=0,
                 quantize_dropout_multiple_of=1, accept_image_fmap=False, implicit_neural_codebook=False,
                 mlp_kwargs=None, beam_size=None, eval_beam_size=None, beam_score_quantizer_weights=None,
                 quant_grad_frac=0.0, return_zeros_for_masked_padding=True, seed=0, process_group=None,
                 collective_timeout=300.0, **vq_kwargs):
        mlp_kwargs = mlp_kwargs or None  # the reference's default is an empty dict
        only_defaults("lockstep.ResidualVQ", ResidualVQ.__init__, locals(),
                      ("shared_codebook", "diveq", "heads", "implicit_neural_codebook", "mlp_kwargs", "beam_size",
                       "eval_beam_size", "beam_score_quantizer_weights", "quant_grad_frac",
                       "return_zeros_for_masked_padding"))
        if codebook_dim is not None and codebook_dim != dim:
            refuse("lockstep.ResidualVQ", "codebook_dim", codebook_dim, "dim: the layers quantize the input's dimension")
        layer = vq_options(dim, codebook_size, **vq_kwargs)
        layer.pop("accept_image_fmap")
        options = {f"vq.{key}": value for key, value in layer.items()}
        options.update(num_quantizers=int(num_quantizers), quantize_dropout=bool(quantize_dropout),
                       quantize_dropout_cutoff_index=int(quantize_dropout_cutoff_index),
                       quantize_dropout_multiple_of=int(quantize_dropout_multiple_of))
        super().__init__("residual-vq", "residual", options, seed, process_group, collective_timeout,
                         rename=lambda name: re.sub(r"^layer(\d+)\.", r"layers.\1._codebook.", name))
        self.dim = self._core.dim
        self.num_quantizers = num_quantizers
        self.codebook_size = codebook_size
        self.accept_image_fmap = accept_image_fmap

    def forward(self, x, indices=None, return_all_codes=False, sample_codebook_temp=None, freeze_codebook=False,
                mask=None, return_loss_breakdown=False):
        for name, value, default in (("indices", indices, None), ("return_all_codes", return_all_codes, False),
                                     ("sample_codebook_temp", sample_codebook_temp, None),
                                     ("freeze_codebook", freeze_codebook, False), ("mask", mask, None),
                                     ("return_loss_breakdown", return_loss_breakdown, False)):
            if value is not default and value != default:
                raise TypeError(f"lockstep.ResidualVQ: forward option {name} is not supported by lockstep")
        out, idx, losses = self._quantize_any(x, self.accept_image_fmap, True, self.num_quantizers)
        # one commitment loss per layer, in layer order, as the reference returns them
        per_layer = [sum(v for k, v in losses.items() if k.startswith(f"layer{q}.")) for q in
                     range(self.num_quantizers)]
        zero = torch.zeros((), device=out.device)
        return out, idx, torch.stack([p if torch.is_tensor(p) else zero for p in per_layer])
