#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zcc {
namespace {

LogLevel LevelFromEnv() {
  const char* env = std::getenv("ZCC_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  if (std::strcmp(env, "DEBUG") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "WARNING") == 0) return LogLevel::kWarning;
  if (std::strcmp(env, "ERROR") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& Threshold() {
  static std::atomic<int> threshold{static_cast<int>(LevelFromEnv())};
  return threshold;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarning: return "W";
    case LogLevel::kError: return "E";
  }
  return "?";
}

}  // namespace

void SetLogLevel(LogLevel level) { Threshold().store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= Threshold().load(); }

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = std::strrchr(file, '/');
  stream_ << absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()) << " "
          << LevelName(level_) << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  ssize_t unused = ::write(STDERR_FILENO, text.data(), text.size());
  (void)unused;
}

}  // namespace zcc
