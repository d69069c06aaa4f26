#ifndef ZCC_COMMON_MUTEX_H_
#define ZCC_COMMON_MUTEX_H_

// zcc's mutex: absl::Mutex, made visible to ThreadSanitizer.
//
// Debian ships Abseil built without -fsanitize=thread, so a TSan build of zcc
// cannot see the synchronisation inside absl::Mutex (futexes and atomics in
// uninstrumented code): every access guarded by one would be reported as a
// race. zcc::Mutex forwards to an absl::Mutex and, in TSan builds only, tells
// TSan what the lock means: releasing it (Unlock, or waiting in Await) is a
// release, taking it (Lock, or returning from Await) an acquire, both on the
// mutex's address. Outside TSan builds the annotations compile to nothing and
// zcc::Mutex is an absl::Mutex with a narrower API.
//
// Use it, and zcc::MutexLock / zcc::ReleasableMutexLock, wherever zcc code
// would use absl::Mutex; the thread-safety annotations (ABSL_GUARDED_BY(mu_),
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)) work on it as on absl::Mutex.
// Conditions are absl::Condition: Await re-evaluates them whenever the mutex
// is released, so no separate signalling is needed.
//
// Thread-safety: a mutex. Not copyable or movable.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#if defined(__SANITIZE_THREAD__)
#define ZCC_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZCC_THREAD_SANITIZER 1
#endif
#endif

#ifdef ZCC_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace zcc {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    Acquired();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    Releasing();
    mu_.Unlock();
  }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() { mu_.AssertHeld(); }

  // Releases the mutex until `condition` holds, then holds it again.
  void Await(const absl::Condition& condition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    Releasing();
    mu_.Await(condition);
    Acquired();
  }
  // As Await, giving up after `timeout`; returns whether `condition` holds.
  // The mutex is held again on return either way.
  bool AwaitWithTimeout(const absl::Condition& condition, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    Releasing();
    const bool met = mu_.AwaitWithTimeout(condition, timeout);
    Acquired();
    return met;
  }
  bool AwaitWithDeadline(const absl::Condition& condition, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    Releasing();
    const bool met = mu_.AwaitWithDeadline(condition, deadline);
    Acquired();
    return met;
  }

 private:
  void Acquired() {
#ifdef ZCC_THREAD_SANITIZER
    __tsan_acquire(this);
#endif
  }
  void Releasing() {
#ifdef ZCC_THREAD_SANITIZER
    __tsan_release(this);
#endif
  }

  absl::Mutex mu_;
};

// Holds `mu` for its lifetime.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Holds `mu` until Release() or the end of its lifetime, whichever is first.
class ABSL_SCOPED_LOCKABLE ReleasableMutexLock {
 public:
  explicit ReleasableMutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~ReleasableMutexLock() ABSL_UNLOCK_FUNCTION() {
    if (mu_ != nullptr) mu_->Unlock();
  }
  void Release() ABSL_UNLOCK_FUNCTION() {
    mu_->Unlock();
    mu_ = nullptr;
  }
  ReleasableMutexLock(const ReleasableMutexLock&) = delete;
  ReleasableMutexLock& operator=(const ReleasableMutexLock&) = delete;

 private:
  Mutex* mu_;
};

}  // namespace zcc

#endif  // ZCC_COMMON_MUTEX_H_
