#include "client/early_copy.h"

#include <algorithm>
#include <utility>

#include "shm/restore_progress.h"

namespace zcc::client_internal {

EarlyCopy::EarlyCopy(const Session& session, const std::vector<TensorRef>& refs,
                     const std::vector<bool>& early, void* stream)
    : session_(session), refs_(refs), early_(early), stream_(stream) {
  copied_.tensors.assign(refs_.size(), false);
  thread_ = std::thread([this] { Run(); });
}

EarlyCopy::~EarlyCopy() { Stop(); }

EarlyCopy::Copied EarlyCopy::Stop() {
  if (thread_.joinable()) {
    stop_.store(true);
    shm::WakeRestoreWaiters(session_.cb());
    thread_.join();
  }
  return copied_;
}

void EarlyCopy::Run() {
  shm::ControlBlock* cb = session_.cb();
  const v1::RegisterResponse& reg = session_.resp;
  const size_t n = std::min<size_t>(refs_.size(), reg.placements_size());
  size_t next = 0;  // tensors before it are copied or not to be, for the attempt
  while (!stop_.load()) {
    const uint32_t bell = cb->restore_bell.load(std::memory_order_acquire);
    const shm::RestoreProgress p = shm::ReadRestoreProgress(*cb);
    if (p.attempt != copied_.attempt) {
      copied_.attempt = p.attempt;
      copied_.tensors.assign(refs_.size(), false);
      next = 0;
    }
    // (Not a read of before this restore: its slot may hold anything now.)
    const bool this_restores = p.attempt > session_.early_copy_floor.load();
    if (this_restores && p.slot < session_.num_slots() && copied_.status.ok()) {
      const size_t ready = std::min<uint64_t>(p.ready, n);
      std::vector<CopyRegion> regions;
      const uint8_t* base = session_.slot(p.slot);
      for (size_t i = next; i < ready; ++i) {
        const v1::TensorPlacement& place = reg.placements(i);
        if (i >= early_.size() || !early_[i] || !place.staged() || place.nbytes() == 0) continue;
        if (place.offset() > reg.slot_bytes() || place.nbytes() > reg.slot_bytes() - place.offset()) {
          continue;  // CopyOut reports an inconsistent placement
        }
        regions.push_back(CopyRegion{base + place.offset(), refs_[i].data, place.nbytes()});
        copied_.tensors[i] = true;
      }
      next = std::max(next, ready);
      if (!regions.empty()) {
        copied_.status = session_.pins->Await(base, reg.slot_bytes());
        if (copied_.status.ok()) copied_.status = session_.copier->CopyToDevice(regions, stream_);
      }
      if (!copied_.status.ok()) copied_.tensors.assign(refs_.size(), false);
    }
    if (stop_.load()) break;
    shm::WaitForRestoreProgress(cb, bell);
  }
}

}  // namespace zcc::client_internal
