"""vector_quantize_pytorch.Sequential: modules in order, exactly one of them a quantizer, whose extra
return values (indices, losses) come back beside the last module's output."""
from torch import nn

from ._quantizer import LockstepQuantizer
from .grouped import _Grouped


def _is_quantizer(module):
    return isinstance(module, (LockstepQuantizer, _Grouped))


class Sequential(nn.Module):
    """Sequential(*modules): forward(x, **kwargs) runs the modules in order, the quantizer with
    `kwargs`, and returns (output, *the quantizer's other return values), as the reference."""

    def __init__(self, *fns):
        super().__init__()
        count = sum(_is_quantizer(fn) for fn in fns)
        if count != 1:  # the reference asserts the same
            raise ValueError(f"lockstep.Sequential: needs exactly one lockstep quantizer among its modules, got {count}")
        self.fns = nn.ModuleList(fns)

    def forward(self, x, **kwargs):
        rest = ()
        for fn in self.fns:
            if _is_quantizer(fn):
                x, *rest = fn(x, **kwargs)
            else:
                x = fn(x)
        return (x, *rest)
