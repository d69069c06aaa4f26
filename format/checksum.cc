#include "format/checksum.h"

#include <xxhash.h>

#include <new>

namespace zcc::format {

struct Xxh3Stream::State {
  struct Free {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  std::unique_ptr<XXH3_state_t, Free> xxh;

  State() : xxh(XXH3_createState()) {
    if (xxh == nullptr) throw std::bad_alloc();  // as operator new would
    XXH3_64bits_reset(xxh.get());
  }
};

uint64_t Xxh3(const void* data, size_t nbytes) { return XXH3_64bits(data, nbytes); }

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) {}
Xxh3Stream::~Xxh3Stream() = default;
Xxh3Stream::Xxh3Stream(Xxh3Stream&&) noexcept = default;
Xxh3Stream& Xxh3Stream::operator=(Xxh3Stream&&) noexcept = default;

// A moved-from stream has no state; it behaves as a fresh one (Update
// allocates, Digest is the hash of nothing) instead of crashing.
void Xxh3Stream::Update(const void* data, size_t nbytes) {
  if (state_ == nullptr) state_ = std::make_unique<State>();
  XXH3_64bits_update(state_->xxh.get(), data, nbytes);
}

uint64_t Xxh3Stream::Digest() const {
  if (state_ == nullptr) return XXH3_64bits(nullptr, 0);
  return XXH3_64bits_digest(state_->xxh.get());
}

}  // namespace zcc::format
