"""vector_quantize_pytorch.BinaryMapper (Fleuret 2025, arXiv 2510.17558): `bits` logits per token pick
one of 2^bits codes, returned as a one-hot with a straight-through gradient, and a KL auxiliary loss.
The sampling, the gradient estimator and the losses run in liblockstep (quant/binary_mapper.h)."""
from math import log

import torch
from torch import nn

from . import _C

NAT = log(2)  # one bit, in nats


class BinaryMapper(nn.Module):
    """BinaryMapper(bits=1, kl_loss_threshold=ln 2, deterministic_on_eval=False) as vector-quantize-pytorch's:
    forward(logits) takes (..., bits) and returns (one-hot (..., 2^bits), aux_kl_loss), or with
    return_indices=True (one-hot, indices (...), aux_kl_loss). Bits are drawn from torch's generator, as
    there; the module keeps no statistics and never communicates."""

    def __init__(self, bits=1, kl_loss_threshold=NAT, deterministic_on_eval=False):
        super().__init__()
        self._core = _C.BinaryMapper(int(bits), float(kl_loss_threshold))
        self.bits = int(bits)
        self.num_codes = self._core.num_codes
        self.kl_loss_threshold = float(kl_loss_threshold)
        self.deterministic_on_eval = bool(deterministic_on_eval)
        # Not in the state dict, as the reference's: constants that follow the module's device.
        self.register_buffer("power_two", 2 ** torch.arange(self.bits), persistent=False)
        self.register_buffer("codes", self._core.codes(), persistent=False)
        self.register_buffer("zero", torch.tensor(0.0), persistent=False)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_core")
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._core = _C.BinaryMapper(self.bits, self.kl_loss_threshold)

    def __deepcopy__(self, memo):
        import copy
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return copied

    def binary_entropy(self, logits):
        """Each token's bit entropy in nats, (...)."""
        return self._core.bit_entropy(logits)

    def calc_aux_loss(self, logits, reduce_aux_kl_loss=True):
        return self._core.aux_kl_loss(logits, bool(reduce_aux_kl_loss))

    def log_prob(self, logits, *, indices=None, one_hot=None, sum_bits=True):
        if (indices is None) == (one_hot is None):
            raise ValueError("lockstep.BinaryMapper.log_prob: give indices or one_hot, not both or neither")
        if one_hot is not None:
            indices = one_hot.argmax(dim=-1)
        return self._core.log_prob(logits, indices, bool(sum_bits))

    def forward(self, logits, temperature=1.0, straight_through=None, calc_aux_loss=None, deterministic=None,
                return_indices=False, reduce_aux_kl_loss=True):
        deterministic = self.deterministic_on_eval and not self.training if deterministic is None else deterministic
        straight_through = self.training if straight_through is None else straight_through
        calc_aux_loss = self.training if calc_aux_loss is None else calc_aux_loss
        if logits.shape[-1] != self.bits:
            raise ValueError(f"lockstep.BinaryMapper: logits must have a last dimension of {self.bits}, "
                             f"got shape {tuple(logits.shape)}")
        one_hot, indices = self._core.map(logits, float(temperature), bool(straight_through), bool(deterministic))
        aux_kl_loss = self.calc_aux_loss(logits, reduce_aux_kl_loss) if calc_aux_loss else self.zero
        if not return_indices:
            return one_hot, aux_kl_loss
        return one_hot, indices, aux_kl_loss
