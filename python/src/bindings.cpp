// lockstep._C: liblockstep for Python. This file makes the module: its errors, the checked groups
// (dist/backward_reducer.h), the data plan and the test helpers; the Quantizer class, through which the
// modules of python/lockstep/ run every quantizer, is quantizer_bindings.cpp's.
#include "bindings.h"

#include <torch/csrc/Exceptions.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/data/bucket_table.h"
#include "lockstep/data/plan.h"
#include "lockstep/dist/backward_reducer.h"
#include "lockstep/dist/checked_work.h"
#include "lockstep/dist/collective.h"
#include "lockstep/quant/autocast.h"
#include "lockstep/quant/binary_mapper.h"
#include "lockstep/quant/fsp.h"
#include "lockstep/quant/option_specs.h"
#if !LOCKSTEP_PYTHON_ONLY  // the full build's test helpers (LPIPS, FID) need the train layer
#include "lockstep/train/fid.h"
#include "lockstep/train/lpips_weights.h"
#endif

using lockstep::python::bind_quantizer;
using lockstep::python::translate_for_autograd;

namespace {

// A lockstep error raised inside torch's autograd engine (a backward's collective), as the Python
// exception it would be outside it: the engine translates only exceptions that name their type.
struct TypedPythonError : torch::PyTorchError {
  TypedPythonError(PyObject* type, std::string message) : torch::PyTorchError(std::move(message)), type_(type) {}
  PyObject* python_type() override { return type_; }
  PyObject* type_;
};

PyObject* mismatch_type = nullptr;  // lockstep.CollectiveMismatch, set when the module loads
PyObject* failure_type = nullptr;   // lockstep.CollectiveFailure

// lockstep's own Gloo group, for a process group without a built-in Gloo backend or a channel that wants
// its own, made by torch's Python API (`make(prefix)` returns a ProcessGroupGloo): the package needs no
// Gloo headers. Called in a backward, without the GIL.
lockstep::dist::GlooMaker gloo_from_python(py::function make) {
  std::shared_ptr<py::object> held = lockstep::python::hold_for_threads(std::move(make));
  return [held](const std::string& prefix) {
    py::gil_scoped_acquire gil;
    return (*held)(prefix).cast<c10::intrusive_ptr<c10d::Backend>>();
  };
}

// A LazyGroup's deleter: its channel may own a ProcessGroupGloo (made by `make_gloo`), whose destructor
// joins Gloo's worker threads, and a worker may be freeing a finished job whose thread-local state
// holds a Python object, which needs the GIL. Deleted with the GIL held (a module released by Python),
// the two waited for each other forever (a subgroup's run hung at its end, test_subgroups.py). While
// Python finalizes the group is left to the process's end, as gloo_from_python's callable is.
void delete_without_gil(lockstep::dist::LazyGroup* group) {
  if (lockstep::python::python_finalizing()) return;
  if (PyGILState_Check()) {
    py::gil_scoped_release no_gil;
    delete group;
  } else {
    delete group;
  }
}

// A failed check as the Python exception object it would raise (lockstep.distributed's worker hands it
// to the collective's future). Called with the GIL.
py::object as_python_exception(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const lockstep::dist::CollectiveMismatch& e) {
    return py::reinterpret_borrow<py::object>(mismatch_type)(e.what());
  } catch (const lockstep::dist::CollectiveFailure& e) {
    return py::reinterpret_borrow<py::object>(failure_type)(e.what());
  } catch (const lockstep::InvalidArgument& e) {
    return py::reinterpret_borrow<py::object>(PyExc_ValueError)(e.what());
  } catch (const std::exception& e) {
    return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(e.what());
  }
}

// The Python modules' name of an option type (_quantizer.declared_arguments casts to it).
const char* option_type_name(lockstep::ValueType type) {
  static const char* const names[] = {"bool", "int", "float", "str", "int_list", "float_list"};  // ValueType's order
  return names[static_cast<int>(type)];
}

