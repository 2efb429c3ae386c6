// Every quantizer option is declared once (quant/option_specs.h): the configuration schema of
// `lockstep train` is assembled from the declarations, whose defaults are the library's, so the CLI
// and the library build the same quantizer from "the defaults".
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <map>
#include <set>
#include <type_traits>
#include <variant>

#include "lockstep/core/error.h"
#include "lockstep/quant/fsp.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/grouped.h"
#include "lockstep/quant/latent_quantize.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/option_specs.h"
#include "lockstep/quant/registry.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/simvq.h"
#include "lockstep/quant/vq.h"
#include "lockstep/train/config.h"
#include "lockstep/train/model_factory.h"
#include "quant/option_readers.h"

namespace lockstep::train {
namespace {

// The quantizer the library builds from its option structs' own defaults; only what the library
// requires as a constructor argument comes from the declarations.
std::shared_ptr<quant::Quantizer> library_default(const std::string& name) {
  using namespace quant;
  const auto fsq = [] { return FsqOptions(default_option_reader("fsq").int_list("levels")); };
  const auto lfq = [] { return LfqOptions(default_option_reader("lfq").integer("codebook_size")); };
  const auto vq = [] {
    return VqOptions(default_option_reader("vq").integer("dim"), default_option_reader("vq").integer("codebook_size"));
  };
  const auto residual = [] { return ResidualOptions(default_option_reader("residual").integer("num_quantizers")); };
  if (name == "fsq") return std::make_shared<Fsq>(fsq());
  if (name == "lfq") return std::make_shared<Lfq>(lfq());
  if (name == "vq") return std::make_shared<Vq>(vq());
  const auto simvq = [] {
    return SimVqOptions(default_option_reader("simvq").integer("dim"),
                        default_option_reader("simvq").integer("codebook_size"));
  };
  if (name == "simvq") return std::make_shared<SimVq>(simvq());
  if (name == "latent") {
    return std::make_shared<LatentQuantize>(LatentQuantizeOptions(default_option_reader("latent").int_list("levels")));
  }
  if (name == "fsp") return std::make_shared<Fsp>(FspOptions(default_option_reader("fsp").int_list("levels")));
  if (name == "residual-simvq") return make_residual_simvq(residual(), simvq());
  if (name == "residual-vq") return make_residual_vq(residual(), vq());
  if (name == "residual-fsq") return make_residual_fsq(residual(), fsq());
  if (name == "residual-lfq") return make_residual_lfq(residual(), lfq());
  const int64_t groups = default_option_reader("grouped").integer("groups");
  if (name == "grouped-residual-vq")
    return make_grouped(name, groups, [&] { return make_residual_vq(residual(), vq()); });
  if (name == "grouped-residual-fsq") {
    return make_grouped(name, groups, [&] { return make_residual_fsq(residual(), fsq()); });
  }
  if (name == "grouped-residual-lfq") {
    return make_grouped(name, groups, [&] { return make_residual_lfq(residual(), lfq()); });
  }
  ADD_FAILURE() << "no library default for " << name;
  return nullptr;
}

struct TrainedOnce {
  quant::QuantizerOutput out;
  at::Tensor grad;
  std::vector<at::Tensor> state;
};

// One training forward and backward on a fixed input, and the state after it.
TrainedOnce train_once(quant::Quantizer& q) {
  const at::Tensor x = torch::randn({2, 16, q.dim()}, at::detail::createCPUGenerator(11)).requires_grad_();
  TrainedOnce run;
  run.out = q.quantize(x, {nullptr, at::detail::createCPUGenerator(12)});
  (run.out.quantized.square().sum() + run.out.total_loss()).backward();
  run.grad = x.grad();
  for (const auto& p : q.named_parameters(true)) run.state.push_back(p.value().detach().clone());
  for (const auto& b : q.named_buffers(true)) run.state.push_back(b.value().clone());
  return run;
}

TEST(QuantizerDefaults, TheCliAndTheLibraryBuildTheSameQuantizers) {
  const Config defaults(lockstep_schema());
  for (const auto& name : quant::quantizer_names()) {
    SCOPED_TRACE(name);
    torch::manual_seed(3);  // codebooks and projections come from the default generator
    const auto cli = quant::make_quantizer(name, quantizer_options(defaults, name));
    torch::manual_seed(3);
    const auto lib = library_default(name);
    ASSERT_NE(lib, nullptr);
    const TrainedOnce a = train_once(*cli), b = train_once(*lib);
    EXPECT_TRUE(torch::equal(a.out.quantized, b.out.quantized));
    EXPECT_TRUE(torch::equal(a.out.indices, b.out.indices));
    EXPECT_EQ(a.out.total_loss().item<double>(), b.out.total_loss().item<double>());
    EXPECT_TRUE(torch::equal(a.grad, b.grad));  // the estimator and every loss weight
    ASSERT_EQ(a.state.size(), b.state.size());
    for (size_t i = 0; i < a.state.size(); ++i) EXPECT_TRUE(torch::equal(a.state[i], b.state[i])) << "tensor " << i;
  }
}

// The registry reads exactly the declared keys: none undeclared (the reader would throw), none
// declared and never read.
TEST(QuantizerDefaults, EveryDeclaredOptionIsReadByTheRegistry) {
  std::set<std::string> read;
  std::function<quant::OptionReader(const std::string&)> recording = [&](const std::string& section) {
    const quant::OptionReader base = quant::default_option_reader(section);
    quant::OptionReader r = base;
    r.integer = [&, base, section](const std::string& k) { return read.insert(section + "." + k), base.integer(k); };
    r.real = [&, base, section](const std::string& k) { return read.insert(section + "." + k), base.real(k); };
    r.boolean = [&, base, section](const std::string& k) { return read.insert(section + "." + k), base.boolean(k); };
    r.int_list = [&, base, section](const std::string& k) { return read.insert(section + "." + k), base.int_list(k); };
    r.string = [&, base, section](const std::string& k) { return read.insert(section + "." + k), base.string(k); };
    r.float_list = [&, base, section](const std::string& k) {
      return read.insert(section + "." + k), base.float_list(k);
    };
    r.section = recording;
    return r;
  };
  for (const auto& name : quant::quantizer_names()) {
    quant::make_quantizer(name, recording(name.rfind("residual-", 0) == 0 ? name.substr(9) : name));
  }
  std::set<std::string> declared;
  for (const auto& s : quant::quantizer_option_sections()) {
    for (const auto& o : s.options) declared.insert(s.name + "." + o.key);
  }
  EXPECT_EQ(read, declared);
  EXPECT_THROW(quant::default_option_reader("vq").integer("no_such_key"), InvalidArgument);
  EXPECT_THROW(quant::default_option_reader("vq").real("dim"), InvalidArgument);  // an integer
}

// An options struct's .def list (option_fields.h) is its section's options, every one of them and in its
// order, with the struct's declared defaults (a constructor argument at the CLI's, an optional's key 0, a
// choice by name with every name its choices), limits and help; validate() refuses a field just outside
// each limit, or not finite, naming it.
template <typename Options>
void expect_fields_declared_and_checked(const std::string& section) {
  const quant::OptionSection* declared = nullptr;
  for (const auto& s : quant::quantizer_option_sections()) {
    if (s.name == section) declared = &s;
  }
  ASSERT_NE(declared, nullptr) << section;
  const Options defaults = Options::declared_defaults();
  size_t fields = 0;
  Options::visit_fields(defaults, [&](const char* key, const auto& value, const Limits& limits, const char* help) {
    using T = std::decay_t<decltype(value)>;
    ASSERT_LT(fields, declared->options.size()) << section << "." << key;
    const quant::OptionSpec& spec = declared->options[fields++];
    ASSERT_EQ(spec.key, key) << section << ": the section's order is the .def list's";
    if constexpr (quant::is_required<T>::value || quant::is_key_only<T>::value) {
      EXPECT_TRUE(spec.default_value == Value(value.value)) << key;
    } else if constexpr (quant::is_optional<T>::value) {
      EXPECT_FALSE(value.has_value()) << key << ": unset by default";
      EXPECT_TRUE(spec.default_value == Value(typename T::value_type{})) << key << ": 0 means unset";
    } else if constexpr (std::is_enum_v<T>) {
      EXPECT_TRUE(spec.default_value == Value(quant::choice_name(value))) << key;
      EXPECT_EQ(spec.choices, quant::choice_names(value)) << key;
    } else {
      EXPECT_TRUE(spec.default_value == Value(value)) << key;
    }
    EXPECT_TRUE(spec.limits.min == limits.min && spec.limits.min_exclusive == limits.min_exclusive) << key;
    EXPECT_TRUE(spec.limits.max == limits.max && spec.limits.max_exclusive == limits.max_exclusive) << key;
    EXPECT_EQ(spec.help, help) << key;
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      std::vector<double> outside;
      if (limits.min) outside.push_back(limits.min_exclusive ? *limits.min : *limits.min - 1);
      if (limits.max) outside.push_back(limits.max_exclusive ? *limits.max : *limits.max + 1);
      if (std::is_floating_point_v<T>) outside.push_back(std::numeric_limits<double>::quiet_NaN());
      for (const double bad : outside) {
        Options options = defaults;
        Options::visit_fields(options, [&](const char* k, auto&& v, const Limits&, const char*) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, T>) {
            if (std::string(k) == key) v = static_cast<T>(bad);
          }
        });
        try {
          options.validate();
          ADD_FAILURE() << section << "." << key << " = " << bad << " accepted";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(section + ": " + key + " = "), std::string::npos) << e.what();
        }
      }
    }
  });
  EXPECT_EQ(fields, declared->options.size()) << section << ": every option is a line of its .def list";
  EXPECT_NO_THROW(defaults.validate());
}

