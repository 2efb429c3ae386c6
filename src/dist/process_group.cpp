#include "lockstep/dist/process_group.h"

#include <torch/torch.h>

#include "lockstep/config_build.h"
#if LOCKSTEP_HAVE_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "liveness.h"
#include "work_wait.h"
#include "lockstep/dist/collective.h"

namespace lockstep::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, int fallback) {
  const auto v = env(name);
  if (!v) return fallback;
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LOCKSTEP_CHECK_ARG(used == v->size() && !v->empty(), "environment variable ", name, "='", *v,
                     "' is not an integer");
  return value;
}

#if LOCKSTEP_HAVE_GLOO
c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return c10d::ReduceOp::SUM;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// Tensors of one call travel as one flat buffer per dtype, in order of first appearance: Gloo's
// multi-tensor calls mean one tensor per device, all of one shape.
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

class ProcessGroup final : public Group {
 public:
  explicit ProcessGroup(const GroupOptions& options) : options_(options) {
    connect();
    connect_gloo();
    liveness_ = std::make_unique<Liveness>(store_, options_.rank, options_.size);
    liveness_->set_note("connected, no collective yet");
  }

  ~ProcessGroup() override {
    if (failed_ && options_.rank == 0 && options_.size > 1) std::this_thread::sleep_for(kStoreGrace);
    // After a failure an operation may still be pending, which Gloo's destructor would wait out
    // (up to its backstop timer): leave it, the process is about to report and exit.
    if (failed_) (void)gloo_.release();
  }

  void set_progress(const std::string& progress) override { liveness_->set_progress(progress); }

  // The stall report: who this rank waits for, and where everyone is.
  [[noreturn]] void throw_timeout(const CollectiveCall& call, std::chrono::milliseconds timeout, const char* detail_text) {
    failed_ = true;
    std::vector<int> waiting;
    const std::string where = liveness_->where_everyone_is(call.sequence, &waiting);
    throw CollectiveFailure(detail::concat("rank ", options_.rank, " of ", options_.size, ": ", call.describe(),
                                           " timed out after ", timeout.count(), " ms",
                                           waiting.empty() ? std::string() : " waiting for rank(s) " + join(waiting),
                                           detail_text, "; where every rank is:", where));
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string describe() const override {
    return detail::concat("gloo, rank ", options_.rank, " of ", options_.size, " via ", options_.master_addr, ":",
                          options_.master_port);
  }

  void all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op, const CollectiveOptions& opts) override {
    all_reduce_async(tensors, op, opts)->wait();
  }

  // The fingerprint exchange happens now; the data moves on Gloo's worker threads until wait().
  std::unique_ptr<PendingCollective> all_reduce_async(std::vector<at::Tensor>& tensors, ReduceOp op,
                                                      const CollectiveOptions& opts) override {
    std::lock_guard<std::mutex> lock(mutex_);  // collectives are issued one at a time, in order
    auto pending = std::make_unique<Pending>(*this, tensors, opts);
    pending->call = CollectiveCall::of(++sequence_, CollectiveOp::AllReduce, tensors, opts.site, phase(), op);
    enter(pending->call);
    agree(pending->call, opts);
    if (tensors.empty()) return pending;
    pending->packed = pack(tensors);
    for (auto& buffer : pending->packed.buffers) {
      std::vector<at::Tensor> one{buffer};
      c10d::AllreduceOptions o;
      o.reduceOp = to_c10d(op);
      o.timeout = backend_timeout(timeout_of(opts));
      pending->works.push_back(gloo_->allreduce(one, o));
    }
    return pending;
  }