// lockstep._C.LazyGroup, the checked channel of the Python modules and of lockstep.distributed, and the
// check of the Works it hands out.
void bind_channel(py::module_& m) {
  // A checked group made at its first collective, in a backward (dist/backward_reducer.h).
  py::class_<lockstep::dist::LazyGroup, std::shared_ptr<lockstep::dist::LazyGroup>>(m, "LazyGroup")
      .def(py::init([](const c10::intrusive_ptr<c10d::ProcessGroup>& process_group,
                       const c10::intrusive_ptr<c10d::Store>& store, double timeout_s, const std::string& prefix,
                       bool numbered, const std::string& identity, py::function make_gloo,
                       std::vector<int> global_ranks, bool own_gloo, bool predict) {
             lockstep::dist::LazyGroupOptions options;
             options.prefix = prefix;
             options.numbered = numbered;
             options.identity = identity;
             options.global_ranks = std::move(global_ranks);
             options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
             options.make_gloo = gloo_from_python(std::move(make_gloo));
             options.own_gloo = own_gloo;
             options.predict = predict;
             std::shared_ptr<lockstep::dist::LazyGroup> group(
                 new lockstep::dist::LazyGroup(process_group, store, std::move(options)), delete_without_gil);
             group->set_error_translator(translate_for_autograd);
             return group;
           }),
           py::arg("process_group"), py::arg("store"), py::arg("timeout"), py::arg("prefix"), py::kw_only(),
           py::arg("numbered"), py::arg("identity"), py::arg("make_gloo"), py::arg("global_ranks") = std::vector<int>(),
           py::arg("own_gloo") = false, py::arg("predict") = true,
           "See dist/backward_reducer.h's LazyGroupOptions. prefix: where under the store the channel meets (the "
           "same on every rank of the group, unique to the channel); numbered: append the count of channels this "
           "process made under the prefix, in order of first use; identity: this rank's description of the "
           "channel, compared across ranks at its first use ('' for none); make_gloo(prefix) -> a "
           "ProcessGroupGloo over the store under `prefix`, for a process group without a built-in Gloo backend; "
           "global_ranks: the members' ranks in the job, in the group's order, for errors about a subgroup; "
           "own_gloo: a Gloo group of the channel's own even where process_group has one; predict: once the "
           "calls repeat, check each against the repetition locally, with no exchange (docs/distributed.md)")
      .def(
          "check",
          [](lockstep::dist::LazyGroup& lazy, const std::string& op, const std::vector<at::Tensor>& tensors,
             const std::string& tag, const std::string& file, int line, bool compare_site) {
            py::gil_scoped_release release;  // the agreement waits for the other ranks
            const lockstep::dist::CollectiveOptions opts(lockstep::CallSite{tag.c_str(), file.c_str(), line});
            lockstep::dist::check_foreign_collective(*lazy.get(opts.site), op, tensors, opts, compare_site);
          },
          py::arg("op"), py::arg("tensors"), py::arg("tag"), py::arg("file"), py::arg("line"), py::arg("compare_site"),
          "Checks a torch.distributed collective before it runs (lockstep.distributed): the ranks agree on op, "
          "dtypes, shapes and tag, or all raise CollectiveMismatch naming each rank's call; a rank that died or "
          "stalled is a CollectiveFailure. Moves no data.")
      .def(
          "check_then",
          [](lockstep::dist::LazyGroup& lazy, const std::string& op, const std::vector<at::Tensor>& tensors,
             const std::string& tag, const std::string& file, int line, bool compare_site, py::function then) {
            const std::shared_ptr<py::object> held = lockstep::python::hold_for_threads(std::move(then));
            py::gil_scoped_release release;  // a first use makes the channel: a rendezvous
            lazy.check_then(op, tensors, tag, file, line, compare_site, [held](std::exception_ptr error) {
              if (lockstep::python::python_finalizing()) return;
              py::gil_scoped_acquire gil;
              try {
                (*held)(error ? as_python_exception(error) : py::none());
              } catch (py::error_already_set& e) {  // the callback's own bug: reported, the worker goes on
                e.discard_as_unraisable("lockstep.distributed's issuing callback");
              }
            });
          },
          py::arg("op"), py::arg("tensors"), py::arg("tag"), py::arg("file"), py::arg("line"), py::arg("compare_site"),
          py::arg("then"),
          "check without waiting: returns at once; the check runs on the channel's worker after every collective "
          "submitted before it, then then(error) runs there, before any later one: error None when every rank "
          "agreed (then issues the collective), else the CollectiveMismatch or CollectiveFailure to raise.")
      .def(
          "all_reduce_then",
          [](lockstep::dist::LazyGroup& lazy, const c10::intrusive_ptr<c10d::ProcessGroup>& inner,
             std::vector<at::Tensor> tensors, const c10d::AllreduceOptions& options, const std::string& op,
             const std::string& tag, const std::string& file, int line, bool compare_site) {
            lockstep::dist::ForeignCall call{op, tensors, tag, file, line, compare_site};
            py::gil_scoped_release release;
            return lockstep::dist::all_reduce_after_check(lazy, std::move(call), inner, std::move(tensors), options);
          },
          py::arg("inner"), py::arg("tensors"), py::arg("options"), py::arg("op"), py::arg("tag"), py::arg("file"),
          py::arg("line"), py::arg("compare_site"),
          "inner.allreduce(tensors, options), checked first: returns a Work at once; the channel's worker checks it "
          "after every collective submitted before it and then issues it on inner, with no Python on the way "
          "(dist/checked_work.h).")
      .def(
          "connect", [](lockstep::dist::LazyGroup& lazy) { lazy.get(); }, py::call_guard<py::gil_scoped_release>(),
          "Makes the checked channel now (a rendezvous of every rank) instead of at its first collective.")
      .def_property_readonly("rank", &lockstep::dist::LazyGroup::rank)
      .def_property_readonly("size", &lockstep::dist::LazyGroup::size);
  m.def(
      "raise_if_check_failed",
      [](c10d::Work& work) {
        py::gil_scoped_release release;
        return lockstep::dist::raise_if_check_failed(work);
      },
      py::arg("work"),
      "For a Work from LazyGroup.all_reduce_then: waits until its check ran and raises its CollectiveMismatch "
      "or CollectiveFailure; True. False at once for any other Work.");
}

}  // namespace

