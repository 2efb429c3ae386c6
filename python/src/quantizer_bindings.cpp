// lockstep._C's quantizers: liblockstep's for Python. lockstep._C.make_quantizer builds one by name
// from the options declared in quant/option_specs.h and returns it as its own class: Quantizer (what
// every kind has: quantize, encode, decode, its tensors) or, for a kind with calls of its own, Vq,
// Residual, Fsq, Lfq or Fsp, each a Quantizer. The modules of python/lockstep/ map
// vector-quantize-pytorch's argument names onto those options. Forward and backward run here: the
// tensors returned carry LibTorch's autograd graph, which is Python's.
#include <torch/extension.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "lockstep/core/error.h"
#include "lockstep/dist/backward_reducer.h"
#include "lockstep/dist/collective.h"
#include "lockstep/dist/group_reducer.h"
#include "lockstep/quant/autocast.h"
#include "lockstep/quant/call_context.h"
#include "lockstep/quant/fsp.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/quantizer.h"
#include "lockstep/quant/registry.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/simvq.h"
#include "lockstep/quant/vq.h"
#include "quantizer_calls.h"

using lockstep::Value;
using lockstep::python::hold_for_threads;
using lockstep::python::translate_for_autograd;
using lockstep::quant::Fsp;
using lockstep::quant::Fsq;
using lockstep::quant::Lfq;
using lockstep::quant::Quantizer;
using lockstep::quant::Residual;
using lockstep::quant::Vq;

namespace {

// A Python value (bool, int, float, list of ints) as the option it sets; TypeError naming it otherwise.
Value option_value(const std::string& key, const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  if (py::isinstance<py::int_>(value)) return value.cast<int64_t>();
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    // Integers make a list of integers; a float among them, a list of numbers (the declaration decides).
    std::vector<int64_t> ints;
    std::vector<double> numbers;
    bool any_float = false;
    for (const py::handle item : value) {
      const bool is_int = py::isinstance<py::int_>(item) && !py::isinstance<py::bool_>(item);
      if (!is_int && !py::isinstance<py::float_>(item)) {
        throw py::type_error("option '" + key + "' must be a list of integers or of numbers");
      }
      any_float = any_float || !is_int;
      numbers.push_back(item.cast<double>());
      if (is_int) ints.push_back(item.cast<int64_t>());
    }
    if (any_float) return numbers;
    return ints;
  }
  throw py::type_error("option '" + key + "' must be a bool, an int, a float, a string or a list of ints, not " +
                       std::string(py::str(py::type::handle_of(value).attr("__name__"))));
}

std::shared_ptr<Quantizer> make(const std::string& name, const std::string& section, const py::dict& options) {
  std::map<std::string, Value> overrides;
  for (const auto& [key, value] : options) {
    const std::string k = py::str(key);
    // "key" is in `section`; "other.key" names another section (a residual quantizer's layers read theirs).
    overrides[k.find('.') == std::string::npos ? section + "." + k : k] = option_value(k, value);
  }
  return lockstep::quant::make_quantizer(name, lockstep::quant::default_option_reader(section, overrides));
}

// The quantizer's tensors by dotted name, the same tensors (not copies): the Python module registers
// them as its own parameters and buffers, so optimizers, state_dict() and .to() act on what runs here.
py::dict tensors(const torch::OrderedDict<std::string, at::Tensor>& named) {
  py::dict out;
  for (const auto& item : named) out[py::str(item.key())] = item.value();
  return out;
}