TEST(QuantizerDefaults, EveryOptionIsALineOfItsStructsListAndItsLimitsAreChecked) {
  expect_fields_declared_and_checked<quant::FsqOptions>("fsq");
  expect_fields_declared_and_checked<quant::LfqOptions>("lfq");
  expect_fields_declared_and_checked<quant::VqOptions>("vq");
  expect_fields_declared_and_checked<quant::SimVqOptions>("simvq");
  expect_fields_declared_and_checked<quant::LatentQuantizeOptions>("latent");
  expect_fields_declared_and_checked<quant::FspOptions>("fsp");
  expect_fields_declared_and_checked<quant::ResidualOptions>("residual");
}

// The kinds read back as declared: a constructor argument, an optional's 0 (unset: the struct's fallback) and a
// set value, a choice by name (a name not among them refused, naming it), the keys VQ's reader maps.
TEST(QuantizerDefaults, EachKindOfOptionIsReadAsDeclared) {
  using quant::default_option_reader;
  const quant::VqOptions vq = quant::sections::vq_options(default_option_reader(
      "vq",
      {{"vq.dim", int64_t{16}}, {"vq.codebook_dim", int64_t{4}}, {"vq.cosine", true}, {"vq.rotation_trick", false}}));
  EXPECT_EQ(vq.dim(), 16);
  EXPECT_EQ(vq.codebook_dim(), 4);
  EXPECT_TRUE(vq.use_cosine_sim());
  EXPECT_EQ(vq.estimator(), quant::VqEstimator::StraightThrough);
  EXPECT_EQ(quant::sections::vq_options(default_option_reader("vq", {{"vq.dim", int64_t{16}}})).codebook_dim(), 16);
  EXPECT_EQ(quant::sections::vq_options(default_option_reader("vq")).estimator(), quant::VqEstimator::RotationTrick);
  const quant::FspOptions fsp = quant::sections::fsp_options(default_option_reader(
      "fsp", {{"fsp.activation", std::string("laplace")}, {"fsp.vector_norm", std::string("kurt")}}));
  EXPECT_EQ(fsp.activation(), quant::FspActivation::Laplace);
  EXPECT_EQ(fsp.norm().weights, quant::FspNorm::preset("kurt").weights);
  EXPECT_EQ(quant::sections::fsp_options(default_option_reader("fsp")).norm().targets,
            quant::FspNorm::preset("var_tanh").targets);
  const quant::ResidualOptions residual = quant::sections::residual_options(
      default_option_reader("residual", {{"residual.beam_size", int64_t{3}}, {"residual.num_quantizers", int64_t{6}}}));
  EXPECT_EQ(residual.num_quantizers(), 6);
  EXPECT_EQ(residual.eval_beam_size(), 3) << "0: the training beam";
  EXPECT_EQ(quant::sections::fsq_options(default_option_reader("fsq")).dim(), std::nullopt);
  EXPECT_EQ(quant::sections::fsq_options(default_option_reader("fsq", {{"fsq.dim", int64_t{12}}})).dim(), 12);
  EXPECT_THROW(quant::fsp_activation("relu"), InvalidArgument);
  try {
    quant::FspNorm::preset("varr");
    ADD_FAILURE() << "an unknown preset accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fsp: vector_norm = 'varr' is not one of: none, var, kurt"), std::string::npos)
        << e.what();
  }
}

