"""SimVQ (vector_quantize_pytorch.SimVQ's arguments and return values): a frozen random codebook whose
codes reach the tokens through one learned linear map."""
import math

import torch
import torch.nn.functional as F

from ._quantizer import LockstepQuantizer, as_indices, declared_arguments, identity


class SimVQ(LockstepQuantizer):
    """SimVQ(dim, codebook_size, ...) as vector-quantize-pytorch's: forward(x) takes (b, ..., dim) tokens,
    or (b, dim, ...) with channel_first=True, and returns (quantized, indices, commit_loss). The search,
    the commitment loss and the gradient estimator run in liblockstep; the state is the buffer
    `frozen_codebook` (codebook_size, frozen_codebook_dim) and the parameter `code_transform.weight`
    (dim, frozen_codebook_dim), as the reference names them. A `codebook_transform` of the user's (any
    module mapping the frozen codes to (codebook_size, dim)) runs here, in torch, each call; liblockstep
    quantizes to the codes it gives and returns their gradient, so the module trains as in the reference. Nothing is reduced between ranks: under
    DDP the map's gradient is averaged like any parameter's."""

    def __init__(self, dim, codebook_size, codebook_transform=None, init_fn=identity, channel_first=False,
                 rotation_trick=True, input_to_quantize_commit_loss_weight=0.25, commitment_weight=1.0,
                 frozen_codebook_dim=None, *, seed=None, process_group=None, collective_timeout=300.0):
        if codebook_transform is not None and not callable(codebook_transform):
            raise TypeError(f"lockstep.SimVQ: codebook_transform must be a module (frozen codes (codebook_size, "
                            f"frozen_codebook_dim) -> codes (codebook_size, dim)), got {type(codebook_transform).__name__}")
        options = declared_arguments("simvq", locals(), besides=("frozen_codebook_dim",))  # the same names
        if frozen_codebook_dim is not None:
            options["frozen_codebook_dim"] = int(frozen_codebook_dim)
        own_map = codebook_transform is None
        drawn = torch.get_rng_state() if seed is None and not own_map else None
        super().__init__("simvq", "simvq", options, seed, process_group, collective_timeout,
                         held=None if own_map else (lambda dotted: not dotted.startswith("code_transform.")))
        if drawn is not None:  # torch's generator advanced by the frozen codes alone, as the reference's
            frozen = self.get_buffer("frozen_codebook")
            torch.set_rng_state(drawn)
            torch.randn(frozen.shape)
        if not own_map:  # the user's map, run here: liblockstep quantizes to the codes it gives
            self.code_transform = codebook_transform
        if init_fn is not None and init_fn is not identity:  # the reference's: applied to the frozen codes drawn
            with torch.no_grad():
                frozen = self.get_buffer("frozen_codebook")
                made = torch.as_tensor(init_fn(frozen.clone()))
                if made.shape != frozen.shape:
                    raise ValueError(f"lockstep.SimVQ: init_fn must keep the codebook's shape {tuple(frozen.shape)}, "
                                     f"got {tuple(made.shape)}")
                frozen.copy_(made)
        self._own_map = own_map
        self.dim = int(dim)
        self.codebook_size = int(codebook_size)
        self.channel_first = bool(channel_first)
        self.rotation_trick = bool(rotation_trick)
        self.input_to_quantize_commit_loss_weight = float(input_to_quantize_commit_loss_weight)
        self.commitment_weight = float(commitment_weight)

    @property
    def codebook(self):
        """The implicit codebook (codebook_size, dim): the frozen codes through the map, differentiable."""
        if not self._own_map:
            return self.code_transform(self.frozen_codebook)
        return F.linear(self.frozen_codebook, self.code_transform.weight)

    def indices_to_codes(self, indices):
        """Indices as forward returns them -> the quantized vectors (b, ..., dim), channel first with
        channel_first; differentiable in the map, as the reference's (the frozen codes picked, then
        mapped)."""
        indices = as_indices("lockstep.SimVQ", indices)
        if self._own_map:
            flat = indices.reshape(indices.shape[0], -1)
            codes = self._core.decode(flat).reshape(*indices.shape, self.dim)
        else:
            if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.codebook_size):
                raise ValueError(f"lockstep.SimVQ: indices must lie in [0, {self.codebook_size})")
            codes = self.code_transform(self.frozen_codebook[indices])
        return codes.movedim(-1, 1) if self.channel_first else codes

    def _given_codes(self):
        """The codes of the user's codebook_transform for liblockstep to quantize to (None: its own map)."""
        return None if self._own_map else {"codebook": self.code_transform(self.frozen_codebook)}

    def forward(self, x):
        given = self._given_codes() or {}
        if self.channel_first:
            out, indices, losses = self._quantize_any(x, True, False, 1, **given)
        else:  # (b, ..., dim): the middle axes packed into one, as the reference packs them
            if x.ndim < 2:
                raise ValueError(f"lockstep.SimVQ: expected (b, ..., {self.dim}) tokens, got shape {tuple(x.shape)}")
            flat = x.reshape(x.shape[0], math.prod(x.shape[1:-1]), x.shape[-1])
            out, indices, losses = self._quantize_any(flat, False, False, 1, **given)
            out = out.reshape(*x.shape[:-1], out.shape[-1])
            indices = indices.reshape(x.shape[:-1])
        return out, indices, losses["commitment"]
