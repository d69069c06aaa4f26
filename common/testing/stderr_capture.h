// Captures what the process writes to file descriptor 2 (where common/log.h
// writes its lines) for the lifetime of the object, for tests that check log
// output. Test-only. Not thread-compatible with other users of fd 2 swapping.
#ifndef ZCC_COMMON_TESTING_STDERR_CAPTURE_H_
#define ZCC_COMMON_TESTING_STDERR_CAPTURE_H_

#include <unistd.h>

#include <cstdio>
#include <string>

namespace zcc::testing {

class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    file_ = std::tmpfile();
    saved_ = ::dup(STDERR_FILENO);
    if (file_ != nullptr && saved_ >= 0) ::dup2(::fileno(file_), STDERR_FILENO);
  }
  ~StderrCapture() { Release(); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Stops capturing (once) and returns everything written meanwhile; the
  // text is also passed on to the real stderr, so test logs keep it.
  std::string Release() {
    if (saved_ < 0) return text_;
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
    if (file_ != nullptr) {
      std::rewind(file_);
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof(buf), file_)) > 0;) text_.append(buf, n);
      std::fclose(file_);
      file_ = nullptr;
    }
    ssize_t unused = ::write(STDERR_FILENO, text_.data(), text_.size());
    (void)unused;
    return text_;
  }

 private:
  std::FILE* file_ = nullptr;
  int saved_ = -1;
  std::string text_;
};

// Lines of `text` containing `needle`.
inline int CountLinesWith(const std::string& text, const std::string& needle) {
  int n = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    if (text.substr(begin, end - begin).find(needle) != std::string::npos) ++n;
    begin = end + 1;
  }
  return n;
}

}  // namespace zcc::testing

#endif  // ZCC_COMMON_TESTING_STDERR_CAPTURE_H_
