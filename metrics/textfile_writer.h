// Keeps a Prometheus text file for node_exporter's textfile collector up to
// date: <dir>/zccd.prom is rewritten every interval through a temporary file
// and a rename in the same directory, so the collector never reads a torn file
// (it only reads names ending in ".prom", so the temporary is never picked up).
#ifndef ZCC_METRICS_TEXTFILE_WRITER_H_
#define ZCC_METRICS_TEXTFILE_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace zcc::metrics {

struct TextfileWriterOptions {
  // An existing directory, absolute path.
  std::string dir;
  // Must end in ".prom" for node_exporter to read it.
  std::string file_name = "zccd.prom";
  absl::Duration interval = absl::Seconds(15);
};

// A move-only handle on the writer thread. Start writes the file once before
// returning (so a directory the daemon cannot write is reported at start),
// then rewrites it every `interval`; failures after that are logged once per
// change from working to failing. Stop (and the destructor) stops the thread
// promptly, joins it and writes the file a last time, so the final counts are
// on disk. `render` runs on the writer thread and must be thread-safe; it has
// to outlive the handle. Stop is thread-safe and idempotent.
class TextfileWriter {
 public:
  using RenderFn = std::function<std::string()>;

  static absl::StatusOr<TextfileWriter> Start(TextfileWriterOptions options, RenderFn render);

  TextfileWriter(TextfileWriter&&) noexcept;
  TextfileWriter& operator=(TextfileWriter&&) noexcept;
  ~TextfileWriter();

  void Stop();
  // <dir>/<file_name>.
  const std::string& path() const;
  // Successful writes so far, the one in Start included.
  uint64_t writes() const;

 private:
  struct Impl;
  explicit TextfileWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zcc::metrics

#endif  // ZCC_METRICS_TEXTFILE_WRITER_H_
