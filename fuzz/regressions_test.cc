// Replays every seed (fuzz/corpus/<target>/) and every input a fuzzer once
// crashed on (fuzz/regressions/<target>/) through the same entry points the
// libFuzzer binaries use, in the normal gcc build: each must return, with all
// of the entry point's checks holding. A failing check aborts the test; the
// abort handler below names the input first.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.h"

namespace zcc::fuzz {
namespace {

// The input being replayed, for the crash handler (async-signal-safe use only).
char g_current[4096];

void OnFatalSignal(int sig) {
  const char prefix[] = "\n*** crashed while replaying: ";
  ssize_t ignored = write(STDERR_FILENO, prefix, sizeof(prefix) - 1);
  ignored = write(STDERR_FILENO, g_current, strnlen(g_current, sizeof(g_current)));
  ignored = write(STDERR_FILENO, "\n", 1);
  (void)ignored;
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallCrashHandler() {
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, OnFatalSignal);
}

std::string FuzzDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir != nullptr ? std::string(srcdir) + "/zcc/fuzz" : std::string("fuzz");
}

// Regular files of `dir` (none if it does not exist), sorted.
std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return files;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;  // ., .., .gitkeep
    files.push_back(dir + "/" + e->d_name);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Calls the target as libFuzzer does: on a heap copy of exactly the input's
// size (so that ASan builds catch reads past it), never a null pointer.
int Run(const FuzzTarget& target, const uint8_t* data, size_t size) {
  const std::unique_ptr<uint8_t[]> exact(new uint8_t[size]);
  std::copy(data, data + size, exact.get());
  return target.fn(exact.get(), size);
}

// Replays the files; returns how many.
size_t Replay(const FuzzTarget& target, const std::vector<std::string>& files) {
  for (const std::string& path : files) {
    std::snprintf(g_current, sizeof(g_current), "%s %s", target.name, path.c_str());
    const std::string bytes = ReadAll(path);
    REQUIRE(Run(target, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == 0);
  }
  return files.size();
}

TEST_CASE("every seed and regression input replays through its fuzz target") {
  InstallCrashHandler();
  size_t total = 0;
  for (const FuzzTarget& target : kFuzzTargets) {
    const std::vector<std::string> seeds = FilesIn(FuzzDir() + "/corpus/" + target.name);
    const std::vector<std::string> regressions = FilesIn(FuzzDir() + "/regressions/" + target.name);
    INFO(target.name);
    CHECK(seeds.size() >= 3);  // every target ships a seed corpus
    const size_t n = Replay(target, seeds) + Replay(target, regressions);
    std::printf("%-22s %zu seed(s), %zu regression input(s)\n", target.name, seeds.size(),
                regressions.size());
    total += n;
  }
  CHECK(total > 0);
}

TEST_CASE("fuzz targets accept empty and tiny inputs") {
  InstallCrashHandler();
  const uint8_t bytes[16] = {0xff, 0x00, '{', '}', 0x08, 0, 0, 0, 0, 0, 0, 0, 's', 't', 'e', 'p'};
  for (const FuzzTarget& target : kFuzzTargets) {
    for (size_t n = 0; n <= sizeof(bytes); ++n) {
      std::snprintf(g_current, sizeof(g_current), "%s (first %zu built-in bytes)", target.name, n);
      REQUIRE(Run(target, bytes, n) == 0);
    }
  }
}

}  // namespace
}  // namespace zcc::fuzz