// Overrides are held to the declarations: an undeclared key, a wrong type, a string not among the
// choices is an error naming it; an integer is taken for a number. (Numeric limits are the
// library's, which validate() applies: FSQ takes levels the configuration's limits do not.)
TEST(QuantizerDefaults, EveryOverrideIsADeclaredOptionOfItsType) {
  const auto message = [](std::map<std::string, Value> overrides) {
    try {
      quant::default_option_reader("vq", std::move(overrides));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({{"vq.decayy", 0.5}}).find("unknown quantizer option 'vq.decayy'; the options of vq: dim,"),
            std::string::npos);
  EXPECT_NE(message({{"vq.dim", 2.5}}).find("'vq.dim' must be an integer"), std::string::npos);
  EXPECT_EQ(message({{"fsq.levels", std::vector<int64_t>{512, 8}}}), "accepted");
  EXPECT_NO_THROW(quant::make_quantizer(
      "fsq", quant::default_option_reader("fsq", {{"fsq.levels", std::vector<int64_t>{512, 8}}})));
  EXPECT_NE(message({{"fsp.activation", std::string("relu")}}).find("is not one of: tanh, sigmoid"), std::string::npos);
  EXPECT_EQ(message({{"vq.decay", int64_t{0}}, {"lfq.codebook_size", int64_t{64}}}), "accepted");
  EXPECT_EQ(quant::default_option_reader("vq", {{"vq.decay", int64_t{0}}}).real("decay"), 0.0);
}

}  // namespace
}  // namespace lockstep::train
