#include "storage/aligned_buffer.h"

#include <sys/mman.h>

#include <cstring>
#include <new>

namespace zcc::storage {

AlignedBuffer::AlignedBuffer(size_t size) : AlignedBuffer(Uninitialized(size)) {
  // Fresh mappings are zero already.
  if (mapped_ == 0) std::memset(data_, 0, size_);
}

AlignedBuffer AlignedBuffer::Uninitialized(size_t size) {
  AlignedBuffer b;
  b.size_ = size;
  if (size >= kHugeBufferBytes) {
    // Over-allocate by one huge page so the buffer can start on a boundary.
    const size_t length = AlignUp(size, kHugeBufferBytes) + kHugeBufferBytes;
    void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();  // as operator new would
    b.base_ = p;
    b.mapped_ = length;
    b.data_ = reinterpret_cast<uint8_t*>(AlignUp(reinterpret_cast<uintptr_t>(p), kHugeBufferBytes));
    // Advice only: without transparent huge pages the buffer still works.
    ::madvise(b.data_, AlignUp(size, kHugeBufferBytes), MADV_HUGEPAGE);
    return b;
  }
  b.data_ = static_cast<uint8_t*>(
      ::operator new (size == 0 ? 1 : size, std::align_val_t{kDirectIoAlignment}));
  return b;
}

void AlignedBuffer::Free() {
  if (mapped_ > 0) {
    ::munmap(base_, mapped_);
  } else if (data_ != nullptr) {
    ::operator delete (data_, std::align_val_t{kDirectIoAlignment});
  }
  data_ = nullptr;
  base_ = nullptr;
  size_ = mapped_ = 0;
}

}  // namespace zcc::storage
