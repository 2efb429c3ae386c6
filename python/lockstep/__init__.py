"""lockstep for PyTorch users: quantizers for image tokenizers whose forward and backward run in
liblockstep (C++), as drop-in torch.nn.Modules that take vector-quantize-pytorch's argument names.
See docs/python.md."""
import sys

import torch  # noqa: F401  (loads LibTorch before the extension that links it)

from . import _C  # noqa: F401
from ._C import CollectiveFailure, CollectiveMismatch  # noqa: F401
from . import data  # noqa: F401
from ._quantizer import reference_state_dict, update_in_forward
from .checkpoints import load_model, save_model
from .binary_mapper import BinaryMapper
from .evo_lfq import EvoLFQ
from .fsp import FSP
from .fsq import FSQ
from .hierarchical import HierarchicalVQ
from .latent_quantize import LatentQuantize
from .grouped import GroupedResidualFSQ, GroupedResidualLFQ, GroupedResidualVQ
from .lfq import LFQ
from .random_projection import RandomProjectionQuantizer
from .residual import ResidualFSQ, ResidualLFQ, ResidualSimVQ, ResidualVQ
from .sequential import Sequential
from .simvq import SimVQ
from .vq import VectorQuantize

__all__ = ["FSQ", "LFQ", "VectorQuantize", "ResidualVQ", "ResidualFSQ", "ResidualLFQ", "GroupedResidualVQ",
           "GroupedResidualFSQ", "GroupedResidualLFQ", "Sequential", "SimVQ", "ResidualSimVQ", "LatentQuantize",
           "RandomProjectionQuantizer", "BinaryMapper", "HierarchicalVQ", "FSP", "EvoLFQ", "CollectiveMismatch", "CollectiveFailure",
           "reference_state_dict", "save_model", "load_model", "update_in_forward"]

# vector-quantize-pytorch's module paths (lockstep.residual_vq, lockstep.finite_scalar_perturbation, ...).
from . import _reference_paths  # noqa: E402

_reference_paths.install(sys.modules[__name__])
