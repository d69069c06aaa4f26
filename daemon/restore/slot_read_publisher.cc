#include "daemon/restore/slot_read_publisher.h"

#include "shm/restore_progress.h"

namespace zcc::daemon {

SlotReadPublisher::SlotReadPublisher(shm::ControlBlock* cb, uint32_t slot,
                                     const std::vector<RegisteredTensor>& registered)
    : cb_(cb), attempt_(shm::BeginRestoreRead(cb, slot)), done_(registered.size(), false) {
  for (size_t i = 0; i < registered.size(); ++i) done_[i] = !registered[i].staged;
  Advance();
}

void SlotReadPublisher::Checked(size_t i) {
  if (i >= done_.size() || done_[i]) return;
  done_[i] = true;
  if (i == prefix_) Advance();
}

void SlotReadPublisher::Advance() {
  const size_t before = prefix_;
  while (prefix_ < done_.size() && done_[prefix_]) ++prefix_;
  if (prefix_ != before) shm::PublishRestoreReady(cb_, attempt_, prefix_);
}

}  // namespace zcc::daemon
