// Redirects stderr (where ZCC_LOG writes) into a file while alive, so that a
// test can check what was logged.
//
// Thread-safety: swaps the process's fd 2; one capture at a time.
#ifndef ZCC_STORAGE_TESTING_STDERR_CAPTURE_H_
#define ZCC_STORAGE_TESTING_STDERR_CAPTURE_H_

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "common/file_util.h"
#include "common/testing/temp_dir.h"

namespace zcc::testing {

class StderrCapture {
 public:
  StderrCapture() : path_(JoinPath(TempDir(), "stderr")) {
    saved_ = ::dup(STDERR_FILENO);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~StderrCapture() { Restore(); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Stops capturing and returns what was written.
  std::string Text() {
    Restore();
    auto text = ReadFileToString(path_, 1 << 20);
    return text.ok() ? *text : std::string();
  }

  // How often `needle` occurs in `text`.
  static size_t Count(const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t pos = text.find(needle); pos != std::string::npos;
         pos = text.find(needle, pos + 1)) {
      ++n;
    }
    return n;
  }

 private:
  void Restore() {
    if (saved_ >= 0) {
      ::dup2(saved_, STDERR_FILENO);
      ::close(saved_);
      saved_ = -1;
    }
  }

  std::string path_;
  int saved_ = -1;
};

}  // namespace zcc::testing

#endif  // ZCC_STORAGE_TESTING_STDERR_CAPTURE_H_
