#include "metrics/textfile_writer.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/testing/eventually.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "metrics/metrics.h"
#include "metrics/testing/exposition_parser.h"

namespace zcc::metrics {
namespace {

using ::zcc::testing::Eventually;
using ::zcc::testing::TempDir;

TEST_CASE("the textfile is written at start, rewritten every interval and parses") {
  const std::string dir = TempDir();
  ZccMetrics m;
  TextfileWriterOptions options;
  options.dir = dir;
  options.interval = absl::Milliseconds(20);
  absl::StatusOr<TextfileWriter> w =
      TextfileWriter::Start(options, [&m] { return m.RenderPrometheusText(); });
  REQUIRE_OK(w);
  CHECK(w->path() == dir + "/zccd.prom");
  CHECK(w->writes() >= 1);
  // Written before Start returned.
  absl::StatusOr<std::string> first = ReadFileToString(w->path(), 1 << 20);
  REQUIRE_OK(first);
  REQUIRE_OK(testing::ParseExposition(*first));

  m.snapshots().Increment(5);
  const uint64_t before = w->writes();
  REQUIRE(Eventually([&] { return w->writes() >= before + 3; }, absl::Seconds(10)));
  absl::StatusOr<std::string> text = ReadFileToString(w->path(), 1 << 20);
  REQUIRE_OK(text);
  absl::StatusOr<testing::Exposition> e = testing::ParseExposition(*text);
  REQUIRE_OK(e);
  CHECK(e->Value("zcc_snapshots_total") == 5);

  // Stop writes the final counts.
  m.snapshots().Increment(2);
  w->Stop();
  w->Stop();  // idempotent
  text = ReadFileToString(w->path(), 1 << 20);
  REQUIRE_OK(text);
  e = testing::ParseExposition(*text);
  REQUIRE_OK(e);
  CHECK(e->Value("zcc_snapshots_total") == 7);

  // Nothing but the .prom file is left behind.
  absl::StatusOr<std::vector<std::string>> names = ListDir(dir);
  REQUIRE_OK(names);
  CHECK(*names == std::vector<std::string>{"zccd.prom"});
  REQUIRE_OK(RemoveTree(dir));
}

TEST_CASE("readers never see a torn textfile") {
  const std::string dir = TempDir();
  std::atomic<uint64_t> generation{0};
  // Large and different every time, with a trailer that names the generation.
  auto render = [&generation] {
    const uint64_t g = generation.fetch_add(1);
    std::string body = absl::StrCat("# generation ", g, "\n");
    body.append(200000, 'x');
    absl::StrAppend(&body, "\n# end ", g, "\n");
    return body;
  };
  TextfileWriterOptions options;
  options.dir = dir;
  options.file_name = "big.prom";
  options.interval = absl::Milliseconds(1);
  absl::StatusOr<TextfileWriter> w = TextfileWriter::Start(options, render);
  REQUIRE_OK(w);
  int reads = 0;
  const uint64_t target = w->writes() + 30;
  while (w->writes() < target) {
    absl::StatusOr<std::string> text = ReadFileToString(w->path(), 1 << 20);
    REQUIRE_OK(text);
    const size_t nl = text->find('\n');
    REQUIRE(nl != std::string::npos);
    const std::string gen = text->substr(strlen("# generation "), nl - strlen("# generation "));
    INFO(gen);
    REQUIRE(absl::EndsWith(*text, absl::StrCat("\n# end ", gen, "\n")));
    REQUIRE(text->size() == nl + 1 + 200000 + strlen("\n# end \n") + gen.size());
    ++reads;
  }
  w->Stop();
  CHECK(reads > 0);
  REQUIRE_OK(RemoveTree(dir));
}

TEST_CASE("Stop is prompt even with a long interval") {
  const std::string dir = TempDir();
  TextfileWriterOptions options;
  options.dir = dir;
  options.interval = absl::Hours(1);
  absl::StatusOr<TextfileWriter> w = TextfileWriter::Start(options, [] { return std::string(); });
  REQUIRE_OK(w);
  const absl::Time start = absl::Now();
  { TextfileWriter moved = std::move(*w); }  // the destructor stops it
  CHECK(absl::Now() - start < absl::Seconds(5));  // not the hour
  REQUIRE_OK(RemoveTree(dir));
}

TEST_CASE("bad options and unwritable directories are reported at Start") {
  auto render = [] { return std::string(); };
  TextfileWriterOptions options;
  options.dir = "relative/dir";
  CHECK(TextfileWriter::Start(options, render).status().code() ==
        absl::StatusCode::kInvalidArgument);
  options.dir = "/nonexistent/zcc_textfile_test";
  absl::StatusOr<TextfileWriter> missing = TextfileWriter::Start(options, render);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains(options.dir));

  const std::string dir = TempDir();
  options.dir = dir;
  options.file_name = "zccd.txt";  // node_exporter would ignore it
  CHECK(TextfileWriter::Start(options, render).status().code() ==
        absl::StatusCode::kInvalidArgument);
  options.file_name = "zccd.prom";
  options.interval = absl::ZeroDuration();
  CHECK(TextfileWriter::Start(options, render).status().code() ==
        absl::StatusCode::kInvalidArgument);
  options.interval = absl::Seconds(1);
  CHECK(TextfileWriter::Start(options, nullptr).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A file where the directory should be.
  options.dir = dir + "/file";
  REQUIRE_OK(WriteFileAtomic(options.dir, "x"));
  CHECK(TextfileWriter::Start(options, render).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  if (::geteuid() != 0) {  // root writes anywhere
    options.dir = dir + "/ro";
    REQUIRE_OK(MakeDirs(options.dir));
    REQUIRE(::chmod(options.dir.c_str(), 0555) == 0);
    CHECK(TextfileWriter::Start(options, render).status().code() ==
          absl::StatusCode::kPermissionDenied);
  }
  REQUIRE_OK(RemoveTree(dir));
}

}  // namespace
}  // namespace zcc::metrics
