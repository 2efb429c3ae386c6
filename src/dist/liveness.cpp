#include "liveness.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::dist {
namespace {

std::string status_key(int rank) { return detail::concat("lockstep/status/", rank); }
std::string process_key(int rank) { return detail::concat("lockstep/proc/", rank); }
std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

Liveness::Liveness(c10::intrusive_ptr<c10d::Store> store, int rank, int size)
    : store_(std::move(store)), rank_(rank), size_(size) {
  store_->set(process_key(rank_), to_bytes(detail::concat(host_name(), "|", ::getpid())));
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

Liveness::~Liveness() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Liveness::set_progress(const std::string& progress) {
  std::lock_guard<std::mutex> lock(where_mutex_);
  progress_ = progress;
}

void Liveness::set_note(const std::string& note) {
  std::lock_guard<std::mutex> lock(where_mutex_);
  where_ = note;
}

void Liveness::enter(const CollectiveCall& call) {
  std::lock_guard<std::mutex> lock(where_mutex_);
  inside_ = true;
  where_sequence_ = call.sequence;
  where_ = call.describe();
}

void Liveness::leave(const CollectiveCall& call) {
  std::lock_guard<std::mutex> lock(where_mutex_);
  inside_ = false;
  where_sequence_ = call.sequence;
  where_ = call.describe();
}

// "<beat>|<sequence>|<1 inside, 0 after>|<progress>, in|after <collective>".
std::string Liveness::status_value(uint64_t beat) {
  std::lock_guard<std::mutex> lock(where_mutex_);
  std::string text = progress_.empty() ? "" : progress_ + ", ";
  text += where_sequence_ == 0 ? where_ : (inside_ ? "in " : "after ") + where_;
  return detail::concat(beat, "|", where_sequence_, "|", inside_ ? 1 : 0, "|", text);
}

void Liveness::heartbeat_loop() {
  uint64_t beat = 0;
  std::unique_lock<std::mutex> lock(stop_mutex_);
  while (!stopping_) {
    try {
      store_->set(status_key(rank_), to_bytes(status_value(++beat)));
    } catch (const std::exception&) {
      // The store (rank 0) is gone; the collective that notices says so.
    }
    stop_cv_.wait_for(lock, kBeat, [this] { return stopping_; });
  }
}

std::vector<Liveness::Status> Liveness::read_statuses() const {
  std::vector<Status> out(size_);
  for (int r = 0; r < size_; ++r) {
    try {
      if (!store_->check({status_key(r)})) continue;
      const auto bytes = store_->get(status_key(r));
      std::istringstream in(std::string(bytes.begin(), bytes.end()));
      std::string beat, sequence, inside;
      std::getline(in, beat, '|');
      std::getline(in, sequence, '|');
      std::getline(in, inside, '|');
      std::getline(in, out[r].text);
      out[r].beat = std::stoll(beat);
      out[r].sequence = std::stoll(sequence);
      out[r].inside = inside == "1";
    } catch (const std::exception&) {
      out[r] = Status{};
      out[r].text = "unreachable";
    }
  }
  return out;
}

// What the OS says of rank r's process when it runs on this host (a dead process and a stopped
// one both stop beating; only the first is dead). Unknown for other hosts.
Liveness::Process Liveness::process_of(int r) const {
  try {
    if (!store_->check({process_key(r)})) return Process::Unknown;
    const auto bytes = store_->get(process_key(r));
    const std::string text(bytes.begin(), bytes.end());
    const size_t bar = text.find('|');
    if (text.substr(0, bar) != host_name()) return Process::Unknown;
    std::ifstream stat("/proc/" + text.substr(bar + 1) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return Process::Gone;
    const size_t paren = line.rfind(')');
    const char state = paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : '?';
    if (state == 'Z' || state == 'X') return Process::Gone;
    if (state == 'T' || state == 't') return Process::Stopped;
    return Process::Running;
  } catch (const std::exception&) {
    return Process::Unknown;
  }
}

std::vector<int> Liveness::dead_ranks(std::chrono::milliseconds window) const {
  const auto start = Clock::now();
  auto first = read_statuses();
  std::vector<Clock::time_point> changed(size_, start);
  while (Clock::now() - start < window) {
    std::this_thread::sleep_for(kBeat / 2);
    const auto now = read_statuses();
    std::vector<int> dead;
    bool store_gone = true;
    for (int r = 0; r < size_; ++r) {
      if (now[r].beat != -1) store_gone = false;
      if (now[r].beat != first[r].beat) {
        changed[r] = Clock::now();
        first[r] = now[r];
      }
      if (r == rank_) continue;
      if (process_of(r) == Process::Gone || Clock::now() - changed[r] >= kDeadAfter) dead.push_back(r);
    }
    if (store_gone && rank_ != 0) return {0};
    if (!dead.empty()) return dead;
  }
  return {};
}

std::vector<int> Liveness::Watch::check() {
  const auto now = Clock::now();
  const auto statuses = liveness_.read_statuses();
  if (beats_.empty()) {
    for (const auto& st : statuses) {
      beats_.push_back(st.beat);
      texts_.push_back(st.text);
    }
    changed_.assign(statuses.size(), now);
  }
  std::vector<int> dead;
  for (int r = 0; r < static_cast<int>(statuses.size()); ++r) {
    if (statuses[r].beat != beats_[r]) {
      beats_[r] = statuses[r].beat;
      changed_[r] = now;
    }
    if (r != liveness_.rank_ && statuses[r].beat != -1 && statuses[r].text != texts_[r]) {
      texts_[r] = statuses[r].text;
      last_progress_ = now;
    }
    if (r != liveness_.rank_ && now - changed_[r] >= kDeadAfter && liveness_.process_of(r) == Process::Gone) {
      dead.push_back(r);
    }
  }
  return dead;
}

std::string Liveness::where_everyone_is(uint64_t sequence, std::vector<int>* waiting_for) const {
  std::string out;
  const auto statuses = read_statuses();
  for (int r = 0; r < size_; ++r) {
    const Process p = r == rank_ ? Process::Running : process_of(r);
    out += detail::concat("\n  rank ", r, p == Process::Stopped ? " [process stopped]" : "",
                          p == Process::Gone ? " [process gone]" : "", ": ", statuses[r].text);
    const auto seq = static_cast<int64_t>(sequence);
    const bool behind =
        statuses[r].beat != -1 && (statuses[r].sequence < seq || (statuses[r].sequence == seq && !statuses[r].inside));
    if (waiting_for && r != rank_ && behind) waiting_for->push_back(r);
  }
  return out + "\n  (each rank's status as of its last heartbeat, at most " + std::to_string(kBeat.count()) +
         " ms old)";
}

}  // namespace lockstep::dist
