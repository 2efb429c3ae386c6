#include "checked_group.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <map>
#include <optional>
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

// What every rank acts on after an exchange of fingerprints: how many calls agree from the first on,
// and whether the one after them differs on some rank.
struct Verdict {
  size_t agreed = 0;
  bool differs = false;
};

// From every rank's message ([count, fingerprints...], words_per_call words each): the fewest offered,
// cut at the first call whose fingerprint is not the same on every rank.
Verdict judge(const std::vector<at::Tensor>& all, size_t words_per_call) {
  size_t offered = std::numeric_limits<size_t>::max();
  for (const auto& theirs : all) offered = std::min(offered, static_cast<size_t>(theirs.data_ptr<int64_t>()[0]));
  const int64_t* first = all[0].data_ptr<int64_t>() + 1;
  for (size_t i = 0; i < offered; ++i) {
    for (const auto& theirs : all) {
      const int64_t* words = theirs.data_ptr<int64_t>() + 1 + i * words_per_call;
      if (!std::equal(words, words + words_per_call, first + i * words_per_call)) return {i, true};
    }
  }
  return {offered, false};
}

// An all_gather over Gloo's ring takes W - 1 hops; a gather to one rank then its binomial-tree broadcast
// 1 + ceil(log2 W). At 2 ranks the ring's one hop is one operation instead of two; from 3 on the root
// is faster (docs/distributed.md: a checked barrier at 4 ranks 3.1 -> 0.9 ms, at 64 147 -> 5.6 ms).
bool agree_through_root(int size) { return size > 2; }

}  // namespace

// An all_reduce on its way: checked and issued in its turn, on the group's worker when the caller
// goes on computing (all_reduce_async) or at once on the caller's thread (all_reduce), its data moving
// until wait().
class CheckedGroup::Pending final : public PendingCollective {
 public:
  Pending(CheckedGroup& group, std::vector<at::Tensor>& tensors, const CollectiveOptions& opts)
      : group_(group), tensors_(tensors), opts_(opts), issue_(std::make_shared<Issue>()) {}

  void wait() override {
    if (turn_) group_.order_.wait_for_turn(*turn_);
    {
      std::unique_lock<std::mutex> lock(issue_->mutex);
      issue_->issued.wait(lock, [&] { return issue_->done; });
    }
    if (issue_->error) std::rethrow_exception(issue_->error);
    for (auto& work : issue_->works) group_.finish(*work, issue_->call, opts_);
    if (!tensors_.empty()) unpack(packed_, tensors_);
    group_.liveness_->leave(issue_->call);
  }

 private:
  friend class CheckedGroup;
  // What the turn hands the waiter; shared, since a posted turn may outlive an abandoned Pending.
  struct Issue {
    std::mutex mutex;
    std::condition_variable issued;
    bool done = false;
    std::exception_ptr error;
    CollectiveCall call;
    std::vector<std::unique_ptr<TransportWork>> works;
  };
  CheckedGroup& group_;
  std::vector<at::Tensor>& tensors_;
  CollectiveOptions opts_;
  Packed packed_;
  std::shared_ptr<Issue> issue_;
  std::optional<uint64_t> turn_;  // posted: its turn in the group's order
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
  start_all_reduce(tensors, op, opts, /*on_worker=*/false)->wait();
}

std::unique_ptr<PendingCollective> CheckedGroup::all_reduce_async(std::vector<at::Tensor>& tensors, ReduceOp op,
                                                                  const CollectiveOptions& opts) {
  return start_all_reduce(tensors, op, opts, /*on_worker=*/true);
}

