#include "python/zcc/py_collective.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace py = pybind11;

namespace zcc::python {

PyCollective::PyCollective(uint32_t rank, uint32_t size, py::object all_gather,
                           py::object broadcast_many)
    : rank_(rank),
      size_(size),
      all_gather_(std::move(all_gather)),
      broadcast_many_(std::move(broadcast_many)) {}

PyCollective::~PyCollective() {
  // The callables are Python objects: released with the GIL held.
  py::gil_scoped_acquire gil;
  all_gather_ = py::object();
  broadcast_many_ = py::object();
}

absl::StatusOr<std::vector<std::string>> PyCollective::AllGather(absl::string_view mine) {
  py::gil_scoped_acquire gil;
  try {
    py::list all = all_gather_(py::bytes(mine.data(), mine.size()));
    std::vector<std::string> out;
    out.reserve(all.size());
    for (py::handle h : all) out.push_back(h.cast<std::string>());
    if (out.size() != size_) {
      return absl::DataLossError(absl::StrCat("collective: all_gather gave ", out.size(),
                                              " messages for ", size_, " ranks"));
    }
    return out;
  } catch (py::error_already_set& e) {
    return absl::UnavailableError(absl::StrCat("collective: all_gather: ", e.what()));
  } catch (py::cast_error& e) {
    return absl::DataLossError(absl::StrCat("collective: all_gather: ", e.what()));
  }
}

absl::Status PyCollective::Broadcast(void* data, uint64_t bytes, uint32_t root, void* stream) {
  return BroadcastMany({Region{data, bytes}}, root, stream);
}

absl::Status PyCollective::BroadcastMany(const std::vector<Region>& regions, uint32_t root,
                                         void*) {
  py::gil_scoped_acquire gil;
  try {
    py::list pieces;
    for (const Region& r : regions) {
      pieces.append(py::make_tuple(reinterpret_cast<uintptr_t>(r.data), r.bytes));
    }
    broadcast_many_(pieces, root);
    return absl::OkStatus();
  } catch (py::error_already_set& e) {
    return absl::UnavailableError(absl::StrCat("collective: broadcast from rank ", root, ": ",
                                               e.what()));
  }
}

}  // namespace zcc::python
