"""The docs' tables of vector-quantize-pytorch's options (docs/python/vector-quantize-pytorch.md) stay equal to
the reference's signatures, and each state holds against lockstep's constructors: a refused option given another
value than its default raises a TypeError naming it; an option marked same or deliberate difference is taken."""
import builtins
import inspect
import re
import warnings

import pytest
import torch

import lockstep
from docs_pages import section

vqp = pytest.importorskip("vector_quantize_pytorch")

STATE = re.compile(r"^(same|deliberate difference \(.+\)|refused \(lockstep takes only .+\)"
                   r"|refused as by the reference \((\w+): .+\))$")

# The smallest valid arguments of each class, and values to try where adding 2 or 0.25 to the default,
# or flipping it, is not a valid other value.
REQUIRED = {
    "VectorQuantize": dict(dim=8, codebook_size=16),
    "ResidualVQ": dict(dim=8, num_quantizers=3, codebook_size=16),
    "GroupedResidualVQ": dict(dim=8, groups=2, num_quantizers=2, codebook_size=16),
    "FSQ": dict(levels=[5, 5, 5]),
    "ResidualFSQ": dict(levels=[5, 5, 5], num_quantizers=3),
    "GroupedResidualFSQ": dict(dim=6, groups=2, levels=[5, 5, 5], num_quantizers=2),
    "LFQ": dict(dim=4, codebook_size=16),
    "ResidualLFQ": dict(dim=4, num_quantizers=3, codebook_size=16),
    "GroupedResidualLFQ": dict(dim=8, groups=2, num_quantizers=2, codebook_size=16),
    "SimVQ": dict(dim=8, codebook_size=16),
    "ResidualSimVQ": dict(dim=8, num_quantizers=3, codebook_size=16),
    "LatentQuantize": dict(levels=[5, 5], dim=2),
    "RandomProjectionQuantizer": dict(dim=8, codebook_size=16, codebook_dim=4),
    "BinaryMapper": dict(),
    "HierarchicalVQ": dict(dim=8, codebook_size=16, scales=[1, 2]),
    "FSP": dict(levels=[5, 5, 5]),
    "EvoLFQ": dict(encoder=torch.nn.Identity(), decoder=torch.nn.Identity(), dim=4),
}
OTHER_VALUES = {"decay": 0.5, "quantize_dropout_cutoff_index": 1, "frac_per_sample_entropy": 0.5, "groups": 4,
                "noise_dropout": None, "allowed_dtypes": (torch.float32,), "mlp_kwargs": {"depth": 2},
                "straight_through_activation": torch.nn.Tanh(), "init_fn": torch.tanh,
                "codebook_transform": torch.nn.Linear(8, 8, bias=False), "ema_update": False,
                "vq_bridge": torch.nn.Identity(),
                "in_place_codebook_optimizer": lambda parameters: torch.optim.SGD(parameters, lr=0.1),
                "beam_score_quantizer_weights": [1.0, 0.5, 0.25],
                "learnable_codebook": True, "lfq": lockstep.LFQ(dim=4), "has_projections": True, "soft_clamp_input_value": 1.5,
                "affine_param_batch_decay": 0.5, "affine_param_codebook_decay": 0.5, "orthogonal_reg_max_codes": 4}
# Options whose other value needs another option with it, as the reference requires too.
COMPANIONS = {"learnable_codebook": dict(ema_update=False),
              ("VectorQuantize", "in_place_codebook_optimizer"): dict(learnable_codebook=True, ema_update=False),
              "eval_beam_size": dict(beam_size=2),
              ("ResidualFSQ", "soft_clamp_input_value"): dict(bound_hard_clamp=False),
              "directional_reparam": dict(threshold_ema_dead_code=1.0), "straight_through": dict(rotation_trick=False),
              "sync_update_v": dict(learnable_codebook=True, ema_update=False)}


def tables():
    out = {}
    for block in section("Options of vector-quantize-pytorch's classes").split("\n### ")[1:]:
        name = re.match(r"`(\w+)`", block).group(1)
        out[name] = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", block, re.M))
    return out


def reference_options(name):
    signature = inspect.signature(getattr(vqp, name).__init__)
    return {p.name: p.default for p in signature.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def other_value(name, default):
    if name in OTHER_VALUES:
        return OTHER_VALUES[name]
    if isinstance(default, bool):
        return not default
    if default is None:
        return 2
    if isinstance(default, (int, float)):
        return default + (2 if isinstance(default, int) else 0.25)
    return None


def test_every_lockstep_class_with_options_has_a_table_of_exactly_the_references_options():
    documented = tables()
    assert set(documented) == set(REQUIRED)
    provided = {n for n in lockstep.__all__ if hasattr(vqp, n) and reference_options(n)}
    assert provided == set(REQUIRED)
    for name, rows in documented.items():
        assert list(rows) == list(reference_options(name)), name
        for option, state in rows.items():
            assert STATE.match(state), f"{name}.{option}: {state!r}"


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_each_state_holds_against_the_constructor(name):
    checked = 0
    for option, state in tables()[name].items():
        if option in REQUIRED[name]:
            continue
        value = other_value(option, reference_options(name)[option])
        if value is None:
            continue
        companions = COMPANIONS.get((name, option), COMPANIONS.get(option, {}))
        arguments = {**REQUIRED[name], **companions, option: value}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if state.startswith("refused as by the reference"):
                # The reference's own exception type (test_reference_gaps.py shows the reference raising it).
                with pytest.raises(getattr(builtins, STATE.match(state).group(2))):
                    getattr(lockstep, name)(**arguments)
            elif state.startswith("refused"):
                with pytest.raises(TypeError, match=option):
                    getattr(lockstep, name)(**arguments)
            else:
                getattr(lockstep, name)(**arguments)  # taken: no TypeError, no ValueError
        checked += 1
    assert checked >= len(tables()[name]) - len(REQUIRED[name]) - 2, name