// The data is packed now, on the caller's thread (and its stream); the turn agrees and issues it.
// On the worker, a device transport issues on the caller's stream, so that it follows what the caller
// queued before the call, and no host thread waits for the device.
std::unique_ptr<CheckedGroup::Pending> CheckedGroup::start_all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op,
                                                                      const CollectiveOptions& opts, bool on_worker) {
  require_usable("all_reduce", opts);
  Transport& transport = transport_for(tensors, "all_reduce", opts);
  auto pending = std::make_unique<Pending>(*this, tensors, opts);
  std::shared_ptr<Pending::Issue> issue = pending->issue_;
  issue->call = CollectiveCall::of(0, CollectiveOp::AllReduce, tensors, opts.site, phase(), op);
  if (!tensors.empty()) pending->packed_ = pack(tensors);
  std::optional<c10::Stream> stream;
  if (!tensors.empty() && !tensors[0].is_cpu())
    stream = c10::impl::VirtualGuardImpl(tensors[0].device().type()).getStream(tensors[0].device());
  auto turn = [this, issue, &transport, buffers = pending->packed_.buffers, op, opts, stream]() mutable {
    std::exception_ptr error;
    try {
      std::optional<c10::StreamGuard> on_callers_stream;
      if (stream) on_callers_stream.emplace(*stream);
      require_usable("all_reduce", opts);
      issue->call.sequence = ++sequence_;
      liveness_->enter(issue->call);
      agree(issue->call, opts);
      for (auto& buffer : buffers) issue->works.push_back(transport.all_reduce(buffer, op));
    } catch (...) {
      error = std::current_exception();
    }
    {
      const std::lock_guard<std::mutex> lock(issue->mutex);
      issue->error = error;
      issue->done = true;
    }
    issue->issued.notify_all();
  };
  if (on_worker) {
    // Issued at once on this thread when nothing is queued and the call matches the prediction: no
    // exchange to wait for, so no reason to wake the worker.
    const auto ran_here = order_.run_if_idle([&] {
      CollectiveCall probe = issue->call;
      probe.sequence = sequence_ + 1;
      Predictor::Fingerprint fingerprint;
      if (failed_ || !options_.checked || !options_.predict ||
          compare_with_prediction(probe, fingerprint) != Expected::Matches)
        return false;
      turn();
      return true;
    });
    if (!ran_here) pending->turn_ = order_.post(std::move(turn));
  } else {
    order_.run(turn);
  }
  return pending;
}

std::vector<at::Tensor> CheckedGroup::all_gather(const at::Tensor& input, const CollectiveOptions& opts) {
  std::vector<at::Tensor> outputs;
  order_.run([&] {
    require_usable("all_gather", opts);
    Transport& transport = transport_for({input}, "all_gather", opts);
    CollectiveCall call = CollectiveCall::of(++sequence_, CollectiveOp::AllGather, {input}, opts.site, phase());
    liveness_->enter(call);
    agree(call, opts);
    for (int r = 0; r < options_.size; ++r) outputs.push_back(torch::empty_like(input, at::MemoryFormat::Contiguous));
    auto work = transport.all_gather(outputs, input.contiguous());
    finish(*work, call, opts);
    liveness_->leave(call);
  });
  return outputs;
}

void CheckedGroup::broadcast(std::vector<at::Tensor>& tensors, int root, const CollectiveOptions& opts) {
  order_.run([&] {
    require_usable("broadcast", opts);
    LOCKSTEP_CHECK_ARG(root >= 0 && root < options_.size, "broadcast at ", opts.site.to_string(), ": root ", root,
                       " is not a rank of a group of size ", options_.size);
    Transport& transport = transport_for(tensors, "broadcast", opts);
    CollectiveCall call =
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
  });
}

// The fingerprint exchange is itself a barrier (never predicted); unchecked, an empty all_reduce stands in for it.
void CheckedGroup::barrier(const CollectiveOptions& opts) {
  order_.run([&] {
    require_usable("barrier", opts);
    CollectiveCall call = CollectiveCall::of(++sequence_, CollectiveOp::Barrier, {}, opts.site, phase());
    liveness_->enter(call);
    agree(call, opts);
    if (!options_.checked) {
      at::Tensor token = torch::zeros({1}, torch::kInt64);
      auto work = control_->all_reduce(token, ReduceOp::Sum);
      finish(*work, call, opts);
    }
    liveness_->leave(call);
  });
}

void CheckedGroup::check_foreign(const std::string& op, const std::vector<at::Tensor>& tensors,
                                 const CollectiveOptions& opts, bool compare_site) {
  CollectiveCall call = CollectiveCall::of(0, CollectiveOp::Foreign, tensors, opts.site, phase());
  call.foreign = op;
  call.compare_site = compare_site;
  call.watched = false;  // its caller runs the collective: no prediction
  order_.run([&] { check_in_turn(call, opts); });
}

void CheckedGroup::check_in_turn(CollectiveCall& call, const CollectiveOptions& opts) {
  require_usable(call.foreign.c_str(), opts);
  call.sequence = ++sequence_;
  liveness_->enter(call);
  agree(call, opts);
  liveness_->leave(call);
}

// A check posted by check_foreign_then: described when it is posted (the tensors' specs, the phase),
// agreed on in its turn. The site's strings travel with it, since the caller's may be gone by then.
struct CheckedGroup::PostedCheck {
  std::string tag, file;
  CollectiveCall call;
  WatchedThen then;
  uint64_t turn = 0;  // its number in order_
  bool done = false;  // agreed on (and issued) in an earlier check's turn
};

uint64_t CheckedGroup::check_foreign_then(const std::string& op, const std::vector<at::Tensor>& tensors,
                                          const std::string& tag, const std::string& file, int line, bool compare_site,
                                          std::function<void(std::exception_ptr)> then) {
  return post_check(
      op, tensors, tag, file, line, compare_site, false,
      [then = std::move(then)](std::exception_ptr error, std::shared_ptr<const CollectiveCall>) { then(error); });
}

