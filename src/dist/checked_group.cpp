#include "checked_group.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <thread>
#include <utility>

namespace lockstep::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::string join(const std::vector<int>& ranks) {
  std::vector<std::string> names;
  for (int r : ranks) names.push_back(std::to_string(r));
  return detail::concat_list(names);
}

// Tensors of one call travel as one flat buffer per dtype, in order of first appearance: one
// transport operation per dtype, whatever the number of tensors.
struct Packed {
  std::vector<at::Tensor> buffers;
  std::vector<std::pair<size_t, int64_t>> where;  // per tensor: (buffer, offset)
};

Packed pack(const std::vector<at::Tensor>& tensors) {
  Packed p;
  std::map<at::ScalarType, size_t> buffer_of;
  std::vector<std::vector<at::Tensor>> parts;
  std::vector<int64_t> lengths;
  for (const auto& t : tensors) {
    auto [it, added] = buffer_of.emplace(t.scalar_type(), parts.size());
    if (added) {
      parts.emplace_back();
      lengths.push_back(0);
    }
    p.where.emplace_back(it->second, lengths[it->second]);
    parts[it->second].push_back(t.reshape({-1}));
    lengths[it->second] += t.numel();
  }
  for (auto& part : parts) p.buffers.push_back(part.size() == 1 ? part[0].contiguous().clone() : torch::cat(part));
  return p;
}

void unpack(const Packed& p, std::vector<at::Tensor>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto [buffer, offset] = p.where[i];
    tensors[i].copy_(p.buffers[buffer].narrow(0, offset, tensors[i].numel()).view(tensors[i].sizes()));
  }
}

}  // namespace

// An all_reduce whose data is on its way: the transport works while the caller computes.
class CheckedGroup::Pending final : public PendingCollective {
 public:
  Pending(CheckedGroup& group, std::vector<at::Tensor>& tensors, const CollectiveOptions& opts)
      : group_(group), tensors_(tensors), opts_(opts) {}

  void wait() override {
    for (auto& work : works_) group_.finish(*work, call_, opts_);
    if (!tensors_.empty()) unpack(packed_, tensors_);
    group_.liveness_->leave(call_);
  }

 private:
  friend class CheckedGroup;
  CheckedGroup& group_;
  std::vector<at::Tensor>& tensors_;
  CollectiveOptions opts_;
  CollectiveCall call_;
  Packed packed_;
  std::vector<std::unique_ptr<TransportWork>> works_;
};

CheckedGroup::CheckedGroup(const CheckedGroupOptions& options, c10::intrusive_ptr<c10d::Store> store,
                           std::unique_ptr<Transport> control, std::unique_ptr<Transport> device)
    : options_(options), store_(std::move(store)), control_(std::move(control)), device_(std::move(device)) {
  liveness_ = std::make_unique<Liveness>(store_, options_.rank, options_.size);
  liveness_->set_note("connected, no collective yet");
}

CheckedGroup::~CheckedGroup() {
  if (failed_ && options_.rank == 0 && options_.size > 1) std::this_thread::sleep_for(options_.store_grace);
}

std::chrono::milliseconds CheckedGroup::timeout_of(const CollectiveOptions& opts) const {
  return opts.timeout.count() > 0 ? opts.timeout : options_.timeout;
}

// Checked before the call takes a sequence number, so a refused call leaves the group as it was.
Transport& CheckedGroup::transport_for(const std::vector<at::Tensor>& tensors, const char* op,
                                       const CollectiveOptions& opts) {
  if (tensors.empty()) return *control_;
  const c10::Device device = tensors[0].device();
  for (const auto& t : tensors) {
    LOCKSTEP_CHECK_ARG(t.device() == device, "rank ", options_.rank, ": ", op, " at ", opts.site.to_string(),
                       " mixes tensors on ", device, " and ", t.device(), " in one call");
  }
  if (control_->carries(device)) return *control_;
  if (device_ && device_->carries(device)) return *device_;
  throw InvalidArgument(detail::concat("rank ", options_.rank, ": ", op, " at ", opts.site.to_string(),
                                       " has tensors on ", tensors[0].device(), ", which this group's transports (",
                                       control_->name(), device_ ? std::string(", ") + device_->name() : std::string(),
                                       ") do not carry"));
}

