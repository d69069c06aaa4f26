#include "metrics/textfile_writer.h"

#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"

namespace zcc::metrics {

struct TextfileWriter::Impl {
  TextfileWriterOptions options;
  RenderFn render;
  std::string path;
  std::atomic<uint64_t> writes{0};
  // Only the writer thread (or Stop, after joining it) writes; no lock needed.
  bool failing = false;

  zcc::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  zcc::Mutex stop_mu;  // serializes Stop callers
  std::thread thread ABSL_GUARDED_BY(stop_mu);

  ~Impl() { Stop(); }

  absl::Status Write() {
    ZCC_RETURN_IF_ERROR(WriteFileAtomic(path, render()));
    writes.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  // Logs only changes between working and failing, not every failed write.
  void WriteAndLog() {
    const absl::Status st = Write();
    if (st.ok() && failing) ZCC_LOG(INFO) << "metrics textfile " << path << " written again";
    if (!st.ok() && !failing) ZCC_LOG(WARNING) << "metrics textfile: " << st.message();
    failing = !st.ok();
  }

  void Run() {
    absl::Time next = absl::Now() + options.interval;
    for (;;) {
      {
        zcc::MutexLock lock(&mu);
        if (mu.AwaitWithDeadline(absl::Condition(&stop), next)) return;
      }
      WriteAndLog();
      // A fixed cadence; after a stall, start over from now rather than catch up.
      next += options.interval;
      if (const absl::Time now = absl::Now(); next <= now) next = now + options.interval;
    }
  }

  void Stop() {
    zcc::MutexLock stop_lock(&stop_mu);
    if (!thread.joinable()) return;
    {
      zcc::MutexLock lock(&mu);
      stop = true;
    }
    thread.join();
    WriteAndLog();
  }
};

absl::StatusOr<TextfileWriter> TextfileWriter::Start(TextfileWriterOptions options,
                                                     RenderFn render) {
  if (options.dir.empty() || options.dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics textfile directory must be an absolute path, got \"", options.dir,
                     "\""));
  }
  if (options.file_name.empty() || options.file_name.find('/') != std::string::npos ||
      !absl::EndsWith(options.file_name, ".prom")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics textfile name must be a plain name ending in .prom, got \"", options.file_name,
        "\""));
  }
  if (options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("metrics textfile interval must be positive");
  }
  if (!render) return absl::InvalidArgumentError("metrics textfile needs a render function");
  struct stat st;
  if (::stat(options.dir.c_str(), &st) != 0) {
    return zcc::ErrnoToStatus(errno, absl::StrCat("metrics textfile directory ", options.dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics textfile directory ", options.dir, " is not a directory"));
  }

  auto impl = std::make_unique<Impl>();
  impl->path = JoinPath(options.dir, options.file_name);
  impl->options = std::move(options);
  impl->render = std::move(render);
  ZCC_RETURN_IF_ERROR(Annotate(impl->Write(), "metrics textfile"));
  Impl* raw = impl.get();
  {
    zcc::MutexLock lock(&raw->stop_mu);
    raw->thread = std::thread([raw] { raw->Run(); });
  }
  return TextfileWriter(std::move(impl));
}

TextfileWriter::TextfileWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TextfileWriter::TextfileWriter(TextfileWriter&&) noexcept = default;
TextfileWriter& TextfileWriter::operator=(TextfileWriter&&) noexcept = default;
TextfileWriter::~TextfileWriter() = default;

void TextfileWriter::Stop() {
  if (impl_ != nullptr) impl_->Stop();
}

const std::string& TextfileWriter::path() const { return impl_->path; }

uint64_t TextfileWriter::writes() const { return impl_->writes.load(std::memory_order_relaxed); }

}  // namespace zcc::metrics