uint64_t CheckedGroup::check_foreign_then_watched(const std::string& op, const std::vector<at::Tensor>& tensors,
                                                  const std::string& tag, const std::string& file, int line,
                                                  bool compare_site, WatchedThen then) {
  return post_check(op, tensors, tag, file, line, compare_site, true, std::move(then));
}

uint64_t CheckedGroup::post_check(const std::string& op, const std::vector<at::Tensor>& tensors, const std::string& tag,
                                  const std::string& file, int line, bool compare_site, bool watched,
                                  WatchedThen then) {
  auto check = std::make_shared<PostedCheck>();
  check->tag = tag;
  check->file = file;
  check->call = CollectiveCall::of(0, CollectiveOp::Foreign, tensors,
                                   CallSite{check->tag.c_str(), check->file.c_str(), line}, phase());
  check->call.foreign = op;
  check->call.compare_site = compare_site;
  check->call.watched = watched;
  check->then = std::move(then);
  // A check that passes on the prediction is done at once on this thread when nothing is queued before
  // it: no exchange to wait for, so no reason to wake the worker (and be woken back).
  if (watched && options_.checked && options_.predict) {
    if (const auto turn = order_.run_if_idle([&] { return issue_on_prediction(check); })) return *turn;
  }
  // Queued and numbered under checks_mutex_, which its turn takes first: it finds itself in checks_.
  const std::lock_guard<std::mutex> lock(checks_mutex_);
  check->turn = order_.post([this, check] { check_window(check); });
  checks_.push_back(check);
  return check->turn;
}

// In a turn of its own on the caller's thread: issues a posted check that matches the prediction; anything
// else (no prediction, a departure, a failed group) is left to its turn on the worker.
bool CheckedGroup::issue_on_prediction(const std::shared_ptr<PostedCheck>& check) {
  if (failed_) return false;
  check->call.sequence = sequence_ + 1;
  Predictor::Fingerprint fingerprint;
  if (compare_with_prediction(check->call, fingerprint) != Expected::Matches) return false;
  ++sequence_;
  // The status keeps the call inside its check (which owns the site's strings), described only if read.
  const std::shared_ptr<const CollectiveCall> call(check, &check->call);
  accept_prediction(check->call, fingerprint, call);
  check->done = true;
  // Moved out: kept by the status, the check must not keep what `then` holds (the Work, the tensors).
  const WatchedThen then = std::move(check->then);
  then(nullptr, call);
  return true;
}

void CheckedGroup::check_window(const std::shared_ptr<PostedCheck>& first) {
  std::vector<std::shared_ptr<PostedCheck>> window;
  {
    const std::lock_guard<std::mutex> lock(checks_mutex_);
    if (first->done) return;
    // checks_ holds no check before `first`: each was agreed on in its turn or in an earlier window.
    for (const auto& next : checks_) {
      if (window.size() == (options_.checked ? kWindow : 1) || next->turn != first->turn + window.size()) break;
      window.push_back(next);
    }
  }
  std::vector<CollectiveCall> calls;
  for (size_t i = 0; i < window.size(); ++i) {
    calls.push_back(window[i]->call);
    calls.back().sequence = sequence_ + 1 + i;
  }
  const CollectiveOptions opts(calls[0].site);
  size_t agreed = 0;
  std::exception_ptr error;
  try {
    require_usable(calls[0].foreign.c_str(), opts);
    liveness_->enter(calls[0]);
    bool differs = false;
    agreed = agree_on_window(calls, opts, differs);
    // The checks after `agreed` that not every rank had queued yet wait for their own turns.
    if (differs) throw_mismatch(calls[agreed], opts);
  } catch (...) {
    error = std::current_exception();
  }
  // Issued in order: the agreed ones, then the one that failed (its error), if any.
  const size_t issued = error ? agreed + 1 : agreed;
  sequence_ += issued;
  if (agreed > 0) liveness_->leave(calls[agreed - 1]);
  {
    const std::lock_guard<std::mutex> lock(checks_mutex_);
    for (size_t i = 0; i < issued && i < window.size(); ++i) {
      window[i]->done = true;
      checks_.pop_front();
    }
  }
  for (size_t i = 0; i < issued && i < window.size(); ++i) {
    window[i]->call = calls[i];  // its sequence number, and whether it passed on the prediction
    const bool predicted = i < agreed && calls[i].predicted;
    window[i]->then(i < agreed ? nullptr : error,
                    predicted ? std::shared_ptr<const CollectiveCall>(window[i], &window[i]->call) : nullptr);
  }
}

