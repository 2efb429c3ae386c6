#include "lockstep/dist/collective.h"

#include <c10/core/ScalarType.h>

#include <algorithm>

#include "lockstep/core/hash.h"

namespace lockstep::dist {
namespace {

constexpr int64_t kMagic = 0x6c6f636b73746570;  // "lockstep": a fingerprint, not stray data

std::string dtype_name(const at::Tensor& t);

// "float32", or "float32 on cuda" for tensors off the CPU: ranks must agree on the device type too,
// which decides the transport that carries the data (Gloo or NCCL).
std::string spec_type(const at::Tensor& t) {
  if (t.device().is_cpu()) return dtype_name(t);
  return dtype_name(t) + " on " + c10::DeviceTypeName(t.device().type(), /*lower_case=*/true);
}

std::string dtype_name(const at::Tensor& t) {
  std::string name = c10::toString(t.scalar_type());  // "Float", "Long", ...
  if (name == "Float") return "float32";
  if (name == "Double") return "float64";
  if (name == "Long") return "int64";
  if (name == "Int") return "int32";
  if (name == "Half") return "float16";
  if (name == "BFloat16") return "bfloat16";
  if (name == "Byte") return "uint8";
  if (name == "Bool") return "bool";
  return name;
}

}  // namespace

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllReduce:
      return "all_reduce";
    case CollectiveOp::AllGather:
      return "all_gather";
    case CollectiveOp::Broadcast:
      return "broadcast";
    case CollectiveOp::Barrier:
      return "barrier";
    case CollectiveOp::Foreign:
      return "foreign";
  }
  return "unknown";
}

CollectiveCall CollectiveCall::of(uint64_t sequence, CollectiveOp op, const std::vector<at::Tensor>& tensors,
                                  const CallSite& site, const Phase& phase, ReduceOp reduce, int root) {
  CollectiveCall call;
  call.phase = phase;
  call.sequence = sequence;
  call.op = op;
  call.reduce = reduce;
  call.root = root;
  call.site = site;
  for (const auto& t : tensors) call.tensors.push_back({spec_type(t), t.sizes().vec()});
  return call;
}

std::string CollectiveCall::describe() const {
  std::string out = detail::concat("#", sequence, " ", op == CollectiveOp::Foreign ? foreign : collective_op_name(op));
  if (op == CollectiveOp::AllReduce) out += detail::concat("(", reduce_op_name(reduce), ")");
  if (op == CollectiveOp::Broadcast) out += detail::concat("(root ", root, ")");
  // A barrier, or a foreign op that passes no tensors every rank must agree on (all_to_all).
  const bool no_tensors = op == CollectiveOp::Barrier || (op == CollectiveOp::Foreign && tensors.empty());
  if (!no_tensors && tensors.size() <= 4) {
    out += " of [";
    for (size_t i = 0; i < tensors.size(); ++i) {
      out += (i ? ", " : "") + tensors[i].dtype + " (";
      for (size_t j = 0; j < tensors[i].sizes.size(); ++j) out += detail::concat(j ? ", " : "", tensors[i].sizes[j]);
      out += ")";
    }
    out += "]";
  } else if (!no_tensors) {
    // Many tensors (a gradient bucket): their count and elements per dtype, in order of appearance.
    std::vector<std::pair<std::string, int64_t>> per_dtype;
    for (const auto& t : tensors) {
      int64_t n = 1;
      for (int64_t s : t.sizes) n *= s;
      auto it = std::find_if(per_dtype.begin(), per_dtype.end(), [&](const auto& p) { return p.first == t.dtype; });
      if (it == per_dtype.end())
        per_dtype.emplace_back(t.dtype, n);
      else
        it->second += n;
    }
    out += detail::concat(" of ", tensors.size(), " tensors (");
    for (size_t i = 0; i < per_dtype.size(); ++i) {
      out += detail::concat(i ? ", " : "", per_dtype[i].second, " ", per_dtype[i].first);
    }
    out += ")";
  }
  out += " at " + site.to_string();
  // A foreign call outside any phase lockstep declared: the phase would only say so.
  if (op == CollectiveOp::Foreign && phase.kind == Phase::Kind::None) return out;
  return out + " in " + phase.describe();
}

std::array<int64_t, CollectiveCall::kWords> CollectiveCall::fingerprint() const {
  uint64_t shapes = kFnv1aOffset;
  for (const auto& t : tensors) {
    shapes = fnv1a(t.dtype.data(), t.dtype.size() + 1, shapes);
    const int64_t rank = static_cast<int64_t>(t.sizes.size());
    shapes = fnv1a(&rank, sizeof rank, shapes);
    shapes = fnv1a(t.sizes.data(), t.sizes.size() * sizeof(int64_t), shapes);
  }
  const std::string tag = site.tag ? site.tag : "";
  const uint64_t tag_hash = compare_site ? fnv1a(tag.data(), tag.size()) : 0;
  // A foreign op's word is its name's hash with the top bit set: it never equals lockstep's own ops.
  uint64_t op_word = op == CollectiveOp::Foreign ? fnv1a(foreign.data(), foreign.size()) | (uint64_t{1} << 63)
                                                 : static_cast<uint64_t>(op);
  op_word = watched ? op_word & ~kUnwatchedBit : op_word | kUnwatchedBit;
  return {kMagic,
          static_cast<int64_t>(sequence),
          static_cast<int64_t>(op_word),
          op == CollectiveOp::AllReduce ? static_cast<int64_t>(reduce) : -1,
          root,
          static_cast<int64_t>(tensors.size()),
          static_cast<int64_t>(shapes),
          static_cast<int64_t>(tag_hash),
          static_cast<int64_t>(phase.kind),
          phase.step};
}

CollectiveMismatch::CollectiveMismatch(int rank, std::vector<std::string> per_rank, bool pending)
    : Error([&] {
        std::string out = detail::concat(
            "collective mismatch (seen by rank ", rank, " of ", per_rank.size(),
            "): ranks disagree about this collective, ",
            pending ? "which the ranks that repeated their earlier calls issued and the others never will, so it "
                      "returns nothing and this group is unusable;"
                    : "so none of them ran it;");
        for (size_t r = 0; r < per_rank.size(); ++r) out += detail::concat(" rank ", r, ": ", per_rank[r], ";");
        out.pop_back();
        return out;
      }()),
      per_rank_(std::move(per_rank)) {}

}  // namespace lockstep::dist
