#include "rank_agreement.h"

#include <torch/torch.h>

#include "lockstep/core/call_site.h"
#include "lockstep/core/error.h"
#include "lockstep/core/hash.h"
#include "lockstep/dist/collective.h"

namespace lockstep::train {
namespace {

// Every rank's `values` (rank order), and the ranks whose values differ from rank 0's.
struct RankValues {
  std::vector<std::vector<int64_t>> values;
  std::vector<int> differ;
};

RankValues gather_from_ranks(dist::Group& group, const std::vector<int64_t>& values, const CallSite& site) {
  const auto all = group.all_gather(torch::tensor(values, torch::kInt64), site);
  RankValues out;
  for (const auto& t : all) out.values.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  for (size_t r = 1; r < out.values.size(); ++r) {
    if (out.values[r] != out.values[0]) out.differ.push_back(static_cast<int>(r));
  }
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::vector<std::string> names;
  for (int r : ranks) names.push_back(std::to_string(r));
  return detail::concat_list(names);
}

// (dotted key, hash of its line) of each "name = value" line of a configuration's TOML text, in
// order: every rank's text lists the same keys (the schema's), so the hashes line up across ranks.
std::vector<std::pair<std::string, int64_t>> key_hashes(const std::string& toml) {
  std::vector<std::pair<std::string, int64_t>> out;
  std::string section;
  size_t start = 0;
  while (start < toml.size()) {
    size_t end = toml.find('\n', start);
    if (end == std::string::npos) end = toml.size();
    const std::string line = toml.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    out.emplace_back(section + "." + line.substr(0, eq), static_cast<int64_t>(fnv1a(line.data(), line.size())));
  }
  return out;
}

}  // namespace

int64_t checksum(const std::vector<at::Tensor>& tensors) {
  uint64_t h = kFnv1aOffset;
  for (const auto& t : tensors) {
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    h = fnv1a(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size(), h);
  }
  return static_cast<int64_t>(h);
}

void check_replicas(dist::Group& group, const std::vector<const torch::nn::Module*>& modules, const char* when) {
  std::vector<at::Tensor> params, buffers;
  for (const torch::nn::Module* m : modules) {
    for (const auto& p : m->named_parameters(true)) params.push_back(p.value());
    for (const auto& b : m->named_buffers(true)) buffers.push_back(b.value());
  }
  const RankValues all =
      gather_from_ranks(group, {checksum(params), checksum(buffers)}, LOCKSTEP_CALL_SITE("train.replica_check"));
  if (all.differ.empty()) return;
  std::vector<std::string> named;
  for (int r : all.differ) {
    std::vector<std::string> parts;
    if (all.values[r][0] != all.values[0][0]) parts.emplace_back("parameters");
    if (all.values[r][1] != all.values[0][1]) parts.emplace_back("buffers");
    named.push_back(detail::concat(r, " (", detail::concat_list(parts), ")"));
  }
  throw dist::ReplicaDivergence(
      detail::concat("rank ", group.rank(), " of ", group.size(), ", ", when, ": the model on rank(s) ",
                     detail::concat_list(named), " differs from rank 0's; data-parallel replicas must stay identical"),
      all.differ);
}

void check_same_config(dist::Group& group, const std::string& config_text, int64_t lpips_hash) {
  // The whole text's hash, the LPIPS file's, then one hash per key, to name the keys that differ.
  const auto keys = key_hashes(config_text);
  std::vector<int64_t> values = {static_cast<int64_t>(fnv1a(config_text.data(), config_text.size())), lpips_hash};
  for (const auto& key : keys) values.push_back(key.second);
  const RankValues all = gather_from_ranks(group, values, LOCKSTEP_CALL_SITE("train.config_check"));
  std::vector<int> config_differs, lpips_differs;
  for (int r : all.differ) (all.values[r][0] != all.values[0][0] ? config_differs : lpips_differs).push_back(r);
  std::vector<std::string> differing;  // "train.lr (rank 1)"
  for (size_t k = 0; k < keys.size(); ++k) {
    std::vector<int> ranks;
    for (int r : config_differs) {
      if (all.values[r][2 + k] != all.values[0][2 + k]) ranks.push_back(r);
    }
    if (!ranks.empty()) differing.push_back(keys[k].first + " (rank " + join_ranks(ranks) + ")");
  }
  LOCKSTEP_THROW_IF_NOT(config_differs.empty(), InvalidArgument, "rank ", group.rank(), " of ", group.size(),
                        ": the configuration of rank(s) ", join_ranks(config_differs), " differs from rank 0's in ",
                        detail::concat_list(differing),
                        " (compare `lockstep train --print-config` with each rank's flags); "
                        "every rank must be started with the same settings");
  LOCKSTEP_THROW_IF_NOT(lpips_differs.empty(), InvalidArgument, "rank ", group.rank(), " of ", group.size(),
                        ": the file loss.lpips_weights names on rank(s) ", join_ranks(lpips_differs),
                        " holds other bytes than rank 0's; every rank must read the same LPIPS weights");
}

void check_same_plan(dist::Group& group, int64_t epoch, const std::vector<int64_t>& plan_hash_steps_data_images) {
  const RankValues all = gather_from_ranks(group, plan_hash_steps_data_images, LOCKSTEP_CALL_SITE("train.epoch.plan"));
  if (all.differ.empty()) return;
  auto described = [&](int r) { return detail::concat(all.values[r][1], " steps over ", all.values[r][3], " images"); };
  std::vector<std::string> named;
  for (int r : all.differ) named.push_back(detail::concat(r, " (", described(r), ")"));
  throw dist::ReplicaDivergence(
      detail::concat("rank ", group.rank(), " of ", group.size(), ", epoch ", epoch, ": the data plan of rank(s) ",
                     detail::concat_list(named), " differs from rank 0's (", described(0),
                     "): the ranks do not read the same images (check data.dir and the data on each node)"),
      all.differ);
}

}  // namespace lockstep::train
