#include "core/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>

#include "core/env.h"

namespace hvdcompat {

namespace {
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
std::atomic<bool> g_hide_time{false};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kFatal: return "FATAL";
  }
  return "?";
}
}  // namespace

bool ParseLogLevel(const std::string& text, LogLevel* out) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "trace") *out = LogLevel::kTrace;
  else if (t == "debug") *out = LogLevel::kDebug;
  else if (t == "info") *out = LogLevel::kInfo;
  else if (t == "warning" || t == "warn") *out = LogLevel::kWarning;
  else if (t == "error") *out = LogLevel::kError;
  else if (t == "fatal") *out = LogLevel::kFatal;
  else return false;
  return true;
}

void ConfigureLogging(int rank) {
  g_rank = rank;
  LogLevel level = LogLevel::kWarning;
  std::string source;
  std::string text = KnobString(Knob::kLogLevel, &source);
  if (!ParseLogLevel(text, &level)) {
    throw std::invalid_argument(source + "=" + text +
                                " is not a log level: use trace, debug, info, warning, "
                                "error or fatal");
  }
  g_min_level = static_cast<int>(level);
  g_hide_time = KnobBool(Knob::kLogHideTime);
}

LogLevel MinLogLevel() { return static_cast<LogLevel>(g_min_level.load()); }

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  os_ << "[hvdcompat";
  int rank = g_rank.load();
  if (rank >= 0) os_ << " rank " << rank;
  os_ << "]";
  if (!g_hide_time.load()) {
    auto now = std::chrono::system_clock::now();
    std::time_t t = std::chrono::system_clock::to_time_t(now);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
    std::tm tm;
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
    char msbuf[8];
    std::snprintf(msbuf, sizeof(msbuf), ".%03d", static_cast<int>(ms.count()));
    os_ << " " << buf << msbuf;
  }
  os_ << " " << LevelName(level) << ": ";
  if (level <= LogLevel::kDebug) {
    const char* base = std::strrchr(file, '/');
    os_ << "(" << (base ? base + 1 : file) << ":" << line << ") ";
  }
}

LogMessage::~LogMessage() {
  os_ << "\n";
  std::string s = os_.str();
  ssize_t unused = ::write(2, s.data(), s.size());
  (void)unused;
}

}  // namespace hvdcompat
