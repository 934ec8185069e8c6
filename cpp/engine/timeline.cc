#include "engine/timeline.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/common.h"
#include "core/logging.h"

namespace hvdcompat {

namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// What a continued trace needs of the old one (Note [Timeline continues
// across runtimes]): its largest row id and when its last event ended (us).
struct TraceEnd {
  int max_tid = 0;
  double end_us = 0;
  bool has_events = false;
};

// Reads the trace in `f` (written by this class) in chunks; leaves `f` at
// its end. A number split by a chunk boundary is read from the carried tail.
TraceEnd ScanTrace(std::FILE* f) {
  TraceEnd end;
  std::string buf;
  std::vector<char> chunk(1 << 20);
  std::fseek(f, 0, SEEK_SET);
  while (true) {
    const size_t n = std::fread(chunk.data(), 1, chunk.size(), f);
    if (n == 0) break;
    buf.append(chunk.data(), n);
    // Parse up to the last complete event ("}" then a newline or "]").
    const size_t stop = buf.rfind('\n');
    if (stop == std::string::npos) continue;
    const char* p = buf.c_str();
    for (size_t at = buf.find("\"tid\": "); at != std::string::npos && at < stop;
         at = buf.find("\"tid\": ", at + 1)) {
      end.max_tid = std::max(end.max_tid, static_cast<int>(std::strtol(p + at + 7, nullptr, 10)));
    }
    for (size_t at = buf.find("\"ts\": "); at != std::string::npos && at < stop;
         at = buf.find("\"ts\": ", at + 1)) {
      char* after = nullptr;
      double t = std::strtod(p + at + 6, &after);
      if (after && std::strncmp(after, ", \"dur\": ", 9) == 0) t += std::strtod(after + 9, nullptr);
      end.end_us = std::max(end.end_us, t);
      end.has_events = true;
    }
    buf.erase(0, stop);
  }
  return end;
}

void ReportWriteFailure(const std::string& path, int err) {
  HVD_LOG(kError) << "timeline: writing '" << path << "' failed ("
                  << (err ? std::strerror(err) : "short write")
                  << "); the timeline stops here and the file may end without its closing "
                     "bracket. Free space or point HOROVOD_TIMELINE at another file.";
}

}  // namespace

void Timeline::Start(const std::string& path, bool mark_cycles, bool continue_trace) {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mu_);
  StopLocked();
  // Only a regular file holds a trace to continue (not /dev/null, a FIFO...).
  struct stat st;
  const bool regular = stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  std::FILE* f = continue_trace && regular ? std::fopen(path.c_str(), "r+") : nullptr;
  TraceEnd old;
  if (f) {
    old = ScanTrace(f);
    // Continue only a trace this class wrote: it ends in "\n]".
    char tail[2] = {0, 0};
    const bool ours = std::fseek(f, -2, SEEK_END) == 0 && std::fread(tail, 1, 2, f) == 2 &&
                      tail[0] == '\n' && tail[1] == ']';
    if (!ours) {
      std::fclose(f);
      f = nullptr;
      old = TraceEnd();
    }
  }
  const bool continued = f != nullptr;
  if (!f) f = std::fopen(path.c_str(), "w+");
  if (!f) {
    throw InvalidArgument("timeline: cannot open '" + path + "' for writing: " +
                          std::strerror(errno) + ". Check HOROVOD_TIMELINE / start_timeline's path.");
  }
  // A failed write is reported as the writer's are (only rank 0 gets here:
  // throwing would fail hvd.init on it alone and leave its peers waiting).
  errno = 0;
  const bool written = continued || (std::fputs("[\n]", f) >= 0 && std::fflush(f) == 0);
  if (!written) ReportWriteFailure(path, errno);
  {
    std::lock_guard<std::mutex> lock(mu_);
    file_ = f;
    path_ = path;
    write_failed_ = !written;
    tid_base_ = old.max_tid;
    first_event_ = !old.has_events;
    stopping_ = false;
    rows_.clear();
    pids_.clear();
    queue_.clear();
    // A continued trace's clock resumes a millisecond after its last event.
    origin_ = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double, std::micro>(
                                     continued ? old.end_us + 1000.0 : 0.0));
  }
  mark_cycles_ = mark_cycles;
  active_ = true;
  writer_ = std::thread([this] { WriterLoop(); });
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mu_);
  StopLocked();
}

void Timeline::StopLocked() {
  if (!writer_.joinable()) return;
  active_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (file_) {
    std::fclose(file_);
    file_ = nullptr;
  }
}

int Timeline::RowIdLocked(int pid, const std::string& row) {
  std::string key = std::to_string(pid) + "/" + row;
  auto it = rows_.find(key);
  if (it != rows_.end()) return it->second;
  int tid = tid_base_ + static_cast<int>(rows_.size()) + 1;
  rows_[key] = tid;
  queue_.push_back("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
                   ", \"tid\": " + std::to_string(tid) + ", \"args\": {\"name\": \"" +
                   JsonEscape(row) + "\"}}");
  queue_.push_back("{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": " +
                   std::to_string(pid) + ", \"tid\": " + std::to_string(tid) +
                   ", \"args\": {\"sort_index\": " + std::to_string(tid) + "}}");
  if (pids_.insert(pid).second) {
    queue_.push_back("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
                     ", \"args\": {\"name\": \"hvdcompat process set " + std::to_string(pid) +
                     "\"}}");
  }
  return tid;
}

void Timeline::Span(int pid, const std::string& row, const char* name, Clock::time_point start,
                    Clock::time_point end, const std::string& args_json) {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  int tid = RowIdLocked(pid, row);
  double ts = std::chrono::duration<double, std::micro>(start - origin_).count();
  double dur = std::chrono::duration<double, std::micro>(end - start).count();
  char head[160];
  std::snprintf(head, sizeof(head), "{\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, ",
                pid, tid, ts, dur < 0 ? 0.0 : dur);
  std::string ev = head;
  ev += "\"name\": \"" + JsonEscape(name) + "\"";
  if (!args_json.empty()) ev += ", \"args\": {" + args_json + "}";
  ev += "}";
  queue_.push_back(std::move(ev));
}

void Timeline::Instant(int pid, const std::string& row, const char* name, Clock::time_point at) {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  int tid = RowIdLocked(pid, row);
  double ts = std::chrono::duration<double, std::micro>(at - origin_).count();
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "{\"ph\": \"i\", \"s\": \"t\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"name\": \"%s\"}",
                pid, tid, ts, name);
  queue_.push_back(buf);
}

void Timeline::Write(std::vector<std::string>* batch) {
  // Only the writer thread touches file_ between Start and Stop.
  if (batch->empty() || !file_ || write_failed_) {
    batch->clear();
    return;
  }
  // Overwrite the closing "\n]" and put it back after the new events.
  std::string out;
  for (auto& e : *batch) {
    out += first_event_ ? "\n" : ",\n";
    first_event_ = false;
    out += e;
  }
  out += "\n]";
  batch->clear();
  errno = 0;
  if (std::fseek(file_, -2, SEEK_END) != 0 ||
      std::fwrite(out.data(), 1, out.size(), file_) != out.size() || std::fflush(file_) != 0) {
    write_failed_ = true;
    ReportWriteFailure(path_, errno);
  }
}

void Timeline::WriterLoop() {
  std::vector<std::string> batch;
  while (true) {
    bool stop;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_; });
      batch.swap(queue_);
      stop = stopping_;
    }
    Write(&batch);
    if (stop) return;
  }
}

}  // namespace hvdcompat
