#include "liveness.h"

#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>

#include "lockstep/core/error.h"
#include "rendezvous.h"

namespace lockstep::dist {
namespace {

std::string status_key(int rank) { return detail::concat("lockstep/status/", rank); }
std::string process_key(int rank) { return detail::concat("lockstep/proc/", rank); }
// Predicted checks: how many departures from the prediction there were, the latest one's collective,
// and each rank's call there.
const std::string kDeparturesKey = "lockstep/departures";
const std::string kDepartedAtKey = "lockstep/departed_at";
// How many times a rank published a status other than its previous one: what a waiting rank reads to see
// that the group moves, in place of every rank's status.
const std::string kChangesKey = "lockstep/status_changes";
// Ranks found dead, for the ranks that cannot see it themselves (on another host): the count of findings,
// and the n-th finding's ranks ("1,5").
const std::string kDeadCountKey = "lockstep/dead_count";
std::string dead_key(int64_t n) { return detail::concat("lockstep/dead/", n); }
std::string report_key(uint64_t sequence, int rank) { return detail::concat("lockstep/report/", sequence, "/", rank); }

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

std::vector<int> ranks_of(const std::string& text) {
  std::vector<int> out;
  std::istringstream in(text);
  std::string rank;
  while (std::getline(in, rank, ',')) {
    if (!rank.empty()) out.push_back(std::stoi(rank));
  }
  return out;
}

// `to` with `ranks` added, sorted, once each, without `but` (this rank, which never names itself dead).
void add_ranks(std::vector<int>& to, const std::vector<int>& ranks, int but = -1) {
  to.insert(to.end(), ranks.begin(), ranks.end());
  std::sort(to.begin(), to.end());
  to.erase(std::unique(to.begin(), to.end()), to.end());
  to.erase(std::remove(to.begin(), to.end(), but), to.end());
}

// A process record is "host|pid".
bool on_host(const std::string& record, const std::string& host) {
  return record.size() > host.size() && record.compare(0, host.size(), host) == 0 && record[host.size()] == '|';
}

}  // namespace

std::shared_ptr<const CollectiveCall> kept_call(const CollectiveCall& call) {
  struct Kept {
    std::string tag, file;
    CollectiveCall call;
  };
  auto kept = std::make_shared<Kept>();
  kept->tag = call.site.tag ? call.site.tag : "";
  kept->file = call.site.file ? call.site.file : "";
  kept->call = call;
  if (call.site.tag) kept->call.site.tag = kept->tag.c_str();
  if (call.site.file) kept->call.site.file = kept->file.c_str();
  return std::shared_ptr<const CollectiveCall>(kept, &kept->call);
}

struct Liveness::Shared {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int size = 1;
  std::mutex mutex;  // guards everything below
  std::condition_variable changed;
  // This rank's status, which the heartbeat publishes.
  std::string where = "starting";
  std::shared_ptr<const CollectiveCall> where_call;  // instead of `where`: a call issued on the prediction
  std::string progress;
  std::string published;  // the status text the heartbeat last published
  uint64_t where_sequence = 0;
  bool inside = false;
  bool stopping = false;
  bool beating = true;  // the heartbeat thread has not returned
  // Store reads, one at a time: what the last finished one read, and the process records ("host|pid")
  // read so far, which never change.
  uint64_t reads_started = 0;
  uint64_t reads_finished = 0;
  bool reading_everyone = false;  // the read under way reads every rank's status
  Clock::time_point read_started;
  std::vector<Status> statuses;
  std::vector<bool> fresh;  // the ranks the last read read
  int64_t changes = -1;     // kChangesKey as the last read found it
  // The ranks found dead: those read from the store (findings 1 to dead_findings), and those this rank
  // found, which the heartbeat publishes.
  std::vector<int> dead;
  int64_t dead_findings = 0;
  std::vector<int> dead_to_publish;
  std::vector<std::string> processes;
  // Predicted checks: the calls this rank issued on the prediction (sequence, call), the departures
  // counted so far, the latest one's collective, and the one this rank's call was reported at.
  std::deque<std::pair<uint64_t, std::shared_ptr<const CollectiveCall>>> predicted;
  int64_t departures_seen = 0;
  uint64_t departure = 0;
  uint64_t reported = 0;
  uint64_t beats = 0;     // heartbeats completed, departures read included
  bool beat_now = false;  // a caller wants the next beat without waiting out kBeat
};

Liveness::Liveness(c10::intrusive_ptr<c10d::Store> store, int rank, int size)
    : rank_(rank), size_(size), shared_(std::make_shared<Shared>()) {
  shared_->store = std::move(store);
  shared_->rank = rank;
  shared_->size = size;
  shared_->processes.resize(size);
  shared_->statuses.resize(size);
  shared_->fresh.resize(size);
  shared_->store->set(process_key(rank_), store_bytes(detail::concat(host_name(), "|", ::getpid())));
  heartbeat_ = std::thread(heartbeat_loop, shared_);
}

// A heartbeat stuck in a store that does not answer is left to finish (or not) on its own.
Liveness::~Liveness() {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->stopping = true;
  shared_->changed.notify_all();
  const bool returned = shared_->changed.wait_for(lock, kStoreAnswer, [this] { return !shared_->beating; });
  lock.unlock();
  if (returned) {
    heartbeat_.join();
  } else {
    heartbeat_.detach();
  }
}

void Liveness::set_progress(const std::string& progress) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->progress = progress;
}