bool lockstep::python::python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

std::shared_ptr<py::object> lockstep::python::hold_for_threads(py::object object) {
  return std::shared_ptr<py::object>(new py::object(std::move(object)), [](py::object* held) {
    if (python_finalizing()) return;
    py::gil_scoped_acquire gil;
    delete held;
  });
}

// Rethrows a lockstep error as TypedPythonError; returns for anything else.
void lockstep::python::translate_for_autograd(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const lockstep::dist::CollectiveMismatch& m) {
    throw TypedPythonError(mismatch_type, m.what());
  } catch (const lockstep::dist::CollectiveFailure& f) {
    throw TypedPythonError(failure_type, f.what());
  } catch (const lockstep::InvalidArgument& v) {
    throw TypedPythonError(PyExc_ValueError, v.what());
  } catch (...) {
  }
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "liblockstep's quantizers (the lockstep package wraps them as torch.nn.Modules)";
  // lockstep's errors reach Python as ValueError (bad options or input) or RuntimeError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const lockstep::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const lockstep::CorruptInput& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  bind_quantizer(m);

  bind_channel(m);
  // Raised on every rank, naming the ranks and call sites (docs/guarantees.md, G1 and G2).
  static py::exception<lockstep::dist::CollectiveMismatch> mismatch(m, "CollectiveMismatch", PyExc_RuntimeError);
  static py::exception<lockstep::dist::CollectiveFailure> failure(m, "CollectiveFailure", PyExc_RuntimeError);
  mismatch_type = mismatch.ptr();
  failure_type = failure.ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const lockstep::dist::CollectiveMismatch& e) {
      PyErr_SetString(mismatch.ptr(), e.what());
    } catch (const lockstep::dist::CollectiveFailure& e) {
      PyErr_SetString(failure.ptr(), e.what());
    }
  });

  // The global data plan (data/plan.h) for lockstep.data.BucketBatchSampler.
  py::class_<lockstep::data::EpochPlan>(m, "EpochPlan")
      .def(py::init([](std::vector<std::vector<int64_t>> buckets, int64_t global_batch, uint64_t seed, bool pad,
                       int64_t epoch) {
             lockstep::data::PlanOptions options;
             options.global_batch = global_batch;
             options.seed = seed;
             options.remainder = pad ? lockstep::data::Remainder::Pad : lockstep::data::Remainder::Drop;
             return lockstep::data::EpochPlan(std::move(buckets), options, epoch);
           }),
           py::arg("buckets"), py::arg("global_batch"), py::arg("seed"), py::arg("pad"), py::arg("epoch"))
      .def("steps", &lockstep::data::EpochPlan::steps)
      .def("bucket", [](const lockstep::data::EpochPlan& plan, int64_t step) { return plan.batch(step).bucket; })
      .def("samples", [](const lockstep::data::EpochPlan& plan, int64_t step) { return plan.batch(step).samples; })
      .def("rank_part", &lockstep::data::EpochPlan::rank_part, py::arg("step"), py::arg("world_size"), py::arg("rank"))
      .def("hash", &lockstep::data::EpochPlan::hash);
  m.def(
      "nearest_bucket",
      [](const std::vector<std::pair<int64_t, int64_t>>& table, double width, double height) {
        std::vector<lockstep::data::BucketSize> sizes;
        for (const auto& [w, h] : table) sizes.push_back({w, h});
        return lockstep::data::nearest_bucket(sizes, width, height);
      },
      py::arg("table"), py::arg("width"), py::arg("height"),
      "The bucket of `table` ((width, height) pairs) nearest width/height in aspect ratio, as image folders choose.");
  m.def(
      "declared_options",
      [](const std::string& section) {
        py::list declared;
        for (const auto& s : lockstep::quant::quantizer_option_sections()) {
          if (s.name != section) continue;
          for (const auto& o : s.options) declared.append(py::make_tuple(o.key, option_type_name(o.type)));
        }
        return declared;
      },
      py::arg("section"),
      "[(key, type)] of the options liblockstep declares for `section` (\"vq\", \"lfq\", ...; quant/*_options.def "
      "and option_specs.cpp), type one of bool, int, float, str, int_list, float_list.");
  m.def(
      "fsp_activate",
      [](const std::string& name, const at::Tensor& z) {
        return lockstep::quant::fsp_activate(lockstep::quant::fsp_activation(name), z);
      },
      py::arg("name"), py::arg("z"), "FSP's CDF activation `name` of z, elementwise (quant/fsp.h), differentiable.");
  m.def(
      "fsp_invert",
      [](const std::string& name, const at::Tensor& p) {
        return lockstep::quant::fsp_invert(lockstep::quant::fsp_activation(name), p);
      },
      py::arg("name"), py::arg("p"), "The inverse of FSP's CDF activation `name` at p in (0, 1), elementwise.");
