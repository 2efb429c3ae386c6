"""vector_quantize_pytorch.HierarchicalVQ (VAR-style multi-scale residual quantization): the residual
is pooled to each level's grid, quantized by a VectorQuantize (liblockstep's search and EMA update),
upsampled back with a residual convolution, and subtracted. Its arguments and return values are the
reference's; what differs is listed in docs/python/vq.md."""
import random

import torch
import torch.nn.functional as F
from torch import nn

from .vq import VectorQuantize

_UPSAMPLE_MODES = ("linear", "bilinear", "trilinear")


def _level_shape(scale, spatial_dims):
    if isinstance(scale, int):
        return (scale,) * spatial_dims
    scale = tuple(int(s) for s in scale)
    if len(scale) != spatial_dims:
        raise ValueError(f"lockstep.HierarchicalVQ: scale {scale} does not have {spatial_dims} spatial sizes")
    return scale


class _Phi(nn.Module):
    """The residual convolution after upsampling: x moved towards conv(x) by `resi_ratio`."""

    def __init__(self, dim, spatial_dims, resi_ratio):
        super().__init__()
        self.conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[spatial_dims - 1](dim, dim, 3, padding=1)
        self.resi_ratio = float(abs(resi_ratio))

    def forward(self, x):
        return x if self.resi_ratio <= 1e-8 else x.lerp(self.conv(x), self.resi_ratio)