void Liveness::set_note(const std::string& note) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->where = note;
  shared_->where_call = nullptr;
}

void Liveness::enter(const CollectiveCall& call) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->inside = true;
  shared_->where_sequence = call.sequence;
  shared_->where = call.describe();
  shared_->where_call = nullptr;
}

void Liveness::leave(const CollectiveCall& call) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->inside = false;
  shared_->where_sequence = call.sequence;
  shared_->where = call.describe();
  shared_->where_call = nullptr;
}

// "<progress>, in|after <collective>"; the caller holds s.mutex.
std::string Liveness::status_text(const Shared& s) {
  std::string text = s.progress.empty() ? "" : s.progress + ", ";
  const std::string where = s.where_call ? s.where_call->describe() : s.where;
  return text + (s.where_sequence == 0 ? where : (s.inside ? "in " : "after ") + where);
}

// Publishes "<beat>|<sequence>|<1 inside, 0 after>|<progress>, in|after <collective>"; the store is
// written without the lock held, so a write that hangs holds up nothing but this thread.
void Liveness::heartbeat_loop(std::shared_ptr<Shared> s) {
  uint64_t beat = 0;
  std::unique_lock<std::mutex> lock(s->mutex);
  while (!s->stopping) {
    const std::string text = status_text(*s);
    const std::string value = detail::concat(++beat, "|", s->where_sequence, "|", s->inside ? 1 : 0, "|", text);
    const bool changed = text != s->published;
    s->published = text;
    lock.unlock();
    try {
      s->store->set(status_key(s->rank), store_bytes(value));
      if (changed) s->store->add(kChangesKey, 1);
    } catch (const std::exception&) {
      // The store (rank 0) is gone; the collective that notices says so.
    }
    lock.lock();
    watch_departures(*s, lock);
    write_dead(*s, lock);
    ++s->beats;
    s->changed.notify_all();
    s->changed.wait_for(lock, kBeat, [&s] { return s->stopping || s->beat_now; });
    s->beat_now = false;
  }
  s->beating = false;
  s->changed.notify_all();
}

// The description of collective `sequence` when this rank issued it on the prediction and still keeps
// it; the caller holds s.mutex.
std::optional<std::string> Liveness::issued_call(const Shared& s, uint64_t sequence) {
  const auto issued =
      std::find_if(s.predicted.begin(), s.predicted.end(), [&](const auto& p) { return p.first == sequence; });
  if (issued == s.predicted.end()) return std::nullopt;
  return issued->second->describe();
}

