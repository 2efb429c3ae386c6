"""Grouped residual quantizers (vector_quantize_pytorch's GroupedResidualVQ, GroupedResidualFSQ and
GroupedResidualLFQ: their arguments and return values). The feature axis is split into `groups`
equal parts, each quantized by its own residual quantizer in liblockstep; outputs are concatenated,
indices (and losses) stacked with the group first."""
import torch
from torch import nn

from .residual import ResidualFSQ, ResidualLFQ, ResidualVQ


class _Grouped(nn.Module):
    _residual_class = None

    def __init__(self, dim, groups, accept_image_fmap, seed, residual_kwargs):
        super().__init__()
        name = f"lockstep.{type(self).__name__}"
        if int(groups) < 1 or int(dim) % int(groups):
            raise ValueError(f"{name}: dim={dim} does not split into groups={groups} equal parts")
        self.dim, self.groups, self.accept_image_fmap = int(dim), int(groups), accept_image_fmap
        rvqs = []
        for g in range(self.groups):
            # With a seed each group's initial state is its own (seed + g); without, torch's generator
            # draws them one after another, as in the reference.
            rvq = self._residual_class(dim=self.dim // self.groups, seed=None if seed is None else int(seed) + g,
                                       **residual_kwargs)
            # One randomness key for every group, so that the groups drop the same layers in a step, as
            # the reference's one shared seed makes them (its seed is all-reduced in forward; ours is not).
            rvq.seed = 0 if seed is None else int(seed)
            rvqs.append(rvq)
        self.rvqs = nn.ModuleList(rvqs)  # the reference's name, so its state dict's keys are ours
        self.codebook_size = rvqs[0].codebook_size

    @property
    def split_dim(self):
        return 1 if self.accept_image_fmap else -1

    @property
    def codebooks(self):
        return torch.stack([rvq.codebooks for rvq in self.rvqs])

    def get_codes_from_indices(self, indices):
        """Indices (groups, ...) as forward returns them -> (groups, num_quantizers, ..., dim / groups)."""
        return torch.stack([rvq.get_codes_from_indices(chunk) for rvq, chunk in zip(self.rvqs, indices)])

    def get_output_from_indices(self, indices):
        """Indices (groups, ...) as forward returns them -> forward's output."""
        return torch.cat([rvq.get_output_from_indices(chunk) for rvq, chunk in zip(self.rvqs, indices)],
                         dim=self.split_dim)

    def load_reference_state_dict(self, state_dict, strict=True):
        """load_state_dict(state_dict, strict): the reference's state dicts load as they are."""
        return self.load_state_dict(state_dict, strict=strict)

    def _chunks(self, x):
        if x.ndim < 2:
            raise ValueError(f"lockstep.{type(self).__name__}: expected a batch (b, ..., {self.dim}), got shape "
                             f"{tuple(x.shape)}")
        if x.shape[self.split_dim] != self.dim:
            raise ValueError(f"lockstep.{type(self).__name__}: the input's feature axis ({self.split_dim}) has "
                             f"{x.shape[self.split_dim]} values, not dim={self.dim}")
        return x.chunk(self.groups, dim=self.split_dim)

    def _each(self, call, chunks, *per_group):
        """call(rvq, chunk, *that group's values) for each group; an input error names the group."""
        outs = []
        for g, (rvq, chunk, *values) in enumerate(zip(self.rvqs, chunks, *per_group)):
            try:
                outs.append(call(rvq, chunk, *values))
            except ValueError as e:
                raise ValueError(f"lockstep.{type(self).__name__}, group {g} of {self.groups} "
                                 f"({self.dim // self.groups} of the {self.dim} features): {e}") from e
        return outs

    def _combine(self, outs, with_losses):
        """The groups' results as the reference combines them: outputs concatenated, indices (and losses)
        stacked group first; with return_all_codes, a last value holding each group's codes."""
        quantized = torch.cat([o[0] for o in outs], dim=self.split_dim)
        indices = torch.stack([o[1] for o in outs])
        result = (quantized, indices, torch.stack([o[2] for o in outs])) if with_losses else (quantized, indices)
        codes_at = 3 if with_losses else 2
        return (*result, tuple(o[codes_at] for o in outs)) if len(outs[0]) > codes_at else result


class GroupedResidualVQ(_Grouped):
    """GroupedResidualVQ(dim=, groups=, num_quantizers=, codebook_size=, ...) as vector-quantize-pytorch's:
    forward(x) returns (quantized, indices (groups, b, n, num_quantizers), losses (groups, num_quantizers))."""
    _residual_class = ResidualVQ

    def __init__(self, *, dim, groups=1, accept_image_fmap=False, seed=None, **kwargs):
        super().__init__(dim, groups, accept_image_fmap, seed, dict(accept_image_fmap=accept_image_fmap, **kwargs))

    def forward(self, x, indices=None, return_all_codes=False, sample_codebook_temp=None, freeze_codebook=False,
                mask=None):
        kwargs = dict(return_all_codes=return_all_codes, sample_codebook_temp=sample_codebook_temp,
                      freeze_codebook=freeze_codebook, mask=mask)
        chunks = self._chunks(x)
        if indices is not None and len(indices) > 0:  # one (b, n, num_quantizers) per group, as the reference
            if len(indices) != self.groups:
                raise ValueError(f"lockstep.GroupedResidualVQ: indices for {len(indices)} groups, not {self.groups}")
            outs = self._each(lambda rvq, chunk, i: rvq(chunk, indices=i, **kwargs), chunks, indices)
            return torch.cat([o[0] for o in outs], dim=self.split_dim), sum(o[1] for o in outs)
        return self._combine(self._each(lambda rvq, chunk: rvq(chunk, **kwargs), chunks), True)


class GroupedResidualFSQ(_Grouped):
    """GroupedResidualFSQ(dim=, groups=, levels=, num_quantizers=, ...) as vector-quantize-pytorch's:
    forward(x) returns (quantized, indices (groups, b, n, num_quantizers))."""
    _residual_class = ResidualFSQ

    def __init__(self, *, dim, groups=1, accept_image_fmap=False, seed=None, **kwargs):
        super().__init__(dim, groups, accept_image_fmap, seed, kwargs)

    def forward(self, x, return_all_codes=False):
        return self._combine(self._each(lambda rvq, chunk: rvq(chunk, return_all_codes=return_all_codes),
                                        self._chunks(x)), False)


class GroupedResidualLFQ(_Grouped):
    """GroupedResidualLFQ(dim=, groups=, num_quantizers=, codebook_size=, ...) as vector-quantize-pytorch's:
    forward(x) returns (quantized, indices (groups, b, n, num_quantizers), aux losses (groups, num_quantizers))."""
    _residual_class = ResidualLFQ

    def __init__(self, *, dim, groups=1, accept_image_fmap=False, seed=None, **kwargs):
        super().__init__(dim, groups, accept_image_fmap, seed, kwargs)

    def forward(self, x, mask=None, return_all_codes=False):
        return self._combine(self._each(lambda rvq, chunk: rvq(chunk, mask=mask, return_all_codes=return_all_codes),
                                        self._chunks(x)), True)
