#include "lockstep/quant/option_specs.h"

#include <algorithm>
#include <memory>
#include <type_traits>

#include "lockstep/core/error.h"
#include "lockstep/quant/fsp.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/latent_quantize.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/simvq.h"
#include "lockstep/quant/vq.h"
#include "quant/option_readers.h"

namespace lockstep::quant {
namespace {

// Typed, so that a literal default (0, {8, 5}) takes the option's type.
OptionSpec boolean(std::string key, bool value, std::string help) {
  return setting_spec(std::move(key), value, std::move(help));
}
OptionSpec integer(std::string key, int64_t value, std::string help, Limits limits = {}) {
  return setting_spec(std::move(key), value, std::move(help), limits);
}
OptionSpec int_list(std::string key, std::vector<int64_t> value, std::string help, Limits limits = {}) {
  return setting_spec(std::move(key), std::move(value), std::move(help), limits);
}
OptionSpec one_of(std::string key, std::string value, std::vector<std::string> choices, std::string help) {
  OptionSpec spec = setting_spec(std::move(key), std::move(value), std::move(help));
  spec.choices = std::move(choices);
  return spec;
}

// The options an options struct declares in its field list (option_fields.h), after the section's
// constructor arguments, in the list's order, with the struct's defaults.
template <typename Options>
void append_fields(OptionSection& section, const Options& defaults) {
  Options::visit_fields(defaults,
                        [&section](const char* key, const auto& value, const Limits& limits, const char* help) {
                          section.options.push_back(setting_spec(key, value, help, limits));
                        });
}

// `specs` placed right after the option `key` of `section`.
void insert_after(OptionSection& section, const std::string& key, const std::vector<OptionSpec>& specs) {
  auto at = std::find_if(section.options.begin(), section.options.end(),
                         [&key](const OptionSpec& o) { return o.key == key; });
  LOCKSTEP_ASSERT(at != section.options.end(), "no option '", key, "' in section ", section.name);
  section.options.insert(at + 1, specs.begin(), specs.end());
}

// Every field an options struct declares (option_fields.h), read under its own name as its type.
template <typename Options>
void read_fields(const OptionReader& o, Options& options) {
  Options::visit_fields(options, [&o](const char* key, auto& value, const Limits&, const char*) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, bool>) value = o.boolean(key);
    if constexpr (std::is_same_v<T, int64_t>) value = o.integer(key);
    if constexpr (std::is_same_v<T, double>) value = o.real(key);
    if constexpr (std::is_same_v<T, std::string>) value = o.string(key);
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) value = o.int_list(key);
    if constexpr (std::is_same_v<T, std::vector<double>>) value = o.float_list(key);
  });
}

VqEstimator vq_estimator(const OptionReader& o) {
  const bool directional = o.boolean("directional_reparam");
  const bool rotation = o.boolean("rotation_trick");
  LOCKSTEP_CHECK_ARG(!(directional && rotation),
                     "vq: directional_reparam and rotation_trick are two estimators; set rotation_trick = false");
  if (directional) return VqEstimator::DirectionalReparam;
  return rotation ? VqEstimator::RotationTrick : VqEstimator::StraightThrough;
}

// What the library takes as constructor arguments has no library default; these are the CLI's.
const std::vector<int64_t> kFsqLevels = {8, 5, 5, 5};
constexpr int64_t kLfqCodebookSize = 1024;
constexpr int64_t kVqDim = 8, kVqCodebookSize = 512;
constexpr int64_t kResidualLayers = 4;

}  // namespace