// One read a beat (the count), two when it moved; the store is used without the lock held.
void Liveness::watch_departures(Shared& s, std::unique_lock<std::mutex>& lock) {
  const int64_t seen = s.departures_seen;
  lock.unlock();
  int64_t count = seen;
  uint64_t at = 0;
  try {
    count = s.store->add(kDeparturesKey, 0);
    if (count != seen) at = std::stoull(text_of(s.store->get(kDepartedAtKey)));
  } catch (const std::exception&) {
    count = seen;  // the store is gone: the collective that waits says so
  }
  lock.lock();
  if (count != seen) {
    s.departures_seen = count;
    s.departure = std::max(s.departure, at);
  }
  const uint64_t departure = s.departure;
  if (departure == 0 || s.reported == departure) return;
  const std::optional<std::string> issued = issued_call(s, departure);
  if (!issued) return;
  const std::string report = "issued|" + *issued;
  lock.unlock();
  bool published = true;
  try {
    s.store->set(report_key(departure, s.rank), store_bytes(report));
  } catch (const std::exception&) {
    published = false;
  }
  lock.lock();
  if (published) s.reported = std::max(s.reported, departure);
}

void Liveness::publish_dead(const std::vector<int>& ranks) const {
  Shared& s = *shared_;
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<int> found;
  std::copy_if(ranks.begin(), ranks.end(), std::back_inserter(found),
               [&s](int r) { return std::find(s.dead.begin(), s.dead.end(), r) == s.dead.end(); });
  if (found.empty()) return;
  add_ranks(s.dead_to_publish, found);
  s.beat_now = true;
  s.changed.notify_all();
}

// In the heartbeat: one finding, numbered by the count, then written; readers skip a number not written yet.
void Liveness::write_dead(Shared& s, std::unique_lock<std::mutex>& lock) {
  if (s.dead_to_publish.empty()) return;
  const std::vector<int> ranks = std::move(s.dead_to_publish);
  s.dead_to_publish.clear();
  add_ranks(s.dead, ranks);
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ",") + std::to_string(r);
  lock.unlock();
  try {
    const int64_t n = s.store->add(kDeadCountKey, 1);
    s.store->set(dead_key(n), store_bytes(text));
  } catch (const std::exception&) {  // the store is gone: every rank finds that out itself
  }
  lock.lock();
}

void Liveness::issued_on_prediction(std::shared_ptr<const CollectiveCall> call) {
  std::shared_ptr<const CollectiveCall> dropped;  // released after the lock, as it may be the last holder
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->inside = false;  // "after" it: issued, for its waiter to watch
  shared_->where_sequence = call->sequence;
  shared_->where_call = call;
  shared_->predicted.emplace_back(call->sequence, std::move(call));
  if (shared_->predicted.size() > kKeptPredicted) {
    dropped = std::move(shared_->predicted.front().second);
    shared_->predicted.pop_front();
  }
}

void Liveness::report_call(uint64_t sequence, bool departs, const std::string& description) {
  Shared& s = *shared_;
  std::string call = description;
  if (!departs) {  // the call this rank issued there, as it was recorded, when it still is
    std::lock_guard<std::mutex> lock(s.mutex);
    if (const std::optional<std::string> issued = issued_call(s, sequence)) call = *issued;
  }
  s.store->set(report_key(sequence, rank_), store_bytes((departs ? "departs|" : "issued|") + call));
  if (departs) {
    s.store->set(kDepartedAtKey, store_bytes(std::to_string(sequence)));
    s.store->add(kDeparturesKey, 1);
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.reported = std::max(s.reported, sequence);
}

// The heartbeat reads (a beat that began before this call may have read the count before the departure,
// so the one after it); a store that does not answer holds up the heartbeat, never this caller.
uint64_t Liveness::read_departure() {
  Shared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mutex);
  const uint64_t wanted = s.beats + 2;
  s.beat_now = true;
  s.changed.notify_all();
  s.changed.wait_for(lock, kStoreAnswer, [&] { return s.beats >= wanted || !s.beating; });
  return s.departure;
}