  std::vector<at::Tensor> all_gather(const at::Tensor& input, const CollectiveOptions& opts) override {
    std::lock_guard<std::mutex> lock(mutex_);  // one collective at a time, in issue order
    const CollectiveCall call = CollectiveCall::of(++sequence_, CollectiveOp::AllGather, {input}, opts.site, phase());
    enter(call);
    agree(call, opts);
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < options_.size; ++r) outputs[0].push_back(torch::empty_like(input, at::MemoryFormat::Contiguous));
    std::vector<at::Tensor> inputs{input.contiguous()};
    c10d::AllgatherOptions o;
    o.timeout = backend_timeout(timeout_of(opts));
    finish(gloo_->allgather(outputs, inputs, o), call, opts);
    leave(call);
    return outputs[0];
  }

  void broadcast(std::vector<at::Tensor>& tensors, int root, const CollectiveOptions& opts) override {
    std::lock_guard<std::mutex> lock(mutex_);  // one collective at a time, in issue order
    LOCKSTEP_CHECK_ARG(root >= 0 && root < options_.size, "broadcast at ", opts.site.to_string(), ": root ", root,
                       " is not a rank of a group of size ", options_.size);
    const CollectiveCall call =
        CollectiveCall::of(++sequence_, CollectiveOp::Broadcast, tensors, opts.site, phase(), ReduceOp::Sum, root);
    enter(call);
    agree(call, opts);
    if (tensors.empty()) return leave(call);
    Packed packed = pack(tensors);
    for (auto& buffer : packed.buffers) {
      std::vector<at::Tensor> one{buffer};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.timeout = backend_timeout(timeout_of(opts));
      finish(gloo_->broadcast(one, o), call, opts);
    }
    unpack(packed, tensors);
    leave(call);
  }

  // The fingerprint exchange is itself a barrier.
  void barrier(const CollectiveOptions& opts) override {
    std::lock_guard<std::mutex> lock(mutex_);  // one collective at a time, in issue order
    const CollectiveCall call = CollectiveCall::of(++sequence_, CollectiveOp::Barrier, {}, opts.site, phase());
    enter(call);
    agree(call, opts);
    leave(call);
  }

 private:
  struct Pending final : public PendingCollective {
    Pending(ProcessGroup& g, std::vector<at::Tensor>& t, const CollectiveOptions& o) : group(g), tensors(t), opts(o) {}
    void wait() override {
      for (auto& work : works) group.finish(work, call, opts);
      if (!tensors.empty()) unpack(packed, tensors);
      group.leave(call);
    }
    ProcessGroup& group;
    std::vector<at::Tensor>& tensors;
    CollectiveOptions opts;
    CollectiveCall call;
    Packed packed;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
  };

  // What the heartbeat publishes: the current collective, else the last one completed.
  void enter(const CollectiveCall& call) { liveness_->enter(call); }
  void leave(const CollectiveCall& call) { liveness_->leave(call); }

  std::chrono::milliseconds timeout_of(const CollectiveOptions& opts) const {
    return opts.timeout.count() > 0 ? opts.timeout : options_.timeout;
  }
  // Gloo's own timer, a backstop only: finish() enforces the timeout, counted from the last progress
  // another rank published, so an operation may wait longer than `timeout` while ranks still work.
  static std::chrono::milliseconds backend_timeout(std::chrono::milliseconds timeout) {
    return std::max<std::chrono::milliseconds>(timeout * 10, std::chrono::hours(1));
  }

  // GLOO_SOCKET_IFNAME as in PyTorch; else loopback masters keep every rank on 127.0.0.1, and
  // otherwise Gloo binds to this host's address.
  std::shared_ptr<::gloo::transport::Device> device() const {
    if (const auto name = env("GLOO_SOCKET_IFNAME")) return c10d::ProcessGroupGloo::createDeviceForInterface(*name);
    const std::string& m = options_.master_addr;
    if (m == "127.0.0.1" || m == "localhost") return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }

  // Gloo's own timer is only a backstop (finish() enforces the timeout, counted from the last
  // progress another rank published), but connecting every pair must still end within
  // connect_timeout: the connection runs on a helper thread that is abandoned when it takes longer
  // (the process reports and exits).
  void connect_gloo() {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(backend_timeout(options_.timeout));
    gloo_options->devices.push_back(device());
    using Gloo = c10::intrusive_ptr<c10d::ProcessGroupGloo>;
    auto made = std::make_shared<std::promise<Gloo>>();
    std::future<Gloo> result = made->get_future();
    std::thread([made, store = c10::make_intrusive<c10d::PrefixStore>("gloo", store_), rank = options_.rank,
                 size = options_.size, gloo_options] {
      try {
        made->set_value(c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options));
      } catch (...) {
        made->set_exception(std::current_exception());
      }
    }).detach();
    LOCKSTEP_THROW_IF_NOT(result.wait_for(options_.connect_timeout) == std::future_status::ready, CollectiveFailure,
                          "rank ", options_.rank, " of ", options_.size, ": Gloo could not connect to every other ",
                          "rank within ", options_.connect_timeout.count(),
                          " ms (did a rank die while connecting, or does a firewall block the ports?)");
    gloo_ = result.get();
  }

  // Rank 0 hosts the store; everyone announces itself and waits for the rest, so that a rank that
  // never arrives is named instead of a bare socket timeout.
  void connect() {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(options_.master_port);
    o.isServer = options_.rank == 0;
    o.numWorkers = options_.size;
    o.waitWorkers = false;
    o.timeout = options_.connect_timeout;
    int listening_port = 0;
    try {
      auto tcp = c10::make_intrusive<c10d::TCPStore>(options_.master_addr, o);
      listening_port = tcp->getPort();
      store_ = tcp;
    } catch (const std::exception& e) {
      throw CollectiveFailure(detail::concat("rank ", options_.rank, " of ", options_.size,
                                             ": cannot reach the master's store at ", options_.master_addr, ":",
                                             options_.master_port, " within ", options_.connect_timeout.count(),
                                             " ms: ", e.what()));
    }
    if (options_.rank == 0) {
      options_.master_port = listening_port;  // the kernel's choice when 0 was asked for
      if (options_.on_listening) options_.on_listening(options_.master_port);
    }
    const int64_t claims = store_->add(detail::concat("lockstep/claim/", options_.rank), 1);
    store_->set(detail::concat("lockstep/world/", options_.rank), to_bytes(std::to_string(options_.size)));
    LOCKSTEP_THROW_IF_NOT(claims == 1, CollectiveFailure, "rank ", options_.rank, " of ", options_.size,
                          ": another process already joined as rank ", options_.rank,
                          " (check RANK / --node-rank on every process)");
    const auto deadline = Clock::now() + options_.connect_timeout;
    std::vector<std::string> missing;
    while (true) {
      missing.clear();
      for (int r = 0; r < options_.size; ++r) {
        if (!store_->check({detail::concat("lockstep/world/", r)})) missing.push_back(std::to_string(r));
      }
      if (missing.empty() || Clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    LOCKSTEP_THROW_IF_NOT(missing.empty(), CollectiveFailure, "rank ", options_.rank, " of ", options_.size,
                          ": rank(s) ", detail::concat_list(missing), " did not arrive at ", options_.master_addr, ":",
                          options_.master_port, " within ", options_.connect_timeout.count(), " ms");
    for (int r = 0; r < options_.size; ++r) {
      const auto v = store_->get(detail::concat("lockstep/world/", r));
      const std::string theirs(v.begin(), v.end());
      LOCKSTEP_THROW_IF_NOT(theirs == std::to_string(options_.size), CollectiveFailure, "rank ", options_.rank,
                            " has WORLD_SIZE ", options_.size, " but rank ", r, " has WORLD_SIZE ", theirs);
    }
  }

  static std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

  // G1: exchange fingerprints (fixed size, so the exchange itself can never mismatch) and raise
  // CollectiveMismatch on every rank when they differ, naming each rank's call.
  void agree(const CollectiveCall& call, const CollectiveOptions& opts) {
    if (!options_.checked) {
      if (call.op == CollectiveOp::Barrier) finish(gloo_->barrier(), call, opts);
      return;
    }
    const auto words = call.fingerprint();
    at::Tensor mine = torch::tensor(std::vector<int64_t>(words.begin(), words.end()), torch::kInt64);
    const std::vector<at::Tensor> all = gather_raw(mine, call, opts);
    bool same = true;
    for (const auto& theirs : all) same = same && torch::equal(theirs, all[0]);
    if (same) return;
    // Every rank saw the same fingerprints, so every rank takes this path: exchange descriptions.
    const std::string text = call.describe();
    const at::Tensor length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kInt64);
    int64_t longest = 0;
    for (const auto& l : gather_raw(length, call, opts)) longest = std::max(longest, l.item<int64_t>());
    at::Tensor bytes = torch::zeros({longest}, torch::kUInt8);
    std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
    std::vector<std::string> per_rank;
    for (const auto& b : gather_raw(bytes, call, opts)) {
      const std::string padded(reinterpret_cast<const char*>(b.data_ptr<uint8_t>()), static_cast<size_t>(longest));
      per_rank.push_back(padded.substr(0, padded.find('\0')));
    }
    throw CollectiveMismatch(options_.rank, std::move(per_rank));
  }

  std::vector<at::Tensor> gather_raw(const at::Tensor& t, const CollectiveCall& call, const CollectiveOptions& opts) {
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < options_.size; ++r) outputs[0].push_back(torch::empty_like(t));
    std::vector<at::Tensor> inputs{t};
    c10d::AllgatherOptions o;
    o.timeout = backend_timeout(timeout_of(opts));
    finish(gloo_->allgather(outputs, inputs, o), call, opts);
    return outputs[0];
  }

  // Waits for `work` in slices: a rank that dies is named within ~2 s (its beat stops), a rank that
  // stalls is named when the timeout expires, with where every rank is. After either the group is
  // unusable (Gloo cannot cancel the operation): the caller reports and exits.
  void finish(const c10::intrusive_ptr<c10d::Work>& work, const CollectiveCall& call, const CollectiveOptions& opts) {
    const auto timeout = timeout_of(opts);
    const auto start = Clock::now();
    auto last_check = start;
    Liveness::Watch watch(*liveness_);
    while (true) {
      try {
        if (wait_slice(*work, std::chrono::milliseconds(100)) == SliceResult::Done) return;
      } catch (const std::exception& e) {
        fail(call, e, start, timeout);
      }
      const auto now = Clock::now();
      // The timeout runs from the last sign of work on another rank: a stall is `timeout` without any.
      if (now - std::max(start, watch.last_progress()) >= timeout) throw_timeout(call, timeout, "");
      if (now - last_check >= Liveness::kBeat) {  // a dead peer may leave Gloo waiting forever
        last_check = now;
        const std::vector<int> dead = watch.check();
        if (!dead.empty()) {
          failed_ = true;
          throw CollectiveFailure(detail::concat("rank ", options_.rank, " of ", options_.size, ": ", call.describe(),
                                                 " cannot finish: rank(s) ", join(dead), " died (no heartbeat for ",
                                                 Liveness::kDeadAfter.count(),
                                                 " ms, process gone); where every rank was:",
                                                 liveness_->where_everyone_is()));
        }
      }
    }
  }

  // The backend gave up on `call` with `e`: its own timer (the backstop) or, typically, a peer that
  // closed its connection; report which, naming the ranks that are gone.
  [[noreturn]] void fail(const CollectiveCall& call, const std::exception& e, Clock::time_point start,
                         std::chrono::milliseconds timeout) {
    failed_ = true;
    if (Clock::now() - start >= backend_timeout(timeout) - std::chrono::milliseconds(200)) {
      throw_timeout(call, timeout, "");
    }
    const std::vector<int> dead = liveness_->dead_ranks(std::chrono::milliseconds(2500));
    throw CollectiveFailure(detail::concat(
        "rank ", options_.rank, " of ", options_.size, ": ", call.describe(), " failed",
        dead.empty() ? std::string(": ") : detail::concat(" because rank(s) ", join(dead), " died: "), e.what(),
        "; where every rank was:", liveness_->where_everyone_is()));
  }

  static std::string join(const std::vector<int>& ranks) {
    std::vector<std::string> names;
    for (int r : ranks) names.push_back(std::to_string(r));
    return detail::concat_list(names);
  }

  // After a failure the others read statuses from rank 0's store for their reports: rank 0 keeps
  // it up this long on destruction.
  static constexpr std::chrono::milliseconds kStoreGrace{2000};
  bool failed_ = false;  // a collective failed: the group is unusable

  GroupOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_;
  uint64_t sequence_ = 0;
  std::mutex mutex_;
  std::unique_ptr<Liveness> liveness_;
};
#endif  // LOCKSTEP_HAVE_GLOO

}  // namespace

