// Minimal leveled logging to stderr: one line per message with a UTC timestamp,
// the level and the source file. Thread-safe (each line is one write(2)).
//
//   ZCC_LOG(INFO) << "checkpoint step " << step << " committed";
//
// The threshold comes from SetLogLevel() or the ZCC_LOG_LEVEL environment
// variable (DEBUG, INFO, WARNING, ERROR); default INFO.
#ifndef ZCC_COMMON_LOG_H_
#define ZCC_COMMON_LOG_H_

#include <sstream>

namespace zcc {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

// Accumulates one log line and emits it on destruction.
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace zcc

#define ZCC_LOG_LEVEL_DEBUG ::zcc::LogLevel::kDebug
#define ZCC_LOG_LEVEL_INFO ::zcc::LogLevel::kInfo
#define ZCC_LOG_LEVEL_WARNING ::zcc::LogLevel::kWarning
#define ZCC_LOG_LEVEL_ERROR ::zcc::LogLevel::kError

// A loop rather than if/else, so the macro is safe inside an unbraced if/else.
#define ZCC_LOG(level)                                                        \
  for (bool zcc_log_once_ = ::zcc::LogEnabled(ZCC_LOG_LEVEL_##level); zcc_log_once_; \
       zcc_log_once_ = false)                                                 \
  ::zcc::LogLine(ZCC_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#endif  // ZCC_COMMON_LOG_H_
