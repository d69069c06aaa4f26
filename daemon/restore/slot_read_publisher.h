// Publishes a restore's read into a staging slot as it goes
// (shm/restore_progress.h): the registered tensors checked so far, as the
// longest prefix in registration order, so that the client copies them out
// while the rest is read. Tensors the read does not fill (another replica's)
// count as checked: there is nothing of them to wait for.
//
// Thread-safety: Checked is called from the one reading thread.
#ifndef ZCC_DAEMON_RESTORE_SLOT_READ_PUBLISHER_H_
#define ZCC_DAEMON_RESTORE_SLOT_READ_PUBLISHER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "daemon/rank/registered_tensor.h"
#include "shm/control_block.h"

namespace zcc::daemon {

class SlotReadPublisher {
 public:
  // Begins a new attempt for `slot` in `cb`.
  SlotReadPublisher(shm::ControlBlock* cb, uint32_t slot,
                    const std::vector<RegisteredTensor>& registered);

  // registered[i]'s bytes are in the slot and checked.
  void Checked(size_t i);

 private:
  void Advance();

  shm::ControlBlock* const cb_;
  const uint64_t attempt_;
  std::vector<bool> done_;
  size_t prefix_ = 0;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_SLOT_READ_PUBLISHER_H_
