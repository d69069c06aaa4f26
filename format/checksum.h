// Per-tensor checksums: XXH3-64 (libxxhash), streaming so that a tensor can be
// hashed chunk by chunk while it is written or read.
#ifndef ZCC_FORMAT_CHECKSUM_H_
#define ZCC_FORMAT_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace zcc::format {

uint64_t Xxh3(const void* data, size_t nbytes);

// Incremental XXH3-64; Update() in any chunking gives the same Digest() as one
// Xxh3() over the concatenation. Not thread-safe; movable.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(Xxh3Stream&&) noexcept;
  Xxh3Stream& operator=(Xxh3Stream&&) noexcept;

  void Update(const void* data, size_t nbytes);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace zcc::format

#endif  // ZCC_FORMAT_CHECKSUM_H_
