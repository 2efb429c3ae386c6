"""vector_quantize_pytorch.RandomProjectionQuantizer (BEST-RQ, arXiv 2202.01855): a fixed random
projection of the normalised input, quantized by a frozen random codebook per head; the targets a
speech or image model learns to predict. The codebook search runs in liblockstep's VQ."""
import torch
from torch import nn

from .vq import VectorQuantize


class RandomProjectionQuantizer(nn.Module):
    """RandomProjectionQuantizer(dim=, codebook_size=, codebook_dim=, num_codebooks=1, norm=True, **vq_kwargs)
    as vector-quantize-pytorch's: forward(x) takes (b, n, dim) and returns the indices (b, n) or
    (b, n, num_codebooks); forward(x, indices=...) returns the cross entropy of those indices under the
    cosine similarities to the codes. Nothing here is trained: the projection is a buffer and the
    quantizer always runs in evaluation (its codebook never moves; with kmeans_init, k-means sets it at the first
    call)."""

    def __init__(self, *, dim, codebook_size, codebook_dim, num_codebooks=1, norm=True, **kwargs):
        super().__init__()
        self.num_codebooks = num_codebooks
        rand_projs = torch.empty(num_codebooks, dim, codebook_dim)
        nn.init.xavier_normal_(rand_projs)  # before the codebook, from torch's generator: the reference's draws
        self.register_buffer("rand_projs", rand_projs)
        # "The input data is normalized to have 0 mean and standard deviation of 1" (section 3).
        self.norm = nn.LayerNorm(dim, elementwise_affine=False) if norm else nn.Identity()
        self.vq = VectorQuantize(dim=codebook_dim * num_codebooks, heads=num_codebooks, codebook_size=codebook_size,
                                 use_cosine_sim=True, separate_codebook_per_head=True, **kwargs)

    def load_reference_state_dict(self, state_dict, strict=True):
        """load_state_dict(state_dict, strict): the reference's state dicts load as they are."""
        return self.load_state_dict(state_dict, strict=strict)

    def _projected(self, x):
        if x.ndim != 3:
            raise ValueError(f"lockstep.RandomProjectionQuantizer: expected (b, n, dim), got shape {tuple(x.shape)}")
        x = torch.einsum("b n d, h d e -> b n h e", self.norm(x), self.rand_projs)
        return x.reshape(*x.shape[:2], -1)

    def forward(self, x, indices=None):
        # kmeans_init: the first call's projected batch initialises the codebook (over the process group, so
        # every rank makes that call), as the reference's; it never moves after.
        projected = self.vq._initialised_first(self._projected(x))
        self.vq.eval()  # always, as the reference: the random codebook never moves
        if indices is None:
            return self.vq(projected)[1]
        # The cross entropy of the given codes under the cosine similarities (unscaled logits; -1
        # ignored), as the reference's VectorQuantize(indices=...) takes it.
        return self.vq(projected, indices=indices)[1]
