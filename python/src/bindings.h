// What lockstep._C's translation units share: bindings.cpp binds the module, its checked groups, errors and
// data plan; quantizer_bindings.cpp binds the Quantizer class, compiled_calls.cpp its calls for torch.compile
// (quantizer_calls.cpp: one call as the Python modules make it).
#pragma once

#include <torch/extension.h>

#include <exception>
#include <memory>

namespace py = pybind11;

namespace lockstep::quant {
class Quantizer;
}

namespace lockstep::python {

// Rethrows a lockstep error as the typed Python exception torch's autograd engine passes on (a backward's
// collective raises CollectiveMismatch there as it would outside it); returns for anything else.
void translate_for_autograd(std::exception_ptr e);

// Whether Python is finalizing: a thread that asks for the GIL then is ended by pthread_exit, which would
// unwind through a noexcept destructor (std::terminate). Callbacks from C++ threads skip Python then.
bool python_finalizing();

// A Python object that C++ keeps for threads without the GIL (a backward, a channel's worker): released
// with the GIL held, or left to the process's end while Python finalizes.
std::shared_ptr<py::object> hold_for_threads(py::object object);

// lockstep._C.make_quantizer and the quantizer classes it returns, one per kind with calls of its own
// (quantizer_bindings.cpp).
void bind_quantizer(py::module_& m);

// The Quantizer's calls for torch.compile's custom ops (compiled_calls.cpp).
void bind_compiled_calls(
    py::class_<lockstep::quant::Quantizer, std::shared_ptr<lockstep::quant::Quantizer>>& quantizer);

}  // namespace lockstep::python