#if !LOCKSTEP_PYTHON_ONLY
  m.def(
      "_lpips_distance",
      [](const std::string& weights, const at::Tensor& x, const at::Tensor& y) {
        py::gil_scoped_release release;
        torch::NoGradGuard no_grad;
        return lockstep::train::load_lpips(weights, "weights")->forward(x, y);
      },
      py::arg("weights"), py::arg("x"), py::arg("y"),
      "LPIPS distances of two image batches in [-1, 1], as `lockstep train` computes them (for tests).");
  m.def(
      "_fid_features",
      [](const std::string& weights, const at::Tensor& x) {
        py::gil_scoped_release release;
        return lockstep::train::load_fid_inception(weights, "weights")->features(x);
      },
      py::arg("weights"), py::arg("x"),
      "FID Inception features (b, 2048) of images in [-1, 1], as lockstep's evaluation computes them (for tests).");
  py::class_<lockstep::quant::BinaryMapper>(m, "BinaryMapper")
      .def(py::init([](int64_t bits, double kl_loss_threshold) {
             return lockstep::quant::BinaryMapper(
                 lockstep::quant::BinaryMapperOptions(bits).kl_loss_threshold(kl_loss_threshold));
           }),
           py::arg("bits"), py::arg("kl_loss_threshold"))
      .def_property_readonly("num_codes", &lockstep::quant::BinaryMapper::num_codes)
      .def(
          "codes", [](const lockstep::quant::BinaryMapper& b) { return b.codes(at::kCPU); },
          "(2^bits, bits) bool: each code's bits, lowest first.")
      .def(
          "map",
          [](const lockstep::quant::BinaryMapper& b, const at::Tensor& logits, double temperature,
             bool straight_through, bool deterministic) {
            const lockstep::quant::NoAutocast fp32;
            const lockstep::quant::BinaryMapping out = b.map(logits, temperature, straight_through, deterministic);
            return py::make_tuple(out.one_hot, out.indices);
          },
          py::arg("logits"), py::arg("temperature"), py::arg("straight_through"), py::arg("deterministic"),
          "logits (..., bits) -> (one-hot (..., 2^bits), int64 indices (...)); bits drawn from torch's generator.")
      .def(
          "bit_entropy",
          [](const lockstep::quant::BinaryMapper& b, const at::Tensor& logits) {
            const lockstep::quant::NoAutocast fp32;
            return b.bit_entropy(logits);
          },
          py::arg("logits"))
      .def(
          "aux_kl_loss",
          [](const lockstep::quant::BinaryMapper& b, const at::Tensor& logits, bool reduce) {
            const lockstep::quant::NoAutocast fp32;
            return b.aux_kl_loss(logits, reduce);
          },
          py::arg("logits"), py::arg("reduce"))
      .def(
          "log_prob",
          [](const lockstep::quant::BinaryMapper& b, const at::Tensor& logits, const at::Tensor& indices,
             bool sum_bits) {
            const lockstep::quant::NoAutocast fp32;
            return b.log_prob(logits, indices, sum_bits);
          },
          py::arg("logits"), py::arg("indices"), py::arg("sum_bits"));

  m.def("_frechet_distance", &lockstep::train::frechet_distance, py::arg("mu1"), py::arg("sigma1"), py::arg("mu2"),
        py::arg("sigma2"), "The Frechet distance of two Gaussians, as lockstep's FID computes it (for tests).");
#endif
}
