#include "shm/truncation_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/status.h"

namespace zcc::shm {

namespace {

struct Guarded {
  // 0: free. Claimed by a CAS from 0; `end` is written after and cleared
  // before `begin`, so the handler never matches a half-written entry.
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> cut{false};
};

constexpr int kMaxGuarded = 4096;
Guarded g_table[kMaxGuarded];
std::atomic<bool> g_installed{false};
struct sigaction g_previous;

// Async-signal-safe: atomics, mmap (a plain system call on Linux), sigaction
// and raise only.
void OnSigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
  if (info->si_code > 0) {  // raised by a fault, not sent by kill()
    // Passes again where an entry changed as it was read (a Resize).
    for (int pass = 0; pass < 4; ++pass) {
      bool changed = false;
      for (Guarded& g : g_table) {
        const uintptr_t begin = g.begin.load(std::memory_order_acquire);
        if (begin == 0 || at < begin) continue;
        const uintptr_t end = g.end.load(std::memory_order_acquire);
        // `end` is of the same entry as `begin` only if `begin` still is.
        if (g.begin.load(std::memory_order_acquire) != begin) {
          changed = true;
          continue;
        }
        if (at >= end) continue;
        // Zero pages over the whole mapping: every later access, by any
        // thread, reads zeros instead of faulting again.
        void* p = ::mmap(reinterpret_cast<void*>(begin), end - begin, PROT_READ | PROT_WRITE,
                         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) break;
        g.cut.store(true, std::memory_order_release);
        return;  // the access runs again, on the zero pages
      }
      if (!changed) break;
    }
  }
  // Not a guarded mapping: what the process did before the guard.
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // A signal sent to a process that ignored it stays ignored.
  if (g_previous.sa_handler == SIG_IGN && info->si_code <= 0) return;
  // Otherwise it ends the process, as it would have: pending (blocked in
  // here) until the handler returns, at the access that raised it.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGBUS, &dfl, nullptr);
  ::raise(SIGBUS);
}

}  // namespace

absl::Status InstallTruncationGuard() {
  if (TruncationGuardInstalled()) return absl::OkStatus();
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = OnSigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGBUS, &sa, &g_previous) != 0) {
    return zcc::ErrnoToStatus(errno, "install the SIGBUS handler for shared memory");
  }
  g_installed.store(true);
  return absl::OkStatus();
}

bool TruncationGuardInstalled() {
  // The handler in place now (a later sigaction may have replaced it).
  struct sigaction current;
  return g_installed.load() && ::sigaction(SIGBUS, nullptr, &current) == 0 &&
         (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == OnSigbus;
}

namespace internal {

int GuardMapping(void* addr, uint64_t bytes) {
  if (!g_installed.load(std::memory_order_acquire) || addr == nullptr || bytes == 0) return -1;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr);
  for (int i = 0; i < kMaxGuarded; ++i) {
    uintptr_t expected = 0;
    if (g_table[i].begin.load(std::memory_order_relaxed) != 0) continue;
    if (!g_table[i].begin.compare_exchange_strong(expected, begin, std::memory_order_acq_rel)) {
      continue;
    }
    // (Unmatched until `end` is set.)
    g_table[i].cut.store(false, std::memory_order_relaxed);
    g_table[i].end.store(begin + bytes, std::memory_order_release);
    return i;
  }
  return -1;
}

void ShrinkGuardedMapping(int handle, uint64_t bytes) {
  if (handle < 0) return;
  Guarded& g = g_table[handle];
  g.end.store(g.begin.load(std::memory_order_relaxed) + bytes, std::memory_order_release);
}

bool GuardedMappingCut(int handle) {
  return handle >= 0 && g_table[handle].cut.load(std::memory_order_acquire);
}

void UnguardMapping(int handle) {
  if (handle < 0) return;
  g_table[handle].end.store(0, std::memory_order_release);
  g_table[handle].begin.store(0, std::memory_order_release);
}

}  // namespace internal

}  // namespace zcc::shm
