"""The docs' table of vector-quantize-pytorch's classes (docs/python/vector-quantize-pytorch.md) stays equal to
what both packages export."""
import inspect
import re

import vector_quantize_pytorch

import lockstep
from docs_pages import section


def table():
    return dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", section("Classes of vector-quantize-pytorch"), re.M))


def test_the_table_lists_every_class_the_reference_exports_and_every_lockstep_module():
    rows = table()
    reference = {n for n, o in vars(vector_quantize_pytorch).items() if not n.startswith("_") and inspect.isclass(o)}
    assert set(rows) == reference
    provided = {name for name, status in rows.items() if status == f"`lockstep.{name}`"}
    assert all(status in (f"`lockstep.{name}`", "not yet") for name, status in rows.items()), rows
    # The modules: not the error types nor helpers such as reference_state_dict.
    modules = {n for n in lockstep.__all__ if inspect.isclass(getattr(lockstep, n))
               and not issubclass(getattr(lockstep, n), Exception)}
    assert provided == modules
    for name in reference - provided:
        assert not hasattr(lockstep, name), f"lockstep.{name} exists but the table says 'not yet'"
