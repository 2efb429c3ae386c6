// What lockstep._C's two translation units share: bindings.cpp binds the module, its checked groups,
// errors and data plan; quantizer_bindings.cpp binds the Quantizer class.
#pragma once

#include <torch/extension.h>

#include <exception>

namespace py = pybind11;

namespace lockstep::python {

// Rethrows a lockstep error as the typed Python exception torch's autograd engine passes on (a backward's
// collective raises CollectiveMismatch there as it would outside it); returns for anything else.
void translate_for_autograd(std::exception_ptr e);

// lockstep._C.Quantizer, liblockstep's quantizers built by name (quantizer_bindings.cpp).
void bind_quantizer(py::module_& m);

}  // namespace lockstep::python
