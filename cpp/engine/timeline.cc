#include "engine/timeline.h"

#include <cerrno>
#include <cstring>

#include "core/common.h"

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

}  // namespace

void Timeline::Start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mu_);
  StopLocked();
  std::FILE* f = std::fopen(path.c_str(), "w+");
  if (!f) {
    throw InvalidArgument("timeline: cannot open '" + path + "' for writing: " +
                          std::strerror(errno) + ". Check HOROVOD_TIMELINE / start_timeline's path.");
  }
  std::fputs("[\n]", f);
  std::fflush(f);
  {
    std::lock_guard<std::mutex> lock(mu_);
    file_ = f;
    first_event_ = true;
    stopping_ = false;
    rows_.clear();
    pids_.clear();
    queue_.clear();
    origin_ = Clock::now();
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
  int tid = static_cast<int>(rows_.size()) + 1;
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
  if (batch->empty() || !file_) return;
  // Overwrite the closing "\n]" and put it back after the new events.
  std::fseek(file_, -2, SEEK_END);
  std::string out;
  for (auto& e : *batch) {
    out += first_event_ ? "\n" : ",\n";
    first_event_ = false;
    out += e;
  }
  out += "\n]";
  std::fwrite(out.data(), 1, out.size(), file_);
  std::fflush(file_);
  batch->clear();
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