void CheckedGroup::all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op, const CollectiveOptions& opts) {
  all_reduce_async(tensors, op, opts)->wait();
}

// The fingerprint exchange happens now; the data moves on the transport until wait().
std::unique_ptr<PendingCollective> CheckedGroup::all_reduce_async(std::vector<at::Tensor>& tensors, ReduceOp op,
                                                                  const CollectiveOptions& opts) {
  std::lock_guard<std::mutex> lock(mutex_);
  require_usable("all_reduce", opts);
  Transport& transport = transport_for(tensors, "all_reduce", opts);
  auto pending = std::make_unique<Pending>(*this, tensors, opts);
  pending->call_ = CollectiveCall::of(++sequence_, CollectiveOp::AllReduce, tensors, opts.site, phase(), op);
  liveness_->enter(pending->call_);
  agree(pending->call_, opts);
  if (tensors.empty()) return pending;
  pending->packed_ = pack(tensors);
  for (auto& buffer : pending->packed_.buffers) pending->works_.push_back(transport.all_reduce(buffer, op));
  return pending;
}

std::vector<at::Tensor> CheckedGroup::all_gather(const at::Tensor& input, const CollectiveOptions& opts) {
  std::lock_guard<std::mutex> lock(mutex_);
  require_usable("all_gather", opts);
  Transport& transport = transport_for({input}, "all_gather", opts);
  const CollectiveCall call = CollectiveCall::of(++sequence_, CollectiveOp::AllGather, {input}, opts.site, phase());
  liveness_->enter(call);
  agree(call, opts);
  std::vector<at::Tensor> outputs;
  for (int r = 0; r < options_.size; ++r) outputs.push_back(torch::empty_like(input, at::MemoryFormat::Contiguous));
  auto work = transport.all_gather(outputs, input.contiguous());
  finish(*work, call, opts);
  liveness_->leave(call);
  return outputs;
}

void CheckedGroup::broadcast(std::vector<at::Tensor>& tensors, int root, const CollectiveOptions& opts) {
  std::lock_guard<std::mutex> lock(mutex_);
  require_usable("broadcast", opts);
  LOCKSTEP_CHECK_ARG(root >= 0 && root < options_.size, "broadcast at ", opts.site.to_string(), ": root ", root,
                     " is not a rank of a group of size ", options_.size);
  Transport& transport = transport_for(tensors, "broadcast", opts);
  const CollectiveCall call =
      CollectiveCall::of(++sequence_, CollectiveOp::Broadcast, tensors, opts.site, phase(), ReduceOp::Sum, root);
  liveness_->enter(call);
  agree(call, opts);
  if (tensors.empty()) return liveness_->leave(call);
  Packed packed = pack(tensors);
  for (auto& buffer : packed.buffers) {
    auto work = transport.broadcast(buffer, root);
    finish(*work, call, opts);
  }
  unpack(packed, tensors);
  liveness_->leave(call);
}

// The fingerprint exchange is itself a barrier; unchecked, an empty all_reduce stands in for it.
void CheckedGroup::barrier(const CollectiveOptions& opts) {
  std::lock_guard<std::mutex> lock(mutex_);
  require_usable("barrier", opts);
  const CollectiveCall call = CollectiveCall::of(++sequence_, CollectiveOp::Barrier, {}, opts.site, phase());
  liveness_->enter(call);
  agree(call, opts);
  if (!options_.checked) {
    at::Tensor token = torch::zeros({1}, torch::kInt64);
    auto work = control_->all_reduce(token, ReduceOp::Sum);
    finish(*work, call, opts);
  }
  liveness_->leave(call);
}

