"""The modules' options come from liblockstep's declarations (quant/*_options.def, option_specs.cpp): every
option the reference's constructor names alike reaches liblockstep with the value given, without a line of
the module's own (issue #36: one declaration per option)."""
import inspect

import pytest

import lockstep
from lockstep.fsq import fsq_options
from lockstep.lfq import lfq_options
from lockstep.vq import vq_options

# section: (the options function, its required arguments, its liblockstep options, the same-named arguments
# that mean something else there and are mapped by the module)
SECTIONS = {
    "vq": (vq_options, dict(dim=8, codebook_size=16), lambda made: made, ()),
    "lfq": (lfq_options, dict(codebook_size=16), lambda made: made[0], ("cosine_sim_project_in",)),
    "fsq": (fsq_options, dict(levels=[8, 5]), lambda made: made[0], ()),
}


def _another(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 + 0.125
    return value[:-1] if len(value) > 1 else value * 2  # a list


@pytest.mark.parametrize("section", SECTIONS)
def test_each_declared_option_the_reference_names_alike_reaches_liblockstep(section):
    function, required, options_of, mapped = SECTIONS[section]
    parameters = inspect.signature(function).parameters
    defaults = options_of(function(**required))
    reached, refused = [], []
    for key, kind in lockstep._C.declared_options(section):
        if key not in parameters or key in mapped:
            continue  # spelt otherwise there (cosine, soft_clamp, ...) or given another meaning
        value = _another(defaults[key]) if key in defaults else {"int": 3, "float": 0.375, "bool": True}[kind]
        try:
            options = options_of(function(**{**required, key: value}))
        except (AssertionError, ValueError):  # a rule of the reference's about this value alone
            refused.append(key)
            continue
        assert options[key] == value, key
        assert type(options[key]).__name__ == {"int_list": "list", "float_list": "list"}.get(kind, kind), key
        reached.append(key)
    assert len(reached) >= {"vq": 20, "lfq": 10, "fsq": 6}[section], (reached, refused)


def test_declared_options_name_liblockstep_s_keys_and_types():
    declared = dict(lockstep._C.declared_options("vq"))
    assert declared["affine_param_batch_decay"] == "float" and declared["heads"] == "int"
    assert declared["cosine"] == "bool" and dict(lockstep._C.declared_options("fsq"))["levels"] == "int_list"
    assert lockstep._C.declared_options("no_such_section") == []
