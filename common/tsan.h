// Happens-before edges that ThreadSanitizer cannot see, made explicit.
//
// Some orders in zccd run through another process: zccd's copy thread fills
// a staging slot (daemon-pull), the trainer sees the copy done and publishes
// the slot, zccd's ingest takes it; or zccd frees a slot, the trainer claims
// it and asks zccd to fill it again. Each step is a release/acquire pair on
// shared memory, so the order holds, but TSan tracks one process and sees
// two zccd threads touch the slot with nothing between them. TsanRelease /
// TsanAcquire on the same address (the segment's start) state the edge; they
// compile to nothing outside TSan builds (as zcc::Mutex's annotations,
// common/mutex.h).
#ifndef ZCC_COMMON_TSAN_H_
#define ZCC_COMMON_TSAN_H_

#if defined(__SANITIZE_THREAD__)
#define ZCC_TSAN_ANNOTATE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZCC_TSAN_ANNOTATE 1
#endif
#endif

#ifdef ZCC_TSAN_ANNOTATE
#include <sanitizer/tsan_interface.h>
#endif

namespace zcc {

inline void TsanRelease(const void* addr) {
#ifdef ZCC_TSAN_ANNOTATE
  __tsan_release(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}

inline void TsanAcquire(const void* addr) {
#ifdef ZCC_TSAN_ANNOTATE
  __tsan_acquire(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}

}  // namespace zcc

#endif  // ZCC_COMMON_TSAN_H_