void CheckedGroup::check_foreign(const std::string& op, const std::vector<at::Tensor>& tensors,
                                 const CollectiveOptions& opts, bool compare_site) {
  std::lock_guard<std::mutex> lock(mutex_);
  require_usable(op.c_str(), opts);
  CollectiveCall call = CollectiveCall::of(++sequence_, CollectiveOp::Foreign, tensors, opts.site, phase());
  call.foreign = op;
  call.compare_site = compare_site;
  liveness_->enter(call);
  agree(call, opts);
  liveness_->leave(call);
}

void check_foreign_collective(Group& group, const std::string& op, const std::vector<at::Tensor>& tensors,
                              const CollectiveOptions& opts, bool compare_site) {
  if (auto* checked = dynamic_cast<CheckedGroup*>(&group))
    return checked->check_foreign(op, tensors, opts, compare_site);
  LOCKSTEP_CHECK_ARG(group.size() == 1, "rank ", group.rank(), ": ", op, " at ", opts.site.to_string(),
                     " cannot be checked on ", group.describe(), ", which is not a checked group");
}

// Fingerprints are of fixed size, so the exchange itself can never mismatch.
void CheckedGroup::agree(const CollectiveCall& call, const CollectiveOptions& opts) {
  if (!options_.checked) return;
  const auto words = call.fingerprint();
  const at::Tensor mine = torch::tensor(std::vector<int64_t>(words.begin(), words.end()), torch::kInt64);
  const std::vector<at::Tensor> all = gather_on_control(mine, call, opts);
  bool same = true;
  for (const auto& theirs : all) same = same && torch::equal(theirs, all[0]);
  if (same) return;
  // Every rank saw the same fingerprints, so every rank takes this path: exchange descriptions.
  const std::string text = call.describe();
  const at::Tensor length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kInt64);
  int64_t longest = 0;
  for (const auto& l : gather_on_control(length, call, opts)) longest = std::max(longest, l.item<int64_t>());
  at::Tensor bytes = torch::zeros({longest}, torch::kUInt8);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  std::vector<std::string> per_rank;
  for (const auto& b : gather_on_control(bytes, call, opts)) {
    const std::string padded(reinterpret_cast<const char*>(b.data_ptr<uint8_t>()), static_cast<size_t>(longest));
    per_rank.push_back(padded.substr(0, padded.find('\0')));
  }
  throw CollectiveMismatch(options_.rank, std::move(per_rank));
}

std::vector<at::Tensor> CheckedGroup::gather_on_control(const at::Tensor& t, const CollectiveCall& call,
                                                        const CollectiveOptions& opts) {
  std::vector<at::Tensor> outputs;
  for (int r = 0; r < options_.size; ++r) outputs.push_back(torch::empty_like(t));
  auto work = control_->all_gather(outputs, t);
  finish(*work, call, opts);
  return outputs;
}

// A rank that dies is named within ~2 s (its beat stops), a rank that stalls when the timeout
// expires, counted from the last progress another rank published. After either the group is
// unusable (the transports are abandoned): the caller reports and exits.
void CheckedGroup::finish(TransportWork& work, const CollectiveCall& call, const CollectiveOptions& opts) {
  const auto timeout = timeout_of(opts);
  const auto start = Clock::now();
  auto last_check = start;
  Liveness::Watch watch(*liveness_);
  while (true) {
    try {
      if (work.wait_for(std::chrono::milliseconds(100))) return;
    } catch (const std::exception& e) {
      fail(call, e);
    }
    const auto now = Clock::now();
    if (now - std::max(start, watch.last_progress()) >= timeout) throw_timeout(call, timeout, watch.silent());
    if (now - last_check >= Liveness::kBeat) {  // a dead peer may leave the transport waiting forever
      last_check = now;
      const std::vector<int> dead = watch.check();
      if (!dead.empty()) {
        mark_failed(call);
        throw PeerLost(detail::concat(who(), ": ", call.describe(), " cannot finish: rank(s) ", ranks_text(dead),
                                      " died (no heartbeat for ", Liveness::kDeadAfter.count(),
                                      " ms, process gone); where every rank was:", liveness_->where_everyone_is()),
                       dead);
      }
    }
  }
}