uint64_t Liveness::departure() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->departure;
}

std::optional<std::vector<std::string>> Liveness::reports(uint64_t sequence) const {
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(report_key(sequence, r));
  if (!shared_->store->check(keys)) return std::nullopt;
  std::vector<std::string> out;
#if TORCH_VERSION_MAJOR >= 2
  for (const auto& bytes : shared_->store->multiGet(keys)) out.push_back(text_of(bytes));
#else
  for (const auto& key : keys) out.push_back(text_of(shared_->store->get(key)));
#endif
  return out;
}

// On a helper thread: reads every rank's status, and the process records not read yet.
// "<beat>|<sequence>|<1 inside, 0 after>|<text>", as heartbeat_loop publishes it.
Liveness::Status Liveness::parse_status(const std::vector<uint8_t>& bytes) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::string beat, sequence, inside;
  Liveness::Status status;
  std::getline(in, beat, '|');
  std::getline(in, sequence, '|');
  std::getline(in, inside, '|');
  std::getline(in, status.text);
  status.beat = std::stoll(beat);
  status.sequence = std::stoll(sequence);
  status.inside = inside == "1";
  return status;
}

namespace {

// The process records ("host|pid", which never change) not read yet: in one round trip once every rank has
// published them, else rank by rank.
void read_processes(c10d::Store& store, std::vector<std::string>& processes) {
  std::vector<std::string> keys;
  for (size_t r = 0; r < processes.size(); ++r) {
    if (processes[r].empty()) keys.push_back(process_key(static_cast<int>(r)));
  }
  if (keys.empty()) return;
#if TORCH_VERSION_MAJOR >= 2
  try {
    if (keys.size() == processes.size() && store.check(keys)) {
      const auto values = store.multiGet(keys);
      for (size_t r = 0; r < processes.size(); ++r) processes[r] = text_of(values[r]);
      return;
    }
  } catch (const std::exception&) {  // read rank by rank below
  }
#endif
  for (size_t r = 0; r < processes.size(); ++r) {
    try {
      const std::string key = process_key(static_cast<int>(r));
      if (processes[r].empty() && store.check({key})) processes[r] = text_of(store.get(key));
    } catch (const std::exception&) {  // read again next time
    }
  }
}

}  // namespace

// On a helper thread: every rank's status, or this host's ranks' only, and the count of status changes.
// Once the ranks read have published, one round trip reads their statuses (multiGet): a read per rank
// costs the store W round trips from each of W ranks, which at 64 ranks took most of a collective's time.
void Liveness::read_store(std::shared_ptr<Shared> s, bool everyone) {
  std::vector<std::string> processes;
  std::vector<Status> out;
  std::vector<int> dead;
  int64_t findings = 0;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    processes = s->processes;
    out = s->statuses;
    dead = s->dead;
    findings = s->dead_findings;
  }
  read_processes(*s->store, processes);
  const std::string host = host_name();
  std::vector<int> ranks;
  for (int r = 0; r < s->size; ++r) {
    if (everyone || (r != s->rank && on_host(processes[static_cast<size_t>(r)], host))) ranks.push_back(r);
  }
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(status_key(r));
  bool read_at_once = false;
#if TORCH_VERSION_MAJOR >= 2
  try {
    if (!keys.empty() && s->store->check(keys)) {
      const auto values = s->store->multiGet(keys);
      for (size_t i = 0; i < ranks.size(); ++i) out[static_cast<size_t>(ranks[i])] = parse_status(values[i]);
      read_at_once = true;
    }
  } catch (const std::exception&) {  // read rank by rank below, naming the ones that fail
  }