class HierarchicalVQ(nn.Module):
    """HierarchicalVQ(dim=, codebook_size=, scales=, ...) as vector-quantize-pytorch's: forward(x) on
    (b, dim, *spatial) maps (channel_first; sequences (b, dim, n) unless accept_image_fmap or
    accept_3d_fmap) returns (reconstruction, indices per level (b, *level_shape), commitment loss)."""

    def __init__(self, *, dim, codebook_size, scales, shared_codebook=True, channel_first=True, sync_codebook=None,
                 decay=0.99, commitment_weight=1.0, rotation_trick=False, kmeans_init=True, kmeans_iters=10,
                 threshold_ema_dead_code=2, stochastic_sample_codes=False, sample_codebook_temp=0.1,
                 orthogonal_reg_weight=0.0, orthogonal_reg_max_codes=128, orthogonal_reg_active_codes_only=False,
                 quant_resi=0.5, share_quant_resi=1, nested_dropout=0.0, nested_dropout_min_levels=1,
                 accept_image_fmap=False, accept_3d_fmap=False, seed=None, process_group=None,
                 collective_timeout=300.0):
        super().__init__()
        name = "lockstep.HierarchicalVQ"
        if accept_image_fmap and accept_3d_fmap:
            raise ValueError(f"{name}: choose at most one of accept_image_fmap and accept_3d_fmap")
        if not 0.0 <= nested_dropout <= 1.0:
            raise ValueError(f"{name}: nested_dropout={nested_dropout} is not in [0, 1]")
        if nested_dropout_min_levels < 1:
            raise ValueError(f"{name}: nested_dropout_min_levels={nested_dropout_min_levels} must be at least 1")
        spatial_dims = 2 if accept_image_fmap else 3 if accept_3d_fmap else 1
        level_shapes = tuple(_level_shape(scale, spatial_dims) for scale in scales)
        if not level_shapes or any(s <= 0 for shape in level_shapes for s in shape):
            raise ValueError(f"{name}: scales={list(scales)} must be one or more positive sizes")
        for coarser, finer in zip(level_shapes, level_shapes[1:]):
            if any(a > b for a, b in zip(coarser, finer)):
                raise ValueError(f"{name}: scales must be non-decreasing; {coarser} comes before {finer}")
        sizes = (codebook_size,) * len(level_shapes) if isinstance(codebook_size, int) else tuple(codebook_size)
        if len(sizes) != len(level_shapes):
            raise ValueError(f"{name}: codebook_size={codebook_size} has {len(sizes)} sizes for "
                             f"{len(level_shapes)} scales")
        if shared_codebook and len(set(sizes)) != 1:
            raise ValueError(f"{name}: a shared codebook needs one codebook_size, got {sizes}")

        self.dim, self.spatial_dims, self.channel_first = int(dim), spatial_dims, bool(channel_first)
        self.scales, self.level_shapes, self.num_levels = tuple(scales), level_shapes, len(level_shapes)
        self.codebook_sizes = sizes
        self.nested_dropout, self.nested_dropout_min_levels = float(nested_dropout), int(nested_dropout_min_levels)

        vq_kwargs = dict(dim=dim, decay=decay, commitment_weight=commitment_weight, rotation_trick=rotation_trick,
                         kmeans_init=kmeans_init, kmeans_iters=kmeans_iters,
                         threshold_ema_dead_code=threshold_ema_dead_code,
                         stochastic_sample_codes=stochastic_sample_codes, sample_codebook_temp=sample_codebook_temp,
                         orthogonal_reg_weight=orthogonal_reg_weight,
                         orthogonal_reg_active_codes_only=orthogonal_reg_active_codes_only,
                         orthogonal_reg_max_codes=orthogonal_reg_max_codes,
                         sync_codebook=sync_codebook, process_group=process_group,
                         collective_timeout=collective_timeout)

        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:  # the seed alone decides the initial state; else torch's generator, as there
                torch.manual_seed(int(seed))
            made = [VectorQuantize(codebook_size=size, **vq_kwargs) for size in (sizes[:1] if shared_codebook else sizes)]
            self.vq = made[0] if shared_codebook else None
            self.vqs = None if shared_codebook else nn.ModuleList(made)
            # Each level's randomness (dead-code samples, sampled codes) has its own key.
            for level, vq in enumerate(made):
                vq.seed = (0 if seed is None else int(seed)) + level
            if share_quant_resi == 1:
                self.phi_shared, self.phi_levels = _Phi(dim, spatial_dims, quant_resi), None
            else:
                count = self.num_levels if share_quant_resi <= 0 else min(self.num_levels, int(share_quant_resi))
                self.phi_shared = None
                self.phi_levels = nn.ModuleList([_Phi(dim, spatial_dims, quant_resi) for _ in range(count)])
        self.seed = 0 if seed is None else int(seed)

    def get_vq(self, level):
        return self.vq if self.vq is not None else self.vqs[level]

    def load_reference_state_dict(self, state_dict, strict=True):
        """load_state_dict(state_dict, strict): the reference's state dicts load as they are."""
        return self.load_state_dict(state_dict, strict=strict)

    def _phi(self, level):
        if self.phi_shared is not None:
            return self.phi_shared
        if len(self.phi_levels) == 1:
            return self.phi_levels[0]
        position = level / max(self.num_levels - 1, 1)
        return self.phi_levels[round(position * (len(self.phi_levels) - 1))]

    def _pool(self, t, level_shape, mask):
        """The residual averaged over each cell of `level_shape` (over valid positions where masked), and
        the level's mask: a cell is valid when any position under it is."""
        pool = getattr(F, f"adaptive_avg_pool{self.spatial_dims}d")
        if mask is None:
            return pool(t, output_size=level_shape), None
        mask = mask.unsqueeze(1).to(t.dtype)
        pooled_mask = pool(mask, output_size=level_shape)
        if all(s == 1 for s in level_shape):  # the coarsest cell: the mean over valid positions
            dims = tuple(range(2, t.ndim))
            pooled = (t * mask).sum(dims, keepdim=True) / mask.expand_as(t).sum(dims, keepdim=True).clamp(min=1e-5)
        else:
            pooled = pool(t * mask, output_size=level_shape) / pooled_mask.clamp(min=1e-6)
        return pooled, pooled_mask.squeeze(1) > 0

    def _upsample(self, q, full_shape, level):
        if tuple(q.shape[2:]) != full_shape:
            q = F.interpolate(q, size=full_shape, mode=_UPSAMPLE_MODES[self.spatial_dims - 1], align_corners=False)
        return self._phi(level)(q)

    def nested_cutoff(self, step=None):
        """The last level kept this training step, or None: a pure function of (seed, step), the step
        counting the first quantizer's completed training steps (`step`: the one a call started at), so every
        rank draws the same."""
        if not self.training or self.nested_dropout <= 0 or self.num_levels <= 1:
            return None
        if self.nested_dropout_min_levels >= self.num_levels:
            return None
        step = self.get_vq(0).step if step is None else step
        draw = random.Random(f"lockstep.HierarchicalVQ:{self.seed}:{step}")
        if draw.random() >= self.nested_dropout:
            return None
        return draw.randrange(self.nested_dropout_min_levels - 1, self.num_levels - 1)

    def _channel_first_input(self, x):
        if not self.channel_first:
            x = x.movedim(-1, 1)
        if x.ndim != 2 + self.spatial_dims or x.shape[1] != self.dim:
            layout = "(b, dim, ...)" if self.channel_first else "(b, ..., dim)"
            raise ValueError(f"lockstep.HierarchicalVQ: expected {layout} with dim={self.dim} and "
                             f"{self.spatial_dims} spatial axes; got {tuple(x.shape)}")
        return x

    def forward(self, x, indices=None, mask=None, lens=None, sample_codebook_temp=None, return_cutoff=False):
        name = "lockstep.HierarchicalVQ"
        if indices is not None:
            raise ValueError(f"{name}: forward takes no indices (as the reference); use get_output_from_indices")
        if mask is not None and lens is not None:
            raise ValueError(f"{name}: give mask or lens, not both")
        x = self._channel_first_input(x)
        full_shape = tuple(x.shape[2:])
        if lens is not None:
            if self.spatial_dims != 1:
                raise ValueError(f"{name}: lens is for 1d sequences; give a mask for maps")
            mask = torch.arange(full_shape[0], device=x.device) < torch.as_tensor(lens, device=x.device)[:, None]
        if mask is not None:
            mask = torch.as_tensor(mask, device=x.device)
            if tuple(mask.shape) != (x.shape[0], *full_shape) or mask.dtype != torch.bool:
                raise ValueError(f"{name}: mask must be bool of shape {(x.shape[0], *full_shape)}; got {mask.dtype} "
                                 f"of shape {tuple(mask.shape)}")

        residual, reconstruction = x, torch.zeros_like(x)
        cumulative, all_indices, losses = [], [], []
        started_at = self.get_vq(0).step
        # Whether this call is a whole step is the module's to say, once for every level (from its input and every
        # parameter, phi's too): each level's own input would make some levels whole steps and not others.
        # (Eager only: a compiled call's update waits for its backward or is taken by the op, _ops.py.)
        quantizers = [] if torch.compiler.is_compiling() else [self.vq] if self.vq is not None else list(self.vqs)
        whole = bool(quantizers) and self.training and quantizers[0]._is_whole_step(x, parameters=self.parameters())
        for vq in quantizers:
            vq._decided_whole_step = whole
        try:
            for level, level_shape in enumerate(self.level_shapes):
                pooled, level_mask = self._pool(residual, level_shape, mask)
                tokens = pooled.flatten(2).transpose(1, 2)
                quantized, level_indices, loss = self.get_vq(level)(
                    tokens, mask=None if level_mask is None else level_mask.flatten(1),
                    sample_codebook_temp=sample_codebook_temp)
                quantized = quantized.transpose(1, 2).reshape(pooled.shape)
                quantized = self._upsample(quantized, full_shape, level)
                reconstruction = reconstruction + quantized
                residual = residual - quantized
                cumulative.append(reconstruction)
                all_indices.append(level_indices.reshape(x.shape[0], *level_shape))
                losses.append(loss)
        finally:
            for vq in quantizers:
                vq._decided_whole_step = None

        cutoff = self.nested_cutoff(started_at)
        losses = torch.stack(losses)
        if cutoff is None:
            commit_loss = losses.mean()
        else:
            kept = (torch.arange(self.num_levels, device=x.device) <= cutoff).to(losses.dtype)
            # The dropped levels' codebooks train too (the reference updates them in forward): their
            # losses join at weight 0 (a VQ loss carries its call's graph even at commitment weight 0),
            # so backward reaches their calls and applies their updates.
            commit_loss = (losses * kept).sum() / kept.sum().clamp(min=1e-5)
            reconstruction = cumulative[cutoff]
        if mask is not None:
            reconstruction = torch.where(mask.unsqueeze(1), reconstruction, 0.0)
        if not self.channel_first:
            reconstruction = reconstruction.movedim(1, -1)
        if return_cutoff:
            return reconstruction, tuple(all_indices), commit_loss, cutoff
        return reconstruction, tuple(all_indices), commit_loss

    def get_output_from_indices(self, indices, full_shape=None):
        """Indices per level as forward returns them -> the reconstruction at `full_shape` (the finest
        level's by default); -1 (padding) contributes nothing, as in the reference."""
        if not isinstance(indices, (tuple, list)) or len(indices) != self.num_levels:
            raise ValueError(f"lockstep.HierarchicalVQ: expected a tuple of {self.num_levels} index tensors")
        full_shape = self.level_shapes[-1] if full_shape is None else _level_shape(full_shape, self.spatial_dims)
        reconstruction = None
        for level, level_indices in enumerate(indices):
            flat = level_indices.reshape(level_indices.shape[0], -1)
            q = self.get_vq(level).get_output_from_indices(flat)  # zeros at -1
            q = q.transpose(1, 2).reshape(q.shape[0], self.dim, *self.level_shapes[level])
            q = self._upsample(q, full_shape, level)
            reconstruction = q if reconstruction is None else reconstruction + q
        return reconstruction if self.channel_first else reconstruction.movedim(1, -1)
