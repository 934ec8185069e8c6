// Rank-prefixed logging to stderr, filtered by HOROVOD_LOG_LEVEL.
// Thread-safe: each message is written with a single write call.
#pragma once

#include <sstream>
#include <string>

namespace hvdcompat {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

// Reads HOROVOD_LOG_LEVEL / HOROVOD_LOG_HIDE_TIME; called at init.
void ConfigureLogging(int rank);
LogLevel MinLogLevel();
bool ParseLogLevel(const std::string& text, LogLevel* out);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostringstream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

}  // namespace hvdcompat

#define HVD_LOG(level)                                                          \
  if (::hvdcompat::LogLevel::level < ::hvdcompat::MinLogLevel()) {              \
  } else                                                                        \
    ::hvdcompat::LogMessage(::hvdcompat::LogLevel::level, __FILE__, __LINE__).stream()