#endif
  for (size_t i = 0; i < ranks.size() && !read_at_once; ++i) {
    Status& status = out[static_cast<size_t>(ranks[i])];
    try {
      status = s->store->check({keys[i]}) ? parse_status(s->store->get(keys[i])) : Status{};
    } catch (const std::exception&) {
      status = Status{};
      status.text = "unreachable";
    }
  }
  int64_t changes = -1;
  try {
    changes = s->store->add(kChangesKey, 0);
    for (int64_t n = findings + 1, count = s->store->add(kDeadCountKey, 0); n <= count; ++n) {
      if (!s->store->check({dead_key(n)})) break;  // numbered, not written yet: the next read takes it
      add_ranks(dead, ranks_of(text_of(s->store->get(dead_key(n)))));
      findings = n;
    }
  } catch (const std::exception&) {  // unreadable: no sign that the group moves
  }
  std::vector<bool> fresh(static_cast<size_t>(s->size), false);
  for (int r : ranks) fresh[static_cast<size_t>(r)] = true;
  std::lock_guard<std::mutex> lock(s->mutex);
  s->statuses = std::move(out);
  s->fresh = std::move(fresh);
  s->processes = std::move(processes);
  s->changes = changes;
  add_ranks(s->dead, dead);
  s->dead_findings = std::max(s->dead_findings, findings);
  ++s->reads_finished;
  s->changed.notify_all();
}

// Starts a read unless one is under way, and waits for it until kStoreAnswer after it started: a
// read that hangs makes this and every later call (until it returns) answer at once, unreachable.
Liveness::Reading Liveness::read_statuses(bool everyone) const {
  Shared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mutex);
  const auto idle = [&s] { return s.reads_finished == s.reads_started; };
  const auto unreachable = [this] {
    Reading out;
    out.statuses.resize(static_cast<size_t>(size_));
    for (auto& st : out.statuses) st.text = "unreachable";
    out.fresh.assign(static_cast<size_t>(size_), true);
    return out;
  };
  // A read of this host's ranks under way does not answer for everyone: it finishes first.
  if (everyone && !idle() && !s.reading_everyone && !s.changed.wait_until(lock, s.read_started + kStoreAnswer, idle)) {
    return unreachable();
  }
  if (idle()) {
    ++s.reads_started;
    s.read_started = Clock::now();
    s.reading_everyone = everyone;
    std::thread(read_store, shared_, everyone).detach();
  }
  const uint64_t wanted = s.reads_started;
  if (s.changed.wait_until(lock, s.read_started + kStoreAnswer, [&] { return s.reads_finished >= wanted; })) {
    return Reading{s.statuses, s.fresh, s.changes, s.dead};
  }
  return unreachable();
}

// What the OS says of rank r's process when it runs on this host (a dead process and a stopped
// one both stop beating; only the first is dead). Unknown for other hosts.
Liveness::Process Liveness::process_of(int r) const {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    text = shared_->processes[r];
  }
  const size_t bar = text.find('|');
  if (bar == std::string::npos || text.substr(0, bar) != host_name()) return Process::Unknown;
  std::ifstream stat("/proc/" + text.substr(bar + 1) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return Process::Gone;
  const size_t paren = line.rfind(')');
  const char state = paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : '?';
  if (state == 'Z' || state == 'X') return Process::Gone;
  if (state == 'T' || state == 't') return Process::Stopped;
  return Process::Running;
}

