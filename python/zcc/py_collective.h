// PyCollective: a Collective (common/collective.h) whose calls are Python
// callables, so that zcc.torch restores together through the same protocol
// as C++ trainers (Client::RestoreTogether), over torch.distributed:
//   all_gather(bytes) -> list of bytes, one per rank;
//   broadcast_many(list of (address, nbytes), root) -> None: the regions, in
//     order, from `root` to every rank (address 0: a rank that does not keep
//     them; it still takes part).
// A Python exception becomes an Unavailable status (the collective is then
// broken, as Collective says), its text kept.
//
// Thread-safety: called from the thread that runs the restore, which holds no
// GIL then; each call takes the GIL.
#ifndef ZCC_PYTHON_ZCC_PY_COLLECTIVE_H_
#define ZCC_PYTHON_ZCC_PY_COLLECTIVE_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/collective.h"

namespace zcc::python {

class PyCollective final : public Collective {
 public:
  PyCollective(uint32_t rank, uint32_t size, pybind11::object all_gather,
               pybind11::object broadcast_many);
  ~PyCollective() override;

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view mine) override;
  absl::Status Broadcast(void* data, uint64_t bytes, uint32_t root, void* stream) override;
  absl::Status BroadcastMany(const std::vector<Region>& regions, uint32_t root,
                             void* stream) override;

 private:
  const uint32_t rank_;
  const uint32_t size_;
  pybind11::object all_gather_;
  pybind11::object broadcast_many_;
};

}  // namespace zcc::python

#endif  // ZCC_PYTHON_ZCC_PY_COLLECTIVE_H_