// VectorQuantize's forward arguments for its EMA update: ema_update_weight (None, a number, a tensor, or a callable
// of (embed_sum, cluster_size) returning either, called in the update with the GIL), accum_ema_update, ema_update.
lockstep::quant::VqUpdate vq_update_from(const py::object& weight, bool accumulate, std::optional<bool> ema_update) {
  lockstep::quant::VqUpdate update;
  update.accumulate = accumulate;
  update.ema_update = ema_update;
  if (weight.is_none()) return update;
  if (THPVariable_Check(weight.ptr())) {
    update.weight = weight.cast<at::Tensor>();
    return update;
  }
  if (PyFloat_Check(weight.ptr()) || PyLong_Check(weight.ptr())) {  // one weight for every code, as the reference
    update.weight = torch::tensor(weight.cast<double>());
    return update;
  }
  LOCKSTEP_CHECK_ARG(PyCallable_Check(weight.ptr()),
                     "ema_update_weight must be a number, a tensor or a callable of "
                     "(embed_sum, cluster_size), got ",
                     std::string(py::str(py::type::of(weight))));
  const std::shared_ptr<py::object> held = hold_for_threads(weight);
  update.weight_fn = [held](const at::Tensor& embed_sum, const at::Tensor& cluster_size) {
    py::gil_scoped_acquire gil;
    const py::object weight = (*held)(embed_sum, cluster_size);
    // A tensor, or a number for every code (the reference takes either from its callable).
    return THPVariable_Check(weight.ptr()) ? weight.cast<at::Tensor>() : torch::tensor(weight.cast<double>());
  };
  return update;
}

}  // namespace

