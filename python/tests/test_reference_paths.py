"""A one-line import swap reaches every name (issue #38, deliverable 2): every class vector-quantize-pytorch
exports and every module path it has is importable from lockstep, with the reference's constructor
signature (names, order, kinds, defaults) and lockstep's own options only after it, keyword-only."""
import importlib
import inspect
import pkgutil

import pytest
import torch

import lockstep

vqp = pytest.importorskip("vector_quantize_pytorch")

LOCKSTEP_OWN = ("seed", "process_group", "collective_timeout", "inv_temperature")
EXPORTED = sorted(name for name in dir(vqp) if not name.startswith("_") and inspect.isclass(getattr(vqp, name)))
MODULES = sorted(m.name for m in pkgutil.iter_modules(vqp.__path__))


def test_every_exported_class_is_lockstep_s():
    assert len(EXPORTED) >= 18
    for name in EXPORTED:
        assert getattr(lockstep, name).__module__.startswith("lockstep."), name


@pytest.mark.parametrize("module", MODULES)
def test_every_module_path_holds_the_references_names(module):
    reference = importlib.import_module(f"vector_quantize_pytorch.{module}")
    ours = importlib.import_module(f"lockstep.{module}")
    # The package's classes that this module defines, and the helpers its users import.
    names = [name for name in EXPORTED if getattr(vqp, name).__module__ == reference.__name__]
    names += {"finite_scalar_perturbation": ["build_cdf_act"], "vector_quantize_pytorch": ["LossBreakdown"],
              "lookup_free_quantization": ["LossBreakdown", "Return"]}.get(module, [])
    assert names, module
    for name in names:
        assert hasattr(reference, name), f"{module}.{name}"
        assert hasattr(ours, name), f"lockstep.{module} lacks {name}"
        if inspect.isclass(getattr(vqp, name, None)):
            assert getattr(ours, name) is getattr(lockstep, name)
    exec(f"from lockstep.{module} import {', '.join(names)}", {})  # the statement a user writes


def _same_default(ours, reference):
    if isinstance(reference, torch.nn.Module):  # a module instance (LFQ's nn.Identity()): the same kind
        return type(ours) is type(reference)
    if inspect.isfunction(reference):  # a function (SimVQ's identity): the same behaviour
        probe = torch.zeros(1)
        return callable(ours) and ours(probe) is probe and reference(probe) is probe
    return ours == reference


@pytest.mark.parametrize("name", EXPORTED)
def test_the_constructor_signature_is_the_reference_s(name):
    reference = inspect.signature(getattr(vqp, name)).parameters
    ours = inspect.signature(getattr(lockstep, name)).parameters
    theirs = [p for p in reference.values() if p.kind != p.VAR_KEYWORD]
    head = list(ours.values())[:len(theirs)]
    assert [p.name for p in head] == [p.name for p in theirs], (name, list(ours))
    for mine, their in zip(head, theirs):
        assert mine.kind == their.kind, (name, mine.name, mine.kind, their.kind)
        assert _same_default(mine.default, their.default), (name, mine.name, mine.default, their.default)
    rest = list(ours.values())[len(theirs):]
    for extra in rest:  # lockstep's own options, keyword-only after the reference's; **kwargs where it has one
        assert extra.kind in (extra.KEYWORD_ONLY, extra.VAR_KEYWORD), (name, extra)
        assert extra.name in LOCKSTEP_OWN or extra.kind == extra.VAR_KEYWORD, (name, extra.name)
    has_kwargs = any(p.kind == p.VAR_KEYWORD for p in reference.values())
    assert has_kwargs == any(p.kind == p.VAR_KEYWORD for p in ours.values()), name


def test_the_declared_signature_is_the_one_that_binds():
    """A positional call in the reference's order reaches the option it names."""
    vq = lockstep.VectorQuantize(8, 16, 4, 2, True, 0.5)  # dim, codebook_size, codebook_dim, heads, separate, decay
    assert vq.heads == 2 and vq._codebook.embed.shape == (2, 16, 4)
    fsq = lockstep.FSQ([5, 5], 6, 2)  # levels, dim, num_codebooks
    assert fsq.dim == 6 and fsq.num_codebooks == 2


@pytest.mark.parametrize("act_name", ["tanh", "sigmoid", "normal", "laplace", "cauchy"])
def test_build_cdf_act_is_the_references_pair(act_name):
    from vector_quantize_pytorch.finite_scalar_perturbation import build_cdf_act as reference_build

    from lockstep.finite_scalar_perturbation import build_cdf_act
    act, inverse = build_cdf_act(act_name)
    act_ref, inverse_ref = reference_build(act_name)
    z = torch.randn(64, 10, dtype=torch.float64, requires_grad=True)
    y = act(z)
    torch.testing.assert_close(y, act_ref(z), atol=1e-12, rtol=1e-12)
    assert ((y > 0) & (y < 1)).all()
    torch.testing.assert_close(inverse(y), z, atol=1e-6, rtol=1e-6)  # the round trip
    p = torch.rand(100, dtype=torch.float64) * 0.98 + 0.01
    torch.testing.assert_close(inverse(p), inverse_ref(p), atol=1e-12, rtol=1e-12)
    (grad,) = torch.autograd.grad(y.sum(), z)  # differentiable, as the reference's
    (grad_ref,) = torch.autograd.grad(act_ref(z).sum(), z)
    torch.testing.assert_close(grad, grad_ref, atol=1e-12, rtol=1e-12)


def test_build_cdf_act_refuses_an_unknown_name_as_the_reference_does():
    from vector_quantize_pytorch.finite_scalar_perturbation import build_cdf_act as reference_build

    from lockstep.finite_scalar_perturbation import build_cdf_act
    with pytest.raises(AssertionError):
        reference_build("relu")
    with pytest.raises(AssertionError, match="relu"):
        build_cdf_act("relu")
