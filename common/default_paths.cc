#include "common/default_paths.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace zcc {

std::string DefaultSocketPath() {
  if (::geteuid() == 0) return "/run/zcc/zccd.sock";
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] == '/') {
    return absl::StrCat(xdg, "/zcc/zccd.sock");
  }
  return absl::StrCat("/tmp/zcc-", ::geteuid(), "/zccd.sock");
}

}  // namespace zcc
