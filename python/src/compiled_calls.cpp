// The calls torch.compile's custom ops make (python/lockstep/_ops.py): a training forward recorded with its
// graph, which its backward then differentiates (the forward runs once), or the values alone.
#include <torch/csrc/autograd/autograd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "lockstep/core/error.h"
#include "lockstep/dist/collective.h"
#include "quantizer_calls.h"

namespace lockstep::python {
namespace {

// Autograd recording switched back on for a call made inside a custom op, which runs below autograd.
class Recording {
 public:
  Recording()
      : keys_(c10::impl::tls_local_dispatch_key_set()),
        record_(keys_.included_, keys_.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView) {}

 private:
  c10::impl::LocalDispatchKeySet keys_;
  c10::impl::ForceDispatchKeyGuard record_;
  torch::AutoGradMode grad_{true};
};

// A compiled training call's forward, recorded with its graph: its backward differentiates that graph (the
// forward is not computed again) and applies the call's state update, as eager's backward does.
struct RecordedCall {
  std::shared_ptr<Quantizer> quantizer;  // alive while its update may run
  at::Tensor input;                      // the leaf that stood for x
  std::optional<at::Tensor> given;       // a caller's codebook, a leaf
  std::vector<at::Tensor> outputs;       // those that require a gradient: quantized, losses
  std::vector<int64_t> output_of;        // of each output: -1 for quantized, else its loss's index in the names
  std::function<void(lockstep::quant::Reducer&)> update;
  bool taken = false;  // differentiated once: the graph is freed
};

// [quantized, indices, the losses named (0 where absent)] of a call, detached; copies when `kept` (the call's
// graph lives on: the compiled graph owns what the op returns and may write into it, as into a buffer it
// reuses, while the kept graph may hold the same memory, the indices a lookup saved).
std::vector<at::Tensor> values_of(const lockstep::quant::QuantizerOutput& out, const std::vector<std::string>& names,
                                  const at::Tensor& x, bool kept) {
  const auto value = [kept](const at::Tensor& t) { return kept ? t.detach().clone() : t.detach(); };
  std::vector<at::Tensor> values{value(out.quantized), value(out.indices)};
  for (const auto& name : names) values.push_back(value(loss_or_zero(out, name, x)));
  return values;
}

// The outputs of a call that require a gradient, in order (quantized, then the named losses), each with the
// index of its gradient: -1 for quantized's, else its name's.
void differentiable_outputs(const lockstep::quant::QuantizerOutput& out, const std::vector<std::string>& names,
                            std::vector<at::Tensor>& outputs, std::vector<int64_t>& output_of) {
  if (out.quantized.requires_grad()) {
    outputs.push_back(out.quantized);
    output_of.push_back(-1);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const auto found = out.losses.find(names[i]);
    if (found != out.losses.end() && found->second.requires_grad()) {
      outputs.push_back(found->second);
      output_of.push_back(static_cast<int64_t>(i));
    }
  }
}

// [grad of x, grad of each parameter, grad of `given` when there is one]: the gradients of `outputs` (their
// gradients picked by `output_of`) at the leaf `input`, the parameters that require one and `given`; zeros
// where none flows. Frees the graph.
std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& outputs, const std::vector<int64_t>& output_of,
                                  const at::Tensor& grad_quantized, const std::vector<at::Tensor>& grad_losses,
                                  const at::Tensor& input, const std::vector<at::Tensor>& parameters,
                                  const std::optional<at::Tensor>& given) {
  std::vector<at::Tensor> grads;
  for (const int64_t i : output_of) grads.push_back(i < 0 ? grad_quantized : grad_losses[static_cast<size_t>(i)]);
  std::vector<at::Tensor> inputs{input};
  for (const auto& p : parameters) {
    if (p.requires_grad()) inputs.push_back(p);
  }
  if (given) inputs.push_back(*given);
  std::vector<at::Tensor> found;
  if (!outputs.empty()) {
    found = torch::autograd::grad(outputs, inputs, grads, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  }
  std::vector<at::Tensor> result;
  size_t next = 0;
  const auto grad_of = [&](const at::Tensor& t, bool differentiated) {
    const at::Tensor g = differentiated && next < found.size() ? found[next++] : at::Tensor();
    result.push_back(g.defined() ? g : torch::zeros_like(t));
  };
  grad_of(input, true);
  for (const auto& p : parameters) grad_of(p, p.requires_grad());
  if (given) grad_of(*given, true);
  return result;
}

}  // namespace

void bind_compiled_calls(py::class_<Quantizer, std::shared_ptr<Quantizer>>& quantizer) {
  py::class_<RecordedCall, std::shared_ptr<RecordedCall>>(
      quantizer, "RecordedCall",
      "A compiled training call's forward with its graph, for its backward (Quantizer.quantize_recorded).");
  quantizer
      .def(
          "quantize_values",
          [](Quantizer& q, const at::Tensor& x, bool training, uint64_t seed, const at::Tensor& step,
             std::shared_ptr<lockstep::dist::LazyGroup> group, bool grad_mode, const std::vector<std::string>& names,
             const CallOptions& options) {
            py::gil_scoped_release no_gil;
            // The values alone (a call no backward follows): no graph is recorded, and grad_mode (the
            // caller's) decides only what it decides in eager, VQ's k-means initialisation.
            const at::AutoDispatchBelowAutograd no_graph;
            const torch::AutoGradMode caller(grad_mode);
            const lockstep::quant::QuantizerOutput out = quantize_call(q, x, training, seed, step, group, options);
            return values_of(out, names, x, /*kept=*/false);
          },
          py::arg("x"), py::arg("training"), py::arg("seed"), py::arg("step"), py::arg("group"), py::arg("grad_mode"),
          py::arg("loss_names"), py::arg("call") = CallOptions{},
          "[quantized, indices, the losses named (0 where absent)] of quantize(), with no autograd graph and no "
          "state change (but VQ's k-means initialisation when grad_mode): torch.compile's forward where no "
          "backward follows.")
      .def(
          "quantize_recorded",
          [](Quantizer& q, const at::Tensor& x, bool training, uint64_t seed, const at::Tensor& step,
             std::shared_ptr<lockstep::dist::LazyGroup> group, const std::vector<std::string>& names,
             CallOptions options) {
            auto call = std::make_shared<RecordedCall>();
            std::vector<at::Tensor> values;
            {
              py::gil_scoped_release no_gil;
              const Recording recording;
              call->quantizer = std::static_pointer_cast<Quantizer>(q.shared_from_this());
              call->input = x.detach().requires_grad_(true);
              if (options.codebook) call->given = options.codebook->detach().requires_grad_(true);
              options.codebook = call->given;
              lockstep::quant::QuantizerOutput out =
                  quantize_call(q, call->input, training, seed, step, group, options);
              differentiable_outputs(out, names, call->outputs, call->output_of);
              call->update = std::move(out.update);
              values = values_of(out, names, x, /*kept=*/true);
            }
            return py::make_tuple(values, call);
          },
          py::arg("x"), py::arg("training"), py::arg("seed"), py::arg("step"), py::arg("group"), py::arg("loss_names"),
          py::arg("call") = CallOptions{},
          "(quantize_values' list, a RecordedCall): a training forward with gradients, its graph kept for "
          "backward_recorded, which differentiates it instead of computing the call again; no state change (but "
          "VQ's k-means initialisation): torch.compile's forward where a backward follows.")
      .def(
          "backward_recorded",
          [](Quantizer& q, RecordedCall& call, bool training, at::Tensor step,
             std::shared_ptr<lockstep::dist::LazyGroup> group, const at::Tensor& grad_quantized,
             const std::vector<at::Tensor>& grad_losses, const std::vector<at::Tensor>& parameters) {
            py::gil_scoped_release no_gil;
            LOCKSTEP_CHECK_ARG(!call.taken, "backward_recorded: the recorded call was differentiated already");
            LOCKSTEP_CHECK_ARG(call.quantizer.get() == &q, "backward_recorded: a call recorded by another quantizer");
            const Recording recording;
            call.taken = true;
            // Before the gradients, where eager's backward runs it too (the node on the outputs comes
            // first): the orthogonal loss's gradient is taken at the updated codebook.
            apply_update(call.update, group, step, batch_check(q, call.input, training, group));
            std::vector<at::Tensor> result = gradients(call.outputs, call.output_of, grad_quantized, grad_losses,
                                                       call.input, parameters, call.given);
            call.outputs.clear();  // the graph's last references
            call.update = {};
            return result;
          },
          py::arg("call"), py::arg("training"), py::arg("step"), py::arg("group"), py::arg("grad_quantized"),
          py::arg("grad_losses"), py::arg("parameters"),
          "[grad of x, grad of each of `parameters`, grad of the codebook when one was given] of a recorded call "
          "for the gradients of its outputs, its graph differentiated (then freed); first the state update of the "
          "training step, reduced over `group`, and `step` advanced: torch.compile's backward.");
}

}  // namespace lockstep::python
