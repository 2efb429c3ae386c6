"""vector-quantize-pytorch's module paths under lockstep: `from lockstep.residual_vq import ResidualVQ` finds
what `from vector_quantize_pytorch.residual_vq import ResidualVQ` finds, so that a one-line import swap (or
an alias package) reaches every name. One table: each reference module and the public names it offers
(its classes that the package exports, and the helpers its users import)."""
import sys
import types

# reference module -> (lockstep module holding the names, names)
REFERENCE_MODULES = {
    "vector_quantize_pytorch": ("vq", ("VectorQuantize", "LossBreakdown")),
    "residual_vq": ("residual", ("ResidualVQ",)),
    "random_projection_quantizer": ("random_projection", ("RandomProjectionQuantizer",)),
    "finite_scalar_quantization": ("fsq", ("FSQ",)),
    "finite_scalar_perturbation": ("fsp", ("FSP", "build_cdf_act", "tanh_act", "tanh_inv_act", "sigmoid_act",
                                           "sigmoid_inv_act", "normal_act", "normal_inv_act", "laplace_act",
                                           "laplace_inv_act", "cauchy_act", "cauchy_inv_act")),
    "lookup_free_quantization": ("lfq", ("LFQ", "LossBreakdown", "Return")),
    "evo_lookup_free_quantization": ("evo_lfq", ("EvoLFQ", "Return", "Result")),
    "residual_lfq": ("residual", ("ResidualLFQ",)),
    "residual_fsq": ("residual", ("ResidualFSQ",)),
    "latent_quantization": ("latent_quantize", ("LatentQuantize",)),
    "sim_vq": ("simvq", ("SimVQ",)),
    "residual_sim_vq": ("residual", ("ResidualSimVQ",)),
    "binary_mapper": ("binary_mapper", ("BinaryMapper",)),
    "hierarchical_vq": ("hierarchical", ("HierarchicalVQ",)),
    "utils": ("sequential", ("Sequential",)),
}
# The grouped classes live beside their residual ones in the reference.
GROUPED = {"residual_vq": "GroupedResidualVQ", "residual_lfq": "GroupedResidualLFQ",
           "residual_fsq": "GroupedResidualFSQ"}


def install(package):
    """Makes lockstep.<reference module> importable for every module of the table (a module file of that
    name, as binary_mapper, is left as it is)."""
    for name, (source, names) in REFERENCE_MODULES.items():
        full = f"{package.__name__}.{name}"
        if full in sys.modules or hasattr(package, name):
            continue
        origin = sys.modules[f"{package.__name__}.{source}"]
        module = types.ModuleType(full, f"vector_quantize_pytorch.{name}'s names, from lockstep.{source}.")
        for attribute in names:
            setattr(module, attribute, getattr(origin, attribute))
        if name in GROUPED:
            setattr(module, GROUPED[name], getattr(package, GROUPED[name]))
        module.__all__ = [*names, *([GROUPED[name]] if name in GROUPED else [])]
        sys.modules[full] = module
        setattr(package, name, module)
