"""Latent quantization (vector_quantize_pytorch.LatentQuantize's arguments and return values): each
latent channel snaps to the nearest of its level's values."""
import torch

from ._quantizer import LockstepQuantizer, as_indices, declared_arguments, refuse


class LatentQuantize(LockstepQuantizer):
    """LatentQuantize(levels, dim, ...) as vector-quantize-pytorch's: forward(z) takes channel-first input
    (b, dim, ...) and returns (quantized (b, dim, ...), indices (b, ...[, num_codebooks]) int32, loss);
    the loss is 0 in evaluation. The search, straight-through estimator, projections and losses run in
    liblockstep. Deliberate difference: `values_per_latent.<i>` are buffers, where the reference makes
    them parameters that no gradient reaches (its straight-through detaches them), which DDP refuses as
    unused parameters unless find_unused_parameters=True; the state dict is the same."""

    def __init__(self, levels, dim, commitment_loss_weight=0.1, quantization_loss_weight=0.1, num_codebooks=1,
                 codebook_dim=-1, keep_num_codebooks_dim=None, optimize_values=True, in_place_codebook_optimizer=None,
                 *, seed=None, process_group=None, collective_timeout=300.0):
        if isinstance(levels, int):
            if codebook_dim <= 0:  # the reference's repeat(-1) fails with this type
                raise RuntimeError(f"lockstep.LatentQuantize: levels={levels} (one int for every latent channel) "
                                   f"needs codebook_dim > 0, got {codebook_dim}")
            levels = [levels] * codebook_dim
        levels = [int(level) for level in levels]
        if codebook_dim > 0 and codebook_dim != len(levels):
            # The reference fails at its first forward, with this type; lockstep at once.
            raise RuntimeError(f"lockstep.LatentQuantize: codebook_dim={codebook_dim} must be len(levels) = "
                               f"{len(levels)} (or -1)")
        for name, weight in (("commitment_loss_weight", commitment_loss_weight),
                             ("quantization_loss_weight", quantization_loss_weight)):
            if weight is None:
                refuse("lockstep.LatentQuantize", name, weight, "a number (0 leaves the term out)")
        keep = bool(keep_num_codebooks_dim) or num_codebooks > 1  # the reference's rule
        options = declared_arguments("latent", locals())  # levels, dim, the loss weights: the same names
        super().__init__("latent", "latent", options, seed, process_group, collective_timeout,
                         persistent=lambda name: bool(optimize_values) or not name.startswith("values_per_latent."))
        self.dim = int(dim)
        self.levels = levels
        self.num_codebooks = int(num_codebooks)
        self.codebook_dim = len(levels)
        self.effective_codebook_dim = self.codebook_dim * self.num_codebooks
        self.keep_num_codebooks_dim = keep
        self.has_projections = self.dim != self.effective_codebook_dim
        self.codebook_size = self._core.codebook_size
        self.optimize_values = bool(optimize_values)
        self.register_buffer("_basis", torch.cumprod(torch.tensor([1] + levels[:-1]), 0), persistent=False)
        # The reference hands its values to the optimizer's factory (optimize_values=True) and steps it in a
        # training forward; no gradient reaches the values through the straight-through estimator, so a
        # step never moves them, and lockstep takes none (docs/python/scalar.md).
        self.in_place_codebook_optimizer = in_place_codebook_optimizer
        if in_place_codebook_optimizer is not None and self.optimize_values:
            self.in_place_codebook_optimizer = in_place_codebook_optimizer(
                [self.get_buffer(f"values_per_latent.{i}") for i in range(self.codebook_dim)])

    def forward(self, z):
        out, indices, losses = self._quantize_any(z, True, self.keep_num_codebooks_dim, self.num_codebooks)
        loss = sum(losses.values()) if losses else torch.tensor(0.0)
        return out, indices.to(torch.int32), loss

    def _grid(self, positions):
        """Positions (..., codebook_dim) -> the values of the level grid, as the reference's
        indices_to_codes computes them."""
        levels = torch.tensor(self.levels, device=positions.device)
        half = levels // 2
        return (positions - half) / half / 2

    @property
    def implicit_codebook(self):
        """Every code in index order, (codebook_size, codebook_dim), on the level grid."""
        index = torch.arange(self.codebook_size, device=self.device).unsqueeze(-1)
        return self._grid((index // self._basis.to(index.device)) % torch.tensor(self.levels, device=index.device))

    def codes_to_indices(self, zhat):
        """Codes (..., codebook_dim) on the grid -> indices (...), int32, as the reference."""
        if zhat.shape[-1] != self.codebook_dim:
            raise ValueError(f"lockstep.LatentQuantize.codes_to_indices: codes end in {zhat.shape[-1]} values, "
                             f"not codebook_dim = {self.codebook_dim}")
        half = torch.tensor(self.levels, device=zhat.device) // 2
        # Rounded, where the reference truncates: for an even level that is not a power of two its
        # position (z * 2 * half + half) can fall just below the integer.
        positions = torch.round(zhat * 2 * half + half)
        return (positions * self._basis.to(zhat.device)).sum(-1).to(torch.int32)

    def indices_to_codes(self, indices, project_out=True):
        """Indices as forward returns them -> codes (b, d, ...), channel first, projected out unless
        project_out=False, as the reference's (on the level grid)."""
        index = as_indices("lockstep.LatentQuantize", indices).unsqueeze(-1)
        codes = self._grid((index // self._basis.to(index.device)) % torch.tensor(self.levels, device=index.device))
        if self.keep_num_codebooks_dim:
            codes = codes.reshape(*codes.shape[:-2], -1)
        if project_out and self.has_projections:
            codes = torch.nn.functional.linear(codes, self.project_out.weight, self.project_out.bias)
        return codes.movedim(-1, 1)