bool GroupOptions::environment_has_ranks() { return env("WORLD_SIZE").has_value() || env("RANK").has_value(); }

GroupOptions GroupOptions::from_environment() {
  GroupOptions o;
  o.size = env_int("WORLD_SIZE", 1);
  o.rank = env_int("RANK", 0);
  o.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
  o.master_port = env_int("MASTER_PORT", 29500);
  LOCKSTEP_CHECK_ARG(o.size >= 1, "environment variable WORLD_SIZE=", o.size, " must be >= 1");
  LOCKSTEP_CHECK_ARG(o.rank >= 0 && o.rank < o.size, "environment variable RANK=", o.rank,
                     " must lie in [0, WORLD_SIZE=", o.size, ")");
  const int local_size = env_int("LOCAL_WORLD_SIZE", -1);
  const int local_rank = env_int("LOCAL_RANK", -1);
  if (local_size != -1) {
    LOCKSTEP_CHECK_ARG(local_size >= 1 && local_size <= o.size, "environment variable LOCAL_WORLD_SIZE=", local_size,
                       " must lie in [1, WORLD_SIZE=", o.size, "]");
  }
  if (local_rank != -1) {
    const int bound = local_size != -1 ? local_size : o.size;
    LOCKSTEP_CHECK_ARG(local_rank >= 0 && local_rank < bound, "environment variable LOCAL_RANK=", local_rank,
                       " must lie in [0, ", local_size != -1 ? "LOCAL_WORLD_SIZE=" : "WORLD_SIZE=", bound, ")");
  }
  o.validate();
  return o;
}

