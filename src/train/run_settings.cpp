// The table of `lockstep train`'s settings, from their .def lists: each key bound to its member of
// RunSettings, whose default it takes, with its limits, help and use. docs/configuration.md documents
// these keys, row for row (SchemaTest.DocsGiveEveryKeyTheSchemasRow).
#include "lockstep/train/run_settings.h"

#include <deque>
#include <type_traits>
#include <utility>

#include "lockstep/core/error.h"
#include "lockstep/data/bucket_table.h"
#include "lockstep/quant/registry.h"
#include "lockstep/train/device.h"
#include "lockstep/train/step_geometry.h"

namespace lockstep::train {
namespace {

// The key "section.name" and an accessor of member section.name() of RunSettings: the key and
// the member cannot disagree.
#define LOCKSTEP_RUN_KEY(section, name) \
#section "." #name, [](auto& settings) -> auto& { return settings.section.name(); }

// Appends the key bound to `member`; its default is the member's in a default RunSettings. Returns
// its schema entry, for the limits and uses to be chained on.
template <class Member>
KeySpec& add(std::deque<RunKey>& keys, const char* key, Member member, std::string help) {
  using T = std::decay_t<decltype(member(std::declval<RunSettings&>()))>;
  const RunSettings defaults;
  RunKey k;
  static_cast<SettingSpec&>(k.spec) =
      setting_spec(key, Value(std::in_place_type<T>, member(defaults)), std::move(help));
  k.read = [member](RunSettings& s, const Value& v) { member(s) = std::get<T>(v); };
  k.write = [member](const RunSettings& s) { return Value(std::in_place_type<T>, member(s)); };
  keys.push_back(std::move(k));
  return keys.back().spec;
}

// data.buckets' and train.device's checks: the reason in a word, since the key, the value and the forms
// accepted are the message around it.
void check_bucket_table_text(const std::string& text) { data::check_bucket_table(data::parse_bucket_table(text), 1); }
void check_device_text(const std::string& text) {
  try {
    parse_device_spec(text);
  } catch (const InvalidArgument&) {
    throw InvalidArgument("not a device");
  }
}

// Every key, in the order the schema and docs/configuration.md list them: each section's .def list,
// each line the key bound to its member, its limits and uses chained on.
#define LOCKSTEP_KEY_OF(section, name) LOCKSTEP_RUN_KEY(section, name)
#define LOCKSTEP_SETTING(type, name, value, help, uses) \
  (void)(add(keys, LOCKSTEP_KEY_OF(LOCKSTEP_SECTION, name), help) uses);
std::vector<RunKey> build_run_keys() {
  std::deque<RunKey> keys;
#define LOCKSTEP_SECTION data
#include "lockstep/train/settings_data.def"
#undef LOCKSTEP_SECTION
#define LOCKSTEP_SECTION model
#include "lockstep/train/settings_model.def"
#undef LOCKSTEP_SECTION
#define LOCKSTEP_SECTION quantizer
#include "lockstep/train/settings_quantizer.def"
#undef LOCKSTEP_SECTION
#define LOCKSTEP_SECTION train
#include "lockstep/train/settings_train.def"
#undef LOCKSTEP_SECTION
#define LOCKSTEP_SECTION loss
#include "lockstep/train/settings_loss.def"
#undef LOCKSTEP_SECTION
#define LOCKSTEP_SECTION eval
#include "lockstep/train/settings_eval.def"
#undef LOCKSTEP_SECTION
  return {std::make_move_iterator(keys.begin()), std::make_move_iterator(keys.end())};
}
#undef LOCKSTEP_SETTING
#undef LOCKSTEP_KEY_OF

#undef LOCKSTEP_RUN_KEY

}  // namespace

const std::vector<RunKey>& run_keys() {
  static const std::vector<RunKey> keys = build_run_keys();
  return keys;
}

RunSettings read_run_settings(const Config& config) {
  RunSettings settings;
  for (const RunKey& k : run_keys()) k.read(settings, config.get(k.spec.key));
  return settings;
}

RunSettings run_settings(const Config& config) {
  RunSettings settings = read_run_settings(config);
  check_run_settings(settings);
  return settings;
}

void record_run_settings(const RunSettings& settings, Config& config) {
  for (const RunKey& k : run_keys()) {
    Value value = k.write(settings);
    if (value != config.get(k.spec.key)) config.set(k.spec.key, std::move(value));
  }
}

void check_run_settings(const RunSettings& s) {
  const TrainSettings& t = s.train;
  StepGeometry::of(t).check();
  // Fashion-MNIST's 28x28 images are used as they are.
  LOCKSTEP_CHECK_ARG(s.data.dataset() != "fashion-mnist" || (!s.data.random_flip() && s.data.random_zoom() == 1.0),
                     "data.random_flip and data.random_zoom apply to image folders; this run trains on Fashion-MNIST "
                     "(data.dir = ",
                     s.data.dir(), ")");
  // Shards are whole passes: statistics of one pass (BatchNorm's) or gradients compared over the
  // whole batch (VQGAN's adaptive weight) would be a shard's.
  LOCKSTEP_CHECK_ARG(t.shard_size() == 0 || !s.model.batch_norm(), "train.shard_size = ", t.shard_size(),
                     " runs each shard as its own pass, so model.batch_norm would normalise with a shard's "
                     "statistics; set one of them off");
  LOCKSTEP_CHECK_ARG(t.shard_size() == 0 || s.loss.adversarial() <= 0, "train.shard_size = ", t.shard_size(),
                     " does not support loss.adversarial = ", s.loss.adversarial(),
                     " (the discriminator's step and the adaptive weight take the whole batch); set one of them to 0");
  const LossSettings& l = s.loss;
  LOCKSTEP_CHECK_ARG(l.perceptual() == 0 || !l.lpips_weights().empty(), "loss.perceptual = ", l.perceptual(),
                     " needs loss.lpips_weights, the LPIPS-VGG weights file (docs/losses.md)");
  LOCKSTEP_CHECK_ARG(l.adversarial() <= 0 || !l.adaptive_weight() || l.l2() + l.l1() + l.perceptual() > 0,
                     "loss.adaptive_weight compares the adversarial loss's gradient with the reconstruction "
                     "losses', but loss.l2, loss.l1 and loss.perceptual are all 0");
}

namespace {
std::vector<std::string> keys_where(bool KeySpec::*use) {
  std::vector<std::string> keys;
  for (const RunKey& k : run_keys()) {
    if (k.spec.*use) keys.push_back(k.spec.key);
  }
  return keys;
}
}  // namespace

std::vector<std::string> resumable_keys() { return keys_where(&KeySpec::resumable); }
std::vector<std::string> per_rank_keys() { return keys_where(&KeySpec::per_rank); }

}  // namespace lockstep::train