// Each section: the options struct its reader builds, then its declaration.
namespace sections {

OptionReader section_of(const OptionReader& o, const std::string& name) {
  LOCKSTEP_CHECK_ARG(static_cast<bool>(o.section), "this option reader has no section '", name, "'");
  return o.section(name);
}

FsqOptions fsq_options(const OptionReader& o) {
  FsqOptions options(o.int_list("levels"));
  read_fields(o, options);
  if (const int64_t dim = o.integer("dim"); dim != 0) options.dim(dim);  // 0: levels x codebooks
  return options;
}

OptionSection fsq_section() {
  OptionSection section{
      "fsq",
      {int_list("levels", kFsqLevels,
                "FSQ levels per latent channel; the codebook size is their product (8*5*5*5 = 1000).",
                Limits().in_range(2, 256).length(1, 16)),
       integer("dim", 0,
               "Channels fed to FSQ, projected to len(levels) x num_codebooks and back; 0 means no projection.",
               Limits().in_range(0, 4096))},
      [](const OptionReader& o) { fsq_options(o).validate(); }};
  append_fields(section, FsqOptions(kFsqLevels));
  return section;
}

LfqOptions lfq_options(const OptionReader& o) {
  LfqOptions options(o.integer("codebook_size"));
  read_fields(o, options);
  if (const int64_t dim = o.integer("dim"); dim != 0) options.dim(dim);  // 0: codebooks x log2 codebook_size
  return options;
}

OptionSection lfq_section() {
  OptionSection section{
      "lfq",
      {integer("codebook_size", kLfqCodebookSize,
               "LFQ codebook size K, a power of two; the latent has log2 K channels, one bit each.",
               Limits().in_range(2, 1 << 24)),
       integer("dim", 0,
               "Channels fed to LFQ, projected to num_codebooks x log2 K bits and back; 0 means num_codebooks x "
               "log2 K.",
               Limits().in_range(0, 4096))},
      [](const OptionReader& o) { lfq_options(o).validate(); }};
  append_fields(section, LfqOptions(kLfqCodebookSize));
  return section;
}

VqOptions vq_options(const OptionReader& o) {
  VqOptions options(o.integer("dim"), o.integer("codebook_size"));
  read_fields(o, options);
  options.use_cosine_sim(o.boolean("cosine")).estimator(vq_estimator(o));
  if (const int64_t cd = o.integer("codebook_dim"); cd != 0) options.codebook_dim(cd);  // 0: dim
  return options;
}

OptionSection vq_section() {
  const VqOptions d(kVqDim, kVqCodebookSize);
  OptionSection section{
      "vq",
      {integer("dim", kVqDim, "Channels of each latent token, the length of each code vector.",
               Limits().in_range(1, 4096)),
       integer("codebook_size", kVqCodebookSize, "Number of codes K.", Limits().in_range(1, 1 << 20))},
      [](const OptionReader& o) { vq_options(o).validate(); }};
  append_fields(section, d);
  // What VqOptions holds otherwise, each after the key it has always followed.
  insert_after(section, "threshold_ema_dead_code",
               {boolean("cosine", d.use_cosine_sim(), "Cosine similarity: l2-normalise tokens and codes."),
                // The library's rule (the rotation trick when dim > 1), applied to the default dim.
                boolean("rotation_trick", d.estimator() == VqEstimator::RotationTrick,
                        "Rotation-trick gradient estimator; false uses straight-through.")});
  insert_after(section, "layernorm_after_project_in",
               {boolean("directional_reparam", false,
                        "DiVeQ estimator: the token plus its distance to the code along the noised direction to it "
                        "(needs rotation_trick = false and threshold_ema_dead_code > 0; no commitment loss).")});
  insert_after(section, "separate_codebook_per_head",
               {integer("codebook_dim", 0,
                        "Length of each code; projections in and out when heads x codebook_dim != dim; 0 means dim.",
                        Limits().in_range(0, 4096))});
  return section;
}

SimVqOptions simvq_options(const OptionReader& o) {
  SimVqOptions options(o.integer("dim"), o.integer("codebook_size"));
  read_fields(o, options);
  if (const int64_t fd = o.integer("frozen_codebook_dim"); fd != 0) options.frozen_codebook_dim(fd);  // 0: dim
  return options;
}

OptionSection simvq_section() {
  OptionSection section{
      "simvq",
      {integer("dim", kVqDim, "Channels of each latent token, the length of each code the map gives.",
               Limits().in_range(1, 4096)),
       integer("codebook_size", kVqCodebookSize, "Number of codes K.", Limits().in_range(1, 1 << 20)),
       integer("frozen_codebook_dim", 0, "Length of the frozen random codes the linear map reads; 0 means dim.",
               Limits().in_range(0, 4096))},
      [](const OptionReader& o) { simvq_options(o).validate(); }};
  append_fields(section, SimVqOptions(kVqDim, kVqCodebookSize));
  return section;
}

LatentQuantizeOptions latent_options(const OptionReader& o) {
  LatentQuantizeOptions options(o.int_list("levels"));
  read_fields(o, options);
  if (const int64_t dim = o.integer("dim"); dim != 0) options.dim(dim);  // 0: levels x codebooks
  return options;
}

OptionSection latent_section() {
  OptionSection section{
      "latent",
      {int_list("levels", kFsqLevels, "Values per latent channel; the codebook size is their product (8*5*5*5 = 1000).",
                Limits().in_range(2, 256).length(1, 16)),
       integer("dim", 0, "Channels fed in, projected to len(levels) x num_codebooks and back; 0 means no projection.",
               Limits().in_range(0, 4096))},
      [](const OptionReader& o) { latent_options(o).validate(); }};
  append_fields(section, LatentQuantizeOptions(kFsqLevels));
  return section;
}

FspOptions fsp_options(const OptionReader& o) {
  FspOptions options(o.int_list("levels"));
  read_fields(o, options);
  options.activation(fsp_activation(o.string("activation"))).norm(FspNorm::preset(o.string("vector_norm")));
  if (const int64_t dim = o.integer("dim"); dim != 0) options.dim(dim);  // 0: len(levels)
  return options;
}

OptionSection fsp_section() {
  const FspOptions d(kFsqLevels);
  OptionSection section{
      "fsp",
      {int_list("levels", kFsqLevels, "FSP bins per latent channel; the codebook size is their product.",
                Limits().in_range(2, 1 << 22).length(1, 16)),
       integer("dim", 0, "Channels fed in, projected to len(levels) and back; 0 means no projection.",
               Limits().in_range(0, 4096))},
      [](const OptionReader& o) { fsp_options(o).validate(); }};
  append_fields(section, d);
  insert_after(
      section, "projection_has_bias",
      {one_of("activation", fsp_activation_name(d.activation()), {"tanh", "sigmoid", "normal", "laplace", "cauchy"},
              "The CDF that maps each channel into [0, 1] before binning.")});
  section.options.push_back(one_of("vector_norm", "var_tanh",
                                   {"none", "var", "kurt", "var_tanh", "var_sigmoid", "var_laplace"},
                                   "The regulariser's preset: which of the batch's mean, variance, skewness and "
                                   "kurtosis per channel are pulled to which targets (loss \"norm\")."));
  return section;
}

ResidualOptions residual_options(const OptionReader& o) {
  ResidualOptions options(o.integer("num_quantizers"));
  read_fields(o, options);
  options.eval_beam_size(o.integer("eval_beam_size"));
  return options;
}

OptionSection residual_section() {
  OptionSection section{
      "residual",
      {integer("num_quantizers", kResidualLayers, "Layers of the residual-* quantizers.", Limits().in_range(1, 64))},
      [](const OptionReader& o) { residual_options(o).validate(); }};
  append_fields(section, ResidualOptions(kResidualLayers));
  insert_after(
      section, "beam_size",
      {integer("eval_beam_size", 0, "residual-vq: the beam in evaluation; 0 means beam_size.", Limits().at_least(0))});
  return section;
}

OptionSection grouped_section() {
  OptionSection section{"grouped",
                        {integer("groups", 2,
                                 "Groups of the grouped-* quantizers: the latent is split into this many equal parts, "
                                 "each quantized by its own residual quantizer.",
                                 Limits().in_range(1, 64))},
                        [](const OptionReader& o) {
                          LOCKSTEP_CHECK_ARG(o.integer("groups") >= 1, "grouped: groups = ", o.integer("groups"),
                                             " must be >= 1");
                        }};
  return section;
}

}  // namespace sections

const std::vector<OptionSection>& quantizer_option_sections() {
  using namespace sections;
  static const std::vector<OptionSection> all = {fsq_section(),      lfq_section(),    vq_section(),
                                                 simvq_section(),    latent_section(), fsp_section(),
                                                 residual_section(), grouped_section()};
  return all;
}

}  // namespace lockstep::quant
