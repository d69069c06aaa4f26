#include "cuda/zccd_process.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace zcc {

ZccdProcess::ZccdProcess(const std::string& binary, const std::string& dir,
                         const std::vector<std::string>& extra_flags)
    : dir_(dir), socket_(dir + "/zccd.sock"), root_(dir + "/ckpt") {
  std::vector<std::string> args = {binary, "--socket=" + socket_, "--root=" + root_,
                                   "--shm_prefix=zgc" + std::to_string(getpid())};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  const std::string log = dir + "/zccd.log";
  pid_ = fork();
  if (pid_ == 0) {
    if (std::freopen(log.c_str(), "w", stdout) == nullptr ||
        std::freopen(log.c_str(), "a", stderr) == nullptr) {
      _exit(126);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
}

ZccdProcess::~ZccdProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  if (remove_dir_) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

bool ZccdProcess::WaitReady() const {
  for (int i = 0; i < 2000; ++i) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (ok) return true;
    if (pid_ <= 0 || waitpid(pid_, nullptr, WNOHANG) == pid_) return false;
    usleep(10000);
  }
  return false;
}

}  // namespace zcc
