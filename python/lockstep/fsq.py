"""Finite scalar quantization (vector_quantize_pytorch.FSQ's arguments and return values)."""
import torch

from ._quantizer import LockstepQuantizer, as_indices, declare_reference_signature, declared_arguments


def fsq_options(levels, dim=None, num_codebooks=1, keep_num_codebooks_dim=None, scale=None,
                allowed_dtypes=(torch.float32, torch.float64), channel_first=False, projection_has_bias=True,
                return_indices=True, force_quantization_f32=True, preserve_symmetry=False, noise_dropout=0.0,
                bound_hard_clamp=False, orthogonal_rotation=False):
    """vector-quantize-pytorch's FSQ arguments -> (liblockstep's FSQ options (quant/option_specs.h), the
    module's own settings); TypeError naming an option lockstep does not implement."""
    # force_quantization_f32=False: lockstep quantizes in float32 all the same (docs/python/scalar.md), which for a
    # half-precision input is the reference's forced path; the output takes the input's dtype either way.
    levels = [int(level) for level in levels]
    if 2 in levels and not preserve_symmetry:  # the reference refuses it too: level 2 needs the symmetric bound
        raise ValueError(f"lockstep.FSQ: levels={levels} has a level of 2, which needs preserve_symmetry=True "
                         "(or use levels of 3 or more)")
    if keep_num_codebooks_dim is None:
        keep_num_codebooks_dim = num_codebooks > 1
    if num_codebooks > 1 and not keep_num_codebooks_dim:
        raise ValueError("lockstep.FSQ: keep_num_codebooks_dim must be True with several codebooks")
    options = declared_arguments("fsq", locals(), besides=("dim",))  # levels, num_codebooks, ...: the same
    if dim is not None:
        options["dim"] = int(dim)
    module = dict(keep_num_codebooks_dim=keep_num_codebooks_dim, channel_first=channel_first,
                  return_indices=return_indices, allowed_dtypes=allowed_dtypes, scale=scale)
    return options, module


class FSQ(LockstepQuantizer):
    """FSQ(levels, dim=None, num_codebooks=1, ...) as vector-quantize-pytorch's FSQ: forward(z)
    takes (b, n, dim) tokens or (b, dim, ...) feature maps and returns (quantized, indices).
    The bound, rounding, indices and straight-through gradient run in liblockstep (float32)."""
    _maps_hint = " or channel-first maps (b, dim, ...) of two or more spatial axes, or with channel_first=True"

    def __init__(self, levels, dim=None, num_codebooks=1, *reference_args, seed=None, process_group=None,
                 collective_timeout=300.0, **options):
        options, module = fsq_options(levels, dim, num_codebooks, *reference_args, **options)
        super().__init__("fsq", "fsq", options, seed, process_group, collective_timeout)
        self.levels = options["levels"]
        self.num_codebooks = num_codebooks
        self.dim = self._core.dim
        self.codebook_dim = len(self.levels)
        self.codebook_size = self._core.codebook_size
        self.keep_num_codebooks_dim = module["keep_num_codebooks_dim"]
        self.channel_first = module["channel_first"]
        self.return_indices = module["return_indices"]
        self.allowed_dtypes = module["allowed_dtypes"]
        self.scale = module["scale"]  # stored, unused, as in the reference

    def forward(self, z):
        out, indices, _ = self._quantize_any(z, z.ndim >= 4 or self.channel_first, self.keep_num_codebooks_dim,
                                             self.num_codebooks)
        return out, (indices.to(torch.int32) if self.return_indices else None)  # the reference's index type

    def indices_to_codes(self, indices):
        """Indices as forward returns them -> the quantized vectors, projected out; channel first
        for feature maps (two or more spatial axes) or with channel_first."""
        indices = as_indices("lockstep.FSQ", indices)
        keep = int(self.keep_num_codebooks_dim)
        spatial = indices.shape[1:indices.ndim - keep]
        flat = indices.reshape(indices.shape[0], -1, *indices.shape[indices.ndim - keep:])
        if keep and self.num_codebooks == 1:
            flat = flat.squeeze(-1)
        codes = self._core.decode(flat)
        codes = codes.reshape(codes.shape[0], *spatial, codes.shape[-1])
        if len(spatial) >= 2 or self.channel_first:
            codes = codes.movedim(-1, 1)
        return codes

    def codes_to_indices(self, zhat):
        """Codes (..., codebook_dim) in [-1, 1] on the grid (as indices_to_codes makes them before the
        projection) -> indices (...), int32 as the reference's."""
        if zhat.shape[-1] != self.codebook_dim:
            raise ValueError(f"lockstep.FSQ.codes_to_indices: codes end in {zhat.shape[-1]} values, "
                             f"not codebook_dim = {self.codebook_dim}")
        return self._core.codes_to_indices(zhat).to(torch.int32)

    @property
    def implicit_codebook(self):
        """Every code in index order, (codebook_size, codebook_dim), float32, on the module's device.
        Computed on use, not a buffer as in the reference, so DDP never broadcasts it."""
        return self._core.indices_to_codes(torch.arange(self.codebook_size, device=self.device))


declare_reference_signature(FSQ, fsq_options)