// The ranks waited for: those whose last status shows them short of this collective, and those
// whose heartbeat has gone silent (a rank cut off by the network may have reached it just before).
void CheckedGroup::throw_timeout(const CollectiveCall& call, std::chrono::milliseconds timeout,
                                 const std::vector<int>& silent) {
  mark_failed(call);
  std::vector<int> waiting;
  const std::string where = liveness_->where_everyone_is(call.sequence, &waiting);
  waiting.insert(waiting.end(), silent.begin(), silent.end());
  std::sort(waiting.begin(), waiting.end());
  waiting.erase(std::unique(waiting.begin(), waiting.end()), waiting.end());
  const std::string no_beat =
      silent.empty() ? std::string()
                     : detail::concat("; no heartbeat from rank(s) ", ranks_text(silent), " for over ",
                                      Liveness::kDeadAfter.count(), " ms (stopped, or cut off from this rank)");
  throw CollectiveTimeout(
      detail::concat(who(), ": ", call.describe(), " timed out after ", timeout.count(), " ms",
                     waiting.empty() ? std::string() : " waiting for rank(s) " + ranks_text(waiting), no_beat,
                     "; where every rank is:", where),
      waiting);
}

// The transport gave up on `call` with `e`: typically a peer that closed its connection, or the
// backend's own (backstop) timer; name the ranks that are gone.
void CheckedGroup::fail(const CollectiveCall& call, const std::exception& e) {
  mark_failed(call);
  const std::vector<int> dead = liveness_->dead_ranks(std::chrono::milliseconds(2500));
  const std::string message = detail::concat(
      who(), ": ", call.describe(), " failed",
      dead.empty() ? std::string(": ") : detail::concat(" because rank(s) ", ranks_text(dead), " died: "), e.what(),
      "; where every rank was:", liveness_->where_everyone_is());
  if (!dead.empty()) throw PeerLost(message, dead);
  throw CollectiveFailure(message);
}

std::string CheckedGroup::ranks_text(const std::vector<int>& ranks) const {
  const auto& global = options_.global_ranks;
  std::vector<int> theirs;
  for (int r : ranks) {
    if (r >= 0 && r < static_cast<int>(global.size())) theirs.push_back(global[static_cast<size_t>(r)]);
  }
  if (theirs.size() != ranks.size() || theirs == ranks) return join(ranks);
  return detail::concat(join(ranks), theirs.size() == 1 ? " (global rank " : " (global ranks ", join(theirs), ")");
}

std::string CheckedGroup::who() const {
  const std::string rank = detail::concat("rank ", options_.rank, " of ", options_.size);
  return options_.name.empty() ? rank : detail::concat(rank, " (", options_.name, ")");
}

void CheckedGroup::mark_failed(const CollectiveCall& call) {
  {
    const std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failed_call_.empty()) failed_call_ = call.describe();
  }
  failed_ = true;
  control_->abandon();
  if (device_) device_->abandon();
}

void CheckedGroup::require_usable(const char* op, const CollectiveOptions& opts) const {
  if (!failed_) return;
  std::string failed_call;
  {
    const std::lock_guard<std::mutex> lock(failure_mutex_);
    failed_call = failed_call_;
  }
  throw CollectiveFailure(detail::concat(who(), ": ", op, " at ", opts.site.to_string(),
                                         " refused: this group is unusable since ", failed_call,
                                         " failed (ranks stopped at different points); make a new group"));
}

}  // namespace lockstep::dist
