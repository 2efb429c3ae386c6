// The settings of `lockstep train` as typed structs, one per section of the configuration, and the
// one table that binds each key to its member: the key, its type and default (the member's), its
// limits and help, and whether a resumed run or a single rank may change it. The schema, the TOML
// reader and writer, the resume and per-rank checks and the docs check all read that table; code
// after parsing reads these members, never key strings. Quantizer options have their own tables
// (quant/option_specs.h); here only quantizer.name.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/train/config.h"

namespace lockstep::train {

struct DataSettings {
  TORCH_ARG(std::string, dataset) = "auto";  // "auto" only until resolve_dataset
  TORCH_ARG(std::string, dir) = "/usr/share/datasets/fashion-mnist";
  TORCH_ARG(int64_t, train_subset) = 0;
  TORCH_ARG(int64_t, test_subset) = 0;
  TORCH_ARG(std::string, buckets) = "256x256,288x224,224x288,320x224,224x320,384x192,192x384";
  TORCH_ARG(bool, random_flip) = false;
  TORCH_ARG(double, random_zoom) = 1.0;
  TORCH_ARG(std::string, remainder) = "drop";
  TORCH_ARG(int64_t, channels) = 3;
  TORCH_ARG(int64_t, eval_images) = 0;
  TORCH_ARG(int64_t, workers) = 2;
  TORCH_ARG(int64_t, prefetch) = 4;
};

struct ModelSettings {
  TORCH_ARG(std::string, architecture) = "conv";
  TORCH_ARG(std::vector<int64_t>, channels) = {16, 32, 64};
  TORCH_ARG(int64_t, res_blocks) = 1;
  TORCH_ARG(bool, batch_norm) = false;
  TORCH_ARG(std::vector<int64_t>, attention_levels) = {};
  TORCH_ARG(bool, mid_attention) = true;
  TORCH_ARG(int64_t, norm_groups) = 32;
};

// The quantizer's own options stay in the configuration's quantizer.<name> section, read by the
// quantizer registry through quant/option_specs.h.
struct QuantizerSettings {
  TORCH_ARG(std::string, name) = "fsq";
};

struct TrainSettings {
  TORCH_ARG(int64_t, epochs) = 1;
  TORCH_ARG(int64_t, steps) = 0;
  TORCH_ARG(int64_t, batch_size) = 64;
  TORCH_ARG(double, lr) = 2e-3;
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(std::string, lr_decay) = "constant";
  TORCH_ARG(double, lr_final_ratio) = 0.1;
  TORCH_ARG(double, grad_clip) = 0.0;
  TORCH_ARG(std::string, precision) = "float32";
  TORCH_ARG(int64_t, grad_accum) = 1;
  TORCH_ARG(int64_t, shard_size) = 0;
  TORCH_ARG(double, ema_decay) = 0.0;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(int64_t, seed) = 0;
  TORCH_ARG(int64_t, threads) = 0;
  TORCH_ARG(std::string, device) = "cpu";
  TORCH_ARG(int64_t, grad_bucket_kb) = 1024;
  TORCH_ARG(int64_t, log_every) = 50;
  TORCH_ARG(int64_t, checkpoint_every) = 500;
  TORCH_ARG(int64_t, eval_every) = 0;
};

struct LossSettings {
  TORCH_ARG(double, l2) = 1.0;
  TORCH_ARG(double, l1) = 0.0;
  TORCH_ARG(double, perceptual) = 0.0;
  TORCH_ARG(std::string, lpips_weights) = "";
  TORCH_ARG(double, adversarial) = 0.0;
  TORCH_ARG(std::string, gan_loss) = "hinge";
  TORCH_ARG(int64_t, gan_start_step) = 0;
  TORCH_ARG(bool, adaptive_weight) = true;
  TORCH_ARG(double, lecam) = 0.0;
  TORCH_ARG(double, disc_lr) = 0.0;
  TORCH_ARG(int64_t, disc_channels) = 64;
  TORCH_ARG(int64_t, disc_layers) = 3;
};

struct EvalSettings {
  TORCH_ARG(int64_t, batch_size) = 500;
  TORCH_ARG(std::string, fid_weights) = "";
  TORCH_ARG(int64_t, grid_images) = 16;
};

struct RunSettings {
  DataSettings data;
  ModelSettings model;
  QuantizerSettings quantizer;
  TrainSettings train;
  LossSettings loss;
  EvalSettings eval;
};

// One key of the table: its schema entry and the member it is read into and written from.
struct RunKey {
  KeySpec spec;
  std::function<void(RunSettings&, const Value&)> read;
  std::function<Value(const RunSettings&)> write;
};

// Every key of RunSettings, in the configuration's order (src/train/run_settings.cpp).
const std::vector<RunKey>& run_keys();

// The typed settings of a configuration, as they are.
RunSettings read_run_settings(const Config& config);
// The same, checked across keys (check_run_settings).
RunSettings run_settings(const Config& config);

// Sets in `config` every key whose member in `settings` differs from it (a value the run chose,
// such as data.dataset = "auto" resolved), so that the recorded configuration is what ran.
void record_run_settings(const RunSettings& settings, Config& config);

// The checks that involve several keys, in one place; each key's own limits are the schema's.
// Throws InvalidArgument naming the keys and their values.
void check_run_settings(const RunSettings& settings);

// Keys a resumed run may change, and keys each rank may set for itself, in table order.
std::vector<std::string> resumable_keys();
std::vector<std::string> per_rank_keys();

}  // namespace lockstep::train