namespace lockstep::python {
namespace {

// lockstep._C.Call: one call's own arguments (CallOptions), by keyword; what a call leaves out is the plain call.
void bind_call(py::module_& m) {
  py::class_<CallOptions>(m, "Call",
                          "One call's own arguments, each changing this call only: mask (b, n) bool keeps padding out "
                          "of statistics and losses (0 and -1 there, quant/quantizer.h); freeze_codebook leaves the "
                          "codebooks as they are; codebook: codes a module of the user's made (SimVQ's "
                          "codebook_transform, a vq_bridge); residual-vq: beam_size, dropout_layers; VQ: "
                          "ema_update_weight, accumulate and ema_update (the call's EMA update, quant/vq.h VqUpdate), "
                          "sample_codebook_temp, token_codes (each token's own codes); LFQ: inv_temperature; FSP: "
                          "fsp_eps; update_in_forward: a training call is a whole step.")
      .def(py::init([](std::optional<at::Tensor> mask, bool freeze_codebook, std::optional<at::Tensor> codebook,
                       std::optional<int64_t> beam_size, const py::object& ema_update_weight, bool accumulate,
                       std::optional<bool> ema_update, std::optional<double> sample_codebook_temp,
                       int64_t dropout_layers, std::optional<at::Tensor> token_codes,
                       std::optional<double> inv_temperature, std::optional<double> fsp_eps, bool update_in_forward) {
             CallOptions call;
             call.mask = std::move(mask);
             call.freeze_codebook = freeze_codebook;
             call.codebook = std::move(codebook);
             call.beam_size = beam_size;
             if (!ema_update_weight.is_none() || accumulate || ema_update.has_value()) {
               call.vq_update = vq_update_from(ema_update_weight, accumulate, ema_update);
             }
             call.sample_codebook_temp = sample_codebook_temp;
             call.dropout_layers = dropout_layers;
             call.token_codes = std::move(token_codes);
             call.inv_temperature = inv_temperature;
             call.fsp_eps = fsp_eps;
             call.update_in_forward = update_in_forward;
             return call;
           }),
           py::kw_only(), py::arg("mask") = py::none(), py::arg("freeze_codebook") = false,
           py::arg("codebook") = py::none(), py::arg("beam_size") = py::none(),
           py::arg("ema_update_weight") = py::none(), py::arg("accumulate") = false, py::arg("ema_update") = py::none(),
           py::arg("sample_codebook_temp") = py::none(), py::arg("dropout_layers") = 0,
           py::arg("token_codes") = py::none(), py::arg("inv_temperature") = py::none(),
           py::arg("fsp_eps") = py::none(), py::arg("update_in_forward") = false);
}

// What every quantizer has: its sizes, quantize (the training and evaluation call), encode, decode and
// its tensors.
void bind_interface(py::class_<Quantizer, std::shared_ptr<Quantizer>>& quantizer) {
  quantizer.def_property_readonly("kind", &Quantizer::kind)
      .def_property_readonly("dim", &Quantizer::dim)
      .def_property_readonly("codebook_size", &Quantizer::codebook_size)
      .def_property_readonly("num_indices", &Quantizer::num_indices)
      .def(
          "quantize",
          [](Quantizer& q, const at::Tensor& x, bool training, uint64_t seed, at::Tensor step,
             std::shared_ptr<lockstep::dist::LazyGroup> group, const CallOptions& call) {
            lockstep::quant::QuantizerOutput out;
            {
              // Without the GIL, as torch's own collectives run: a Gloo worker that finishes a job
              // may need it (to free a Python object the job held) while holding the queue this
              // thread's next collective waits for, and both would wait forever.
              py::gil_scoped_release no_gil;
              out = quantize_call(q, x, training, seed, step, group, call);
              if (training) {  // its update now (a whole step) or on backward (finish_training_call)
                std::vector<at::Tensor> tensors{out.quantized};
                for (const auto& [name, loss] : out.losses) tensors.push_back(loss);
                tensors = finish_training_call(q, x, std::move(tensors), std::move(out.update), call.update_in_forward,
                                               group, step);
                out.quantized = tensors[0];
                size_t i = 1;
                for (auto& [name, loss] : out.losses) loss = tensors[i++];
              }
            }
            py::dict losses;
            for (const auto& [name, value] : out.losses) losses[py::str(name)] = value;
            return py::make_tuple(out.quantized, out.indices, losses);
          },
          py::arg("x"), py::arg("training"), py::arg("seed"), py::arg("step"), py::arg("group") = nullptr,
          py::arg("call") = CallOptions{},
          "x: (b, n, dim) -> (quantized, int64 indices (b, n) or (b, n, k), {loss name: scalar}), with `call`'s own "
          "arguments (Call). Issues no collective (but VQ's k-means initialisation): in training with gradients, the "
          "statistics are reduced over `group` and the state updated when backward reaches the outputs, and `step` "
          "(an int64 tensor) advances then; with the call's update_in_forward, a training call is a whole step: its "
          "update, reduced over `group`, and the step's advance happen before it returns.")
      .def(
          "encode",
          [](Quantizer& q, const at::Tensor& x) {
            const lockstep::quant::NoAutocast fp32;
            return q.encode(x.is_floating_point() ? x.to(at::kFloat) : x);
          },
          py::arg("x"), py::call_guard<py::gil_scoped_release>())
      .def(
          "decode",
          [](Quantizer& q, const at::Tensor& indices) {
            const lockstep::quant::NoAutocast fp32;
            return q.decode(indices);
          },
          py::arg("indices"), py::call_guard<py::gil_scoped_release>())
      .def(
          "parameters", [](Quantizer& q) { return tensors(q.named_parameters(true)); },
          "The quantizer's parameters by dotted name, the same tensors.")
      .def(
          "buffers", [](Quantizer& q) { return tensors(q.named_buffers(true)); },
          "The quantizer's buffers by dotted name, the same tensors.");
}

// lockstep._C.Vq: a VQ's calls of its own (quant/vq.h): k-means, top-k codes, updates
// from codes chosen elsewhere, the in-place codebook gradient, code logits.
void bind_vq(py::module_& m) {
  py::class_<Vq, Quantizer, std::shared_ptr<Vq>>(m, "Vq")
      .def(
          "initialise",
          [](Vq& q, const at::Tensor& x, bool training, uint64_t seed, const at::Tensor& step,
             const std::shared_ptr<lockstep::dist::LazyGroup>& group, std::optional<at::Tensor> mask) {
            py::gil_scoped_release no_gil;  // k-means' collectives, as quantize's
            q.train(training);
            lockstep::quant::QuantizeContext ctx = call_context(x, seed, step, group, mask);
            // The reducer and step quantize's training call declares.
            const auto reducer = training ? training_reducer(ctx, group, step) : nullptr;
            const lockstep::quant::NoAutocast fp32;
            q.initialise(x.to(at::kFloat), ctx);
          },
          py::arg("x"), py::arg("training"), py::arg("seed"), py::arg("step"), py::arg("group") = nullptr,
          py::arg("mask") = py::none(),
          "VQ: the k-means initialisation a training quantize() with these arguments would run first, run now "
          "(for a vq_bridge, which makes the searched codebook from the initialised one); a no-op once "
          "initialised and in evaluation. Whatever the grad mode: the caller calls it for a call that may change "
          "state (training with gradients). Issues k-means' collectives over `group`.")
      .def(
          "searched_codebook",
          [](Vq& q, std::optional<at::Tensor> codebook) {
            const lockstep::quant::NoAutocast fp32;
            return q.searched_codebook(codebook ? *codebook : at::Tensor());
          },
          py::arg("codebook") = py::none(),
          "VQ: the codebooks the search takes (C, K, codebook_dim): embed, or `codebook` (a caller's codes made from "
          "it), moved by affine_param's statistics once set; differentiable in what it is given.")
      .def(
          "topk",
          [](Vq& q, const at::Tensor& x, int64_t k, bool training, uint64_t seed, at::Tensor step,
             std::shared_ptr<lockstep::dist::LazyGroup> group, const CallOptions& call) {
            LOCKSTEP_CHECK_ARG(!call.vq_update && !call.beam_size && !call.inv_temperature && !call.fsp_eps,
                               "topk takes a call's mask, freeze_codebook, codebook, sample_codebook_temp, token_codes "
                               "and update_in_forward only");
            lockstep::quant::VqTopk out;
            {
              py::gil_scoped_release no_gil;  // as quantize
              q.train(training);
              lockstep::quant::QuantizeContext ctx = call_context(x, seed, step, group, call.mask);
              ctx.freeze_codebook = call.freeze_codebook;
              ctx.sample_codebook_temp = call.sample_codebook_temp;
              if (call.codebook) ctx.codebook = *call.codebook;  // embed through the module's vq_bridge
              const auto reducer = defer_training_updates(ctx, training, group, step, call.update_in_forward);
              const lockstep::quant::NoAutocast fp32;
              const at::Tensor input = x.is_floating_point() ? x.to(at::kFloat) : x;
              out = call.token_codes ? q.quantize_topk_implicit(input, *call.token_codes, k, ctx)
                                     : q.quantize_topk(input, k, ctx);
              if (training) {  // as quantize
                std::vector<at::Tensor> tensors{out.quantized, out.code_loss};
                for (const auto& [name, loss] : out.losses) tensors.push_back(loss);
                tensors = finish_training_call(q, x, std::move(tensors), std::move(out.update), call.update_in_forward,
                                               group, step);
                out.quantized = tensors[0];
                out.code_loss = tensors[1];
                size_t i = 2;
                for (auto& [name, loss] : out.losses) loss = tensors[i++];
              }
            }
            py::dict losses;
            for (const auto& [name, value] : out.losses) losses[py::str(name)] = value;
            return py::make_tuple(out.quantized, out.indices, out.code_loss, losses);
          },
          py::arg("x"), py::arg("k"), py::arg("training"), py::arg("seed"), py::arg("step"), py::arg("group") = nullptr,
          py::arg("call") = CallOptions{},
          "VQ: each token's k best codes, x (b, n, dim) -> (quantized (b, n, k, dim), indices (b, n, k), each code's "
          "weighted commitment loss (b, n, k), {scalar loss name: value}) (quant/vq.h, Vq::quantize_topk); among "
          "each token's own codes `token_codes` (b * n, K, codebook_dim) when given (Vq::quantize_topk_implicit). No "
          "EMA update; in training the step advances as quantize's (on backward, or with the call's update_in_forward "
          "before it returns).")
      .def(
          "update_indices",
          [](Vq& q, const at::Tensor& x, const at::Tensor& indices, uint64_t seed, at::Tensor step,
             std::shared_ptr<lockstep::dist::LazyGroup> group, bool training, const CallOptions& call) {
            py::gil_scoped_release no_gil;
            q.train(training);
            lockstep::quant::QuantizeContext ctx = call_context(x, seed, step, group, call.mask);
            ctx.defer_updates = true;  // run below, over the group, as a training step's update
            const lockstep::quant::NoAutocast fp32;
            auto update = q.update_from(x.is_floating_point() ? x.to(at::kFloat) : x, indices, ctx,
                                        call.vq_update.value_or(lockstep::quant::VqUpdate{}));
            apply_update(update, group, step);
          },
          py::arg("x"), py::arg("indices"), py::arg("seed"), py::arg("step"), py::arg("group") = nullptr,
          py::arg("training") = true, py::arg("call") = CallOptions{},
          "VQ: the EMA update (and, in training, dead-code replacement) of tokens x (b, n, dim) with codes chosen "
          "elsewhere, `indices` (b, n) (-1: not counted; the call's mask and EMA arguments), now: its statistics are "
          "reduced over `group` at once "
          "(every rank of it must call this), then the step advances (quant/vq.h, Vq::update_from).")
      .def(
          "update_ema", [](Vq& q) { q.update_ema(); },
          "VQ: the codebook recomputed from its EMA statistics (the reference's Codebook.update_ema).")
      .def(
          "keep_in_place_gradient", [](Vq& q, bool on) { q.keep_in_place_gradient(on); }, py::arg("on"),
          "VQ: training calls report loss 'in_place' and their updates sum its global gradient (quant/vq.h).")
      .def(
          "take_in_place_gradient",
          [](Vq& q) -> std::optional<at::Tensor> {
            at::Tensor taken = q.take_in_place_gradient();
            return taken.defined() ? std::optional<at::Tensor>(taken) : std::nullopt;
          },
          "VQ: the in-place loss's gradient summed since the last take, (codebooks, K, codebook_dim), at the "
          "codes searched (embed, or the vq_bridge's codebook); None when no update added one.")
      .def(
          "code_logits",
          [](Vq& vq, const at::Tensor& x, std::optional<at::Tensor> codebook, std::optional<at::Tensor> token_codes) {
            const lockstep::quant::NoAutocast fp32;
            const at::Tensor input = x.is_floating_point() ? x.to(at::kFloat) : x;
            if (token_codes) return vq.implicit_code_logits(input, *token_codes);
            return vq.code_logits(input, codebook ? *codebook : at::Tensor());
          },
          py::arg("x"), py::arg("codebook") = py::none(), py::arg("token_codes") = py::none(),
          "VQ: tokens (b, n, dim) -> each code's logit (b, n[, heads], K), differentiable; `codebook`: embed "
          "through the module's vq_bridge; `token_codes`: each token's own codes (b * n, K, codebook_dim), "
          "the logits (b, n, K) among them.");
}

// lockstep._C.Residual: a residual quantizer's layers (each returned as its own class)
// and their k-means.
void bind_residual(py::module_& m) {
  py::class_<Residual, Quantizer, std::shared_ptr<Residual>>(m, "Residual")
      .def(
          "initialise",
          [](Residual& q, const at::Tensor& x, bool training, uint64_t seed, const at::Tensor& step,
             const std::shared_ptr<lockstep::dist::LazyGroup>& group, CallOptions call,
             const py::function& layer_codebook) {
            // By pointer: the function is copied into the call without the GIL, which a py::function's copy needs.
            const py::function* make = &layer_codebook;
            call.layer_codebook = [make](int64_t layer) {
              py::gil_scoped_acquire gil;
              return (*make)(layer).cast<at::Tensor>();
            };
            py::gil_scoped_release no_gil;  // k-means' collectives, as quantize's
            // The call quantize() with these arguments makes, whatever the grad mode (the caller calls this for
            // a call that may change state); its output and its deferred update are dropped: k-means alone stays.
            const at::AutoGradMode with_gradients(true);
            quantize_call(q, x.detach(), training, seed, step, group, call);
          },
          py::arg("x"), py::arg("training"), py::arg("seed"), py::arg("step"), py::arg("group"), py::arg("call"),
          py::arg("layer_codebook"),
          "Residual VQ: the layers' k-means initialisation a training quantize() with these arguments runs, each "
          "layer's from its residual, the codes of the layers before made by `layer_codebook(l)` (a (1, K_l, "
          "codebook_dim) tensor, made once layer l is initialised: a vq_bridge's of its codebook); nothing else "
          "changes. A no-op once every layer is initialised, and in evaluation. Issues k-means' collectives "
          "over `group`.")
      .def(
          "layer",
          [](Residual& residual, int64_t l) {
            const int64_t n = static_cast<int64_t>(residual.layers().size());
            LOCKSTEP_CHECK_ARG(l >= 0 && l < n, "layer(", l, "): the residual quantizer has ", n, " layers");
            return residual.layers()[static_cast<size_t>(l)];
          },
          py::arg("l"), "A residual quantizer's layer l (the same object).")
      .def(
          "layer_codes",
          [](Residual& residual, const at::Tensor& indices) { return residual.decode_layers(indices.to(at::kLong)); },
          py::arg("indices"),
          "Indices (b, n, num_quantizers) -> each layer's code as it enters the sum, (num_quantizers, b, n, "
          "layer_dim); zeros for a dropped layer (quant/residual.h, Residual::decode_layers).");
}

// lockstep._C.Fsq: FSQ's grid codes.
void bind_fsq(py::module_& m) {
  py::class_<Fsq, Quantizer, std::shared_ptr<Fsq>>(m, "Fsq")
      .def(
          "codes_to_indices", [](Fsq& fsq, const at::Tensor& codes) { return fsq.codes_to_indices(codes); },
          py::arg("codes"), "FSQ: codes (..., len(levels)) in [-1, 1] on the grid -> indices (...), int64.")
      .def(
          "indices_to_codes", [](Fsq& fsq, const at::Tensor& indices) { return fsq.indices_to_codes(indices); },
          py::arg("indices"), "FSQ: indices (...) -> codes (..., len(levels)) in [-1, 1], float32.");
}

// lockstep._C.Lfq: LFQ's codes and its loss terms.
void bind_lfq(py::module_& m) {
  py::class_<Lfq, Quantizer, std::shared_ptr<Lfq>>(m, "Lfq")
      .def(
          "indices_to_codes", [](Lfq& lfq, const at::Tensor& indices) { return lfq.indices_to_codes(indices); },
          py::arg("indices"), "LFQ: one codebook's indices (...) -> codes (..., bits), float32.")
      .def(
          "loss_terms",
          [](Lfq& lfq, const at::Tensor& x, bool training, uint64_t seed, const at::Tensor& step,
             std::shared_ptr<lockstep::dist::LazyGroup> group, std::optional<at::Tensor> mask,
             std::optional<double> inv_temperature) {
            lockstep::quant::LfqLossTerms terms;
            {
              py::gil_scoped_release no_gil;
              lfq.train(training);
              const lockstep::quant::NoAutocast fp32;
              lockstep::quant::QuantizeContext ctx = call_context(x, seed, step, group, mask);
              ctx.inv_temperature = inv_temperature;
              terms = lfq.loss_terms(x.is_floating_point() ? x.to(at::kFloat) : x, ctx);
            }
            return py::make_tuple(terms.per_sample_entropy, terms.codebook_entropy, terms.commitment);
          },
          py::arg("x"), py::arg("training"), py::arg("seed"), py::arg("step"), py::arg("group") = nullptr,
          py::arg("mask") = py::none(), py::arg("inv_temperature") = py::none(),
          "(per-sample entropy, codebook entropy, commitment), unweighted, of this rank's tokens as the same "
          "call of quantize counts them (vector-quantize-pytorch's LossBreakdown); no collective.")
      .def(
          "entropy_subset",
          [](Lfq& lfq, const at::Tensor& x, uint64_t seed, const at::Tensor& step,
             std::shared_ptr<lockstep::dist::LazyGroup> group, std::optional<at::Tensor> mask) {
            py::gil_scoped_release no_gil;
            const lockstep::quant::NoAutocast fp32;
            return lfq.entropy_subset(x.is_floating_point() ? x.to(at::kFloat) : x,
                                      call_context(x, seed, step, group, mask));
          },
          py::arg("x"), py::arg("seed"), py::arg("step"), py::arg("group") = nullptr, py::arg("mask") = py::none(),
          "bool (b, n): the tokens a training call with these arguments counts in its entropy terms (the mask's, "
          "and of those the frac_per_sample_entropy subset); no collective, no state change.");
}

// lockstep._C.Fsp: FSP's level indices, clamped decode and diagnostics.
void bind_fsp(py::module_& m) {
  py::class_<Fsp, Quantizer, std::shared_ptr<Fsp>>(m, "Fsp")
      .def(
          "diagnostics",
          [](Fsp& fsp, const at::Tensor& x, bool training, uint64_t seed, const at::Tensor& step,
             std::shared_ptr<lockstep::dist::LazyGroup> group, std::optional<double> eps) {
            lockstep::quant::FspDiagnostics d;
            {
              py::gil_scoped_release no_gil;
              fsp.train(training);
              const lockstep::quant::NoAutocast fp32;
              lockstep::quant::QuantizeContext ctx = call_context(x, seed, step, group, std::nullopt);
              ctx.fsp_eps = eps;
              d = fsp.diagnostics(x.is_floating_point() ? x.to(at::kFloat) : x, ctx);
            }
            return py::make_tuple(d.level_indices, d.mean, d.variance, d.skewness, d.kurtosis,
                                  d.accept_rate.defined() ? py::cast(d.accept_rate) : py::none());
          },
          py::arg("x"), py::arg("training"), py::arg("seed"), py::arg("step"), py::arg("group") = nullptr,
          py::arg("eps") = py::none(),
          "(level indices, mean, variance, skewness, kurtosis, accept rate or None) of this rank's tokens "
          "(quant/fsp.h, Fsp::diagnostics); the same draws (and clamp `eps`) as the call of quantize with these "
          "arguments.")
      .def(
          "level_indices", [](Fsp& fsp, const at::Tensor& indices) { return fsp.level_indices(indices); },
          py::arg("indices"), py::call_guard<py::gil_scoped_release>())
      .def(
          "decode_clamped",
          [](Fsp& fsp, const at::Tensor& indices, double eps) {
            const lockstep::quant::NoAutocast fp32;
            return fsp.decode_with(indices, eps);
          },
          py::arg("indices"), py::arg("eps"), py::call_guard<py::gil_scoped_release>(),
          "FSP: decode with need_inv_act's clamp to [eps, 1 - eps] (the reference's indices_to_codes eps).");
}

}  // namespace

void bind_quantizer(py::module_& m) {
  bind_call(m);  // first: the calls below default their `call` to one
  py::class_<Quantizer, std::shared_ptr<Quantizer>> quantizer(m, "Quantizer");
  bind_interface(quantizer);
  bind_compiled_calls(quantizer);
  // Each a Quantizer; make_quantizer (and Residual.layer) return a quantizer as the most derived of these.
  bind_vq(m);
  bind_residual(m);
  bind_fsq(m);
  bind_lfq(m);
  bind_fsp(m);
  m.def("make_quantizer", &make, py::arg("name"), py::arg("section"), py::arg("options"),
        "Builds quantizer `name` (\"fsq\", \"residual-vq\", ...) from the options of `section` "
        "(quant/option_specs.h), the declared defaults with `options` on top, as its own class (Vq, Residual, "
        "Fsq, Lfq, Fsp, or Quantizer for a kind with no calls of its own).");
}

}  // namespace lockstep::python