void check_foreign_collective(Group& group, const std::string& op, const std::vector<at::Tensor>& tensors,
                              const CollectiveOptions& opts, bool compare_site) {
  if (auto* checked = dynamic_cast<CheckedGroup*>(&group))
    return checked->check_foreign(op, tensors, opts, compare_site);
  LOCKSTEP_CHECK_ARG(group.size() == 1, "rank ", group.rank(), ": ", op, " at ", opts.site.to_string(),
                     " cannot be checked on ", group.describe(), ", which is not a checked group");
}

// Fingerprints are of fixed size, so the exchange itself can never mismatch.
void CheckedGroup::agree(CollectiveCall& call, const CollectiveOptions& opts) {
  std::vector<CollectiveCall> calls{call};
  bool differs = false;
  agree_on_window(calls, opts, differs);
  if (differs) throw_mismatch(call, opts);
  call.predicted = calls[0].predicted;
}

// One exchange of a message of fixed size, whatever each rank offers (a rank's own collective, one
// check or a window of them): [count, kWindow fingerprints, the unused ones zero]. Every rank acts on
// the fewest offered, up to the first that differs, which every rank finds at the same place: beyond
// 2 ranks, rank 0 judges every rank's message and broadcasts its verdict (log2 W hops, not W - 1).
size_t CheckedGroup::agree_on_window(std::vector<CollectiveCall>& calls, const CollectiveOptions& opts, bool& differs) {
  differs = false;
  if (!options_.checked) return calls.size();
  if (options_.predict) {
    const size_t predicted = agree_on_prediction(calls, opts);
    if (predicted > 0) return predicted;
  }
  const size_t agreed = exchange_fingerprints(calls, opts, differs);
  for (size_t i = 0; i < agreed; ++i) predictor_.record(calls[i].fingerprint());
  return agreed;
}

size_t CheckedGroup::exchange_fingerprints(const std::vector<CollectiveCall>& calls, const CollectiveOptions& opts,
                                           bool& differs) {
  constexpr size_t kWords = CollectiveCall::kWords;
  at::Tensor mine = torch::zeros({static_cast<int64_t>(1 + kWindow * kWords)}, torch::kInt64);
  int64_t* words = mine.data_ptr<int64_t>();
  words[0] = static_cast<int64_t>(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto fingerprint = calls[i].fingerprint();
    std::copy(fingerprint.begin(), fingerprint.end(), words + 1 + i * kWords);
  }
  if (!agree_through_root(options_.size)) {
    const Verdict verdict = judge(gather_on_control(mine, calls[0], opts), kWords);
    differs = verdict.differs;
    return verdict.agreed;
  }
  std::vector<at::Tensor> all;
  if (options_.rank == 0) {
    for (int r = 0; r < options_.size; ++r) all.push_back(torch::empty_like(mine));
  }
  auto gathered = control_->gather(all, mine, 0);
  finish(*gathered, calls[0], opts);
  at::Tensor verdict = torch::zeros({2}, torch::kInt64);
  if (options_.rank == 0) {
    const Verdict v = judge(all, kWords);
    verdict[0] = static_cast<int64_t>(v.agreed);
    verdict[1] = v.differs ? 1 : 0;
  }
  auto told = control_->broadcast(verdict, 0);
  finish(*told, calls[0], opts);
  differs = verdict[1].item<int64_t>() != 0;
  return static_cast<size_t>(verdict[0].item<int64_t>());
}

// Every rank saw the same fingerprints, so every rank takes this path: exchange descriptions.
void CheckedGroup::throw_mismatch(const CollectiveCall& call, const CollectiveOptions& opts) {
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
bool CheckedGroup::finish(TransportWork& work, const CollectiveCall& call, const CollectiveOptions& opts,
                          std::optional<std::chrono::milliseconds> limit) {
  const auto timeout = timeout_of(opts);
  const auto start = Clock::now();
  auto last_check = start;
  Liveness::Watch watch(*liveness_);
  while (true) {
    try {
      if (work.wait_for(std::chrono::milliseconds(100))) return true;
    } catch (const std::exception& e) {
      // A rank that departed from the prediction reports, raises and may exit (closing its connections)
      // before this rank's heartbeat read its departure: the departure is what happened.
      if (call.predicted) {
        liveness_->read_departure();
        check_departure(call, opts);
      }
      fail(call, e);
    }
    if (call.predicted) check_departure(call, opts);
    const auto now = Clock::now();
    if (limit && now - start >= *limit) return false;
    const auto quiet = now - std::max(start, watch.last_progress());
    if (quiet >= timeout) throw_timeout(call, timeout, watch.silent());
    if (now - last_check >= Liveness::kBeat) {  // a dead peer may leave the transport waiting forever
      last_check = now;
      const std::vector<int> dead = watch.check(quiet + Liveness::kEveryoneBeforeTimeout >= timeout);
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