void GroupOptions::validate() const {
  LOCKSTEP_CHECK_ARG(size >= 1, "group size ", size, " must be >= 1");
  LOCKSTEP_CHECK_ARG(rank >= 0 && rank < size, "rank ", rank, " must lie in [0, ", size, ")");
  LOCKSTEP_CHECK_ARG(master_port >= 0 && master_port <= 65535, "master port ", master_port,
                     " must lie in [0, 65535]");
  LOCKSTEP_CHECK_ARG(master_port != 0 || rank == 0, "rank ", rank, " needs the port of rank 0's store; port 0 ",
                     "(any free port) is for rank 0 alone, which then says the port it got");
  LOCKSTEP_CHECK_ARG(!master_addr.empty(), "the master address is empty");
  LOCKSTEP_CHECK_ARG(timeout.count() > 0, "collective timeout ", timeout.count(), " ms must be positive");
  LOCKSTEP_CHECK_ARG(connect_timeout >= std::chrono::seconds(1), "connect timeout ", connect_timeout.count(),
                     " ms must be at least 1000 ms (TCPStore counts whole seconds)");
}

std::shared_ptr<Group> make_process_group(const GroupOptions& options) {
  options.validate();
#if LOCKSTEP_HAVE_GLOO
  return std::make_shared<ProcessGroup>(options);
#else
  throw InvalidArgument(detail::concat("rank ", options.rank, " of ", options.size, ": this build of lockstep has no ",
                                       "Gloo (its headers were not found at configure time: install libgloo-dev)"));
#endif
}

}  // namespace lockstep::dist
