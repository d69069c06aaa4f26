// A zccd child process on a private socket, shm prefix and checkpoint root,
// for the GPU checks that run without Bazel's test harness (daemon_pull_bench,
// nccl_restore_check). Killed (SIGTERM, then waited for) on destruction.
#ifndef ZCC_CUDA_ZCCD_PROCESS_H_
#define ZCC_CUDA_ZCCD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace zcc {

class ZccdProcess {
 public:
  // Starts `binary` with its socket and root in `dir` (its log in
  // dir/zccd.log) and `extra_flags`.
  ZccdProcess(const std::string& binary, const std::string& dir,
              const std::vector<std::string>& extra_flags);
  ~ZccdProcess();
  ZccdProcess(const ZccdProcess&) = delete;
  ZccdProcess& operator=(const ZccdProcess&) = delete;

  // Waits (at most 20 s) until the socket accepts connections; false when
  // zccd exited or never answered.
  bool WaitReady() const;
  const std::string& socket() const { return socket_; }
  const std::string& root() const { return root_; }
  // The directory (log, socket, checkpoints) is removed once zccd stopped;
  // kept otherwise, for a look at what failed.
  void RemoveDirWhenDone() { remove_dir_ = true; }

 private:
  std::string dir_;
  std::string socket_;
  std::string root_;
  pid_t pid_ = -1;
  bool remove_dir_ = false;
};

}  // namespace zcc

#endif  // ZCC_CUDA_ZCCD_PROCESS_H_