// Every rank's status is read at kEveryoneFrom (a baseline of the beats), then from kDeadAfter after it
// (who has not beaten since is silent); before and between, this host's ranks and the published dead. When
// a rank dies, the ranks of its host see it first and publish it, and the others return at their next read,
// most of them never reading everyone.
std::vector<int> Liveness::dead_ranks(std::chrono::milliseconds window) const {
  const auto start = Clock::now();
  std::vector<int64_t> beats(static_cast<size_t>(size_), -1);
  std::vector<Clock::time_point> changed(static_cast<size_t>(size_), start);
  std::optional<Clock::time_point> baseline;  // when every rank's beat was read first
  bool first = true;
  while (Clock::now() - start < window) {
    if (!first) std::this_thread::sleep_for(kBeat / 2);
    first = false;
    const auto now = Clock::now();
    const bool everyone = (!baseline && now - start >= kEveryoneFrom) || (baseline && now - *baseline >= kDeadAfter);
    const Reading reading = read_statuses(everyone);
    if (everyone && !baseline) baseline = now;
    std::vector<int> dead, gone;
    bool store_gone = reading.changes == -1;
    for (int r = 0; r < size_; ++r) {
      if (!reading.fresh[r]) continue;
      const int64_t beat = reading.statuses[r].beat;
      if (beat != -1) store_gone = false;
      if (beat != beats[r]) {
        changed[r] = now;
        beats[r] = beat;
      }
      if (r == rank_) continue;
      if (process_of(r) == Process::Gone) {
        gone.push_back(r);
      } else if (now - changed[r] >= kDeadAfter) {  // silent since this rank first read its beat, or longer
        dead.push_back(r);
      }
    }
    if (store_gone && rank_ != 0) return {0};
    publish_dead(gone);  // only what is certain: a silent rank may be stopped, or cut off from this one
    add_ranks(dead, gone);
    add_ranks(dead, reading.dead, rank_);
    if (!dead.empty()) return dead;
  }
  return {};
}

std::vector<int> Liveness::Watch::check(bool everyone) {
  const auto now = Clock::now();
  const Reading reading = liveness_.read_statuses(everyone);
  const auto& statuses = reading.statuses;
  if (beats_.empty()) {
    for (const auto& st : statuses) beats_.push_back(st.beat);
    changed_.assign(statuses.size(), now);
  }
  if (reading.changes != -1 && reading.changes != changes_) {  // unreadable is no sign of progress
    if (changes_ != -1) last_progress_ = now;
    changes_ = reading.changes;
  }
  std::vector<int> dead;
  for (int r = 0; r < static_cast<int>(statuses.size()); ++r) {
    if (!reading.fresh[r]) continue;  // not read now: what an earlier read found, which moves nothing
    if (statuses[r].beat != -1 && statuses[r].beat != beats_[r]) {  // unreadable is no sign of life
      beats_[r] = statuses[r].beat;
      changed_[r] = now;
    }
    if (r != liveness_.rank_ && now - changed_[r] >= kDeadAfter && liveness_.process_of(r) == Process::Gone) {
      dead.push_back(r);
    }
  }
  liveness_.publish_dead(dead);  // for the ranks of other hosts, which cannot see these processes
  add_ranks(dead, reading.dead, liveness_.rank_);
  return dead;
}

std::vector<int> Liveness::Watch::silent() const {
  const auto now = Clock::now();
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(changed_.size()); ++r) {
    if (r != liveness_.rank_ && now - changed_[r] >= kDeadAfter) out.push_back(r);
  }
  return out;
}

std::string Liveness::where_everyone_is(uint64_t sequence, std::vector<int>* waiting_for) const {
  std::string out;
  const auto statuses = read_statuses().statuses;
  for (int r = 0; r < size_; ++r) {
    const Process p = r == rank_ ? Process::Running : process_of(r);
    std::string text = statuses[r].text;
    if (r == rank_) {  // this rank's own status as it is now, not as last published
      std::lock_guard<std::mutex> lock(shared_->mutex);
      text = status_text(*shared_);
    }
    out += detail::concat("\n  rank ", r, p == Process::Stopped ? " [process stopped]" : "",
                          p == Process::Gone ? " [process gone]" : "", ": ", text);
    const auto seq = static_cast<int64_t>(sequence);
    const bool behind =
        statuses[r].beat != -1 && (statuses[r].sequence < seq || (statuses[r].sequence == seq && !statuses[r].inside));
    if (waiting_for && r != rank_ && behind) waiting_for->push_back(r);
  }
  return out + "\n  (each rank's status as of its last heartbeat, at most " + std::to_string(kBeat.count()) +
         " ms old)";
}

}  // namespace lockstep::dist
