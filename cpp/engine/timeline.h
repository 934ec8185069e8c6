// Chrome-trace timeline (HOROVOD_TIMELINE): one row per tensor with its
// queueing, negotiation and collective, plus an engine row with fusion
// copies and cycle marks. Loads in chrome://tracing and ui.perfetto.dev.
//
// Note [Timeline file stays valid]: a writer thread appends events about
// every 100 ms and always leaves the file ending in "\n]", seeking back over
// those two bytes before the next batch. So the file is a complete JSON
// array after every batch: it can be read while the job runs, and it is
// valid after an abrupt end (at most the last 100 ms are missing).
//
// Note [Timeline continues across runtimes]: hvd.shutdown() then hvd.init(),
// or an elastic reset, builds a new runtime, which starts the timeline
// again. Truncating the file then would lose everything before it. Instead
// the new timeline reads the old trace once (its largest row id and the end
// of its last event), drops the closing "\n]" and appends: row ids continue
// after the old ones and the clock after the old events, so the whole job is
// one valid trace. A write that fails (disk full, file system gone) is
// reported once, with the path and the system's reason, and the timeline
// stops writing; the job itself goes on.
//
// Rows: one per tensor name. Unnamed ops ("allreduce.noname.<k>", new on
// every call) share one row per op kind ("allreduce.noname"), so their count
// stays bounded (the worker names the row, see ProcessSetWorker).
//
// Thread-safe: any worker may record; Start/Stop come from API threads and
// may race (hvd.shutdown() stops the timeline while another thread starts or
// stops it): they are serialised by lifecycle_mu_, so the writer thread is
// created and joined by one caller at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace hvdcompat {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  Timeline() = default;
  ~Timeline() { Stop(); }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Opens `path`; throws InvalidArgument when it cannot be written. With
  // `continue_trace` (a re-init or an elastic reset of the same job) a trace
  // already there is continued: its events stay, the new rows get new ids
  // and the new events follow the last old one in time (Note [Timeline
  // continues across runtimes]). Otherwise the file is truncated.
  void Start(const std::string& path, bool mark_cycles, bool continue_trace = false);
  // Flushes and closes; idempotent.
  void Stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }
  bool mark_cycles() const { return mark_cycles_.load(std::memory_order_relaxed); }

  // A complete event ("X") on row `row` of process `pid`. `args_json` is a
  // JSON object body without braces (e.g. "\"bytes\": 12"), or empty.
  void Span(int pid, const std::string& row, const char* name, Clock::time_point start,
            Clock::time_point end, const std::string& args_json = std::string());
  // An instant event ("i") on row `row`.
  void Instant(int pid, const std::string& row, const char* name, Clock::time_point at);

 private:
  // Stop's work (lifecycle_mu_ held).
  void StopLocked();
  int RowIdLocked(int pid, const std::string& row);
  void WriterLoop();
  void Write(std::vector<std::string>* batch);

  // Held through Start and Stop (and so while joining the writer); taken
  // before mu_, which the writer takes.
  std::mutex lifecycle_mu_;
  std::atomic<bool> active_{false};
  std::atomic<bool> mark_cycles_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> queue_;
  std::unordered_map<std::string, int> rows_;
  std::unordered_set<int> pids_;
  bool stopping_ = false;
  std::FILE* file_ = nullptr;
  std::string path_;        // for the message of a failed write
  bool write_failed_ = false;  // writer thread only: reported once, then nothing is written
  int tid_base_ = 0;        // row ids of a continued trace start after its old ones
  bool first_event_ = true;
  Clock::time_point origin_;
  std::thread writer_;  // guarded by lifecycle_mu_
};

}  // namespace hvdcompat
