"""SimVQ (vector_quantize_pytorch.SimVQ's arguments and return values): a frozen random codebook whose
codes reach the tokens through one learned linear map."""
import math

import torch
import torch.nn.functional as F

from ._quantizer import LockstepQuantizer, as_indices, identity, refuse


class SimVQ(LockstepQuantizer):
    """SimVQ(dim, codebook_size, ...) as vector-quantize-pytorch's: forward(x) takes (b, ..., dim) tokens,
    or (b, dim, ...) with channel_first=True, and returns (quantized, indices, commit_loss). The search,
    the commitment loss and the gradient estimator run in liblockstep; the state is the buffer
    `frozen_codebook` (codebook_size, frozen_codebook_dim) and the parameter `code_transform.weight`
    (dim, frozen_codebook_dim), as the reference names them. Nothing is reduced between ranks: under
    DDP the map's gradient is averaged like any parameter's."""

    def __init__(self, dim, codebook_size, codebook_transform=None, init_fn=identity, channel_first=False,
                 rotation_trick=True, input_to_quantize_commit_loss_weight=0.25, commitment_weight=1.0,
                 frozen_codebook_dim=None, *, seed=None, process_group=None, collective_timeout=300.0):
        if codebook_transform is not None:
            refuse("lockstep.SimVQ", "codebook_transform", type(codebook_transform).__name__,
                   "None, the linear map without bias, which liblockstep runs")
        options = dict(dim=int(dim), codebook_size=int(codebook_size), rotation_trick=bool(rotation_trick),
                       input_to_quantize_commit_loss_weight=float(input_to_quantize_commit_loss_weight),
                       commitment_weight=float(commitment_weight))
        if frozen_codebook_dim is not None:
            options["frozen_codebook_dim"] = int(frozen_codebook_dim)
        super().__init__("simvq", "simvq", options, seed, process_group, collective_timeout)
        if init_fn is not None and init_fn is not identity:  # the reference's: applied to the frozen codes drawn
            with torch.no_grad():
                frozen = self.get_buffer("frozen_codebook")
                made = torch.as_tensor(init_fn(frozen.clone()))
                if made.shape != frozen.shape:
                    raise ValueError(f"lockstep.SimVQ: init_fn must keep the codebook's shape {tuple(frozen.shape)}, "
                                     f"got {tuple(made.shape)}")
                frozen.copy_(made)
        self.dim = int(dim)
        self.codebook_size = int(codebook_size)
        self.channel_first = bool(channel_first)
        self.rotation_trick = bool(rotation_trick)
        self.input_to_quantize_commit_loss_weight = float(input_to_quantize_commit_loss_weight)
        self.commitment_weight = float(commitment_weight)

    @property
    def codebook(self):
        """The implicit codebook (codebook_size, dim): the frozen codes through the map, differentiable."""
        return F.linear(self.frozen_codebook, self.code_transform.weight)

    def indices_to_codes(self, indices):
        """Indices as forward returns them -> the quantized vectors (b, ..., dim), channel first with
        channel_first; differentiable in the map, as the reference's."""
        indices = as_indices("lockstep.SimVQ", indices)
        flat = indices.reshape(indices.shape[0], -1)
        codes = self._core.decode(flat).reshape(*indices.shape, self.dim)
        return codes.movedim(-1, 1) if self.channel_first else codes

    def forward(self, x):
        if self.channel_first:
            out, indices, losses = self._quantize_any(x, True, False, 1)
        else:  # (b, ..., dim): the middle axes packed into one, as the reference packs them
            if x.ndim < 2:
                raise ValueError(f"lockstep.SimVQ: expected (b, ..., {self.dim}) tokens, got shape {tuple(x.shape)}")
            flat = x.reshape(x.shape[0], math.prod(x.shape[1:-1]), x.shape[-1])
            out, indices, losses = self._quantize_any(flat, False, False, 1)
            out = out.reshape(*x.shape[:-1], out.shape[-1])
            indices = indices.reshape(x.shape[:-1])
        return out, indices, losses["commitment"]
