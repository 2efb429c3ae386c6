// The trainer's agreement checks between ranks (configuration, data plan, replicas): each rank's
// values gathered in one all_gather and compared with rank 0's; a difference is an error on every
// rank that names the ranks. Internal to src/train.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/dist/group.h"

namespace torch::nn {
class Module;
}

namespace lockstep::train {

// Hash of the raw bytes of `tensors` (a checksum for comparing replicas, not cryptographic).
int64_t checksum(const std::vector<at::Tensor>& tensors);

// Every rank must hold rank 0's parameters and buffers (quantizer codebooks included): one
// all_gather of two checksums; dist::ReplicaDivergence naming the ranks otherwise. `when` says
// where in the run ("at start", "at step 40").
void check_replicas(dist::Group& group, const std::vector<const torch::nn::Module*>& modules, const char* when);

// Every rank must train with the same settings (`config_text`: the configuration without the keys
// each rank may set for itself) and read the same LPIPS weights (`lpips_hash`, 0 without them).
void check_same_config(dist::Group& group, const std::string& config_text, int64_t lpips_hash);

// G5: the ranks' plans for `epoch` (plan hash, steps, data hash, training images) must agree;
// dist::ReplicaDivergence naming the ranks and what each would train on otherwise.
void check_same_plan(dist::Group& group, int64_t epoch, const std::vector<int64_t>& plan_hash_steps_data_images);

}  // namespace lockstep::train
