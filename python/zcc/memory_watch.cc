#include "python/zcc/memory_watch.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace zcc::python {
namespace {

namespace py = pybind11;

// Each owner is held, so its memory stays valid. Python's and NumPy's
// generators change their memory only under the GIL, which the check holds;
// torch's draws without it (zcc._torch_rng counts a read only when no change
// followed it).
class MemoryWatch {
 public:
  // (owner, address, length) per range; `address` lies inside `owner`,
  // which the caller has checked (zcc._rng_state compares what it reads
  // there with the generator's public state before watching it).
  explicit MemoryWatch(std::vector<std::tuple<py::object, uintptr_t, size_t>> ranges) {
    for (auto& [owner, address, length] : ranges) {
      if (owner.is_none() || address == 0) {
        throw py::value_error("MemoryWatch: a range needs an owner and an address");
      }
      const auto* p = reinterpret_cast<const char*>(address);
      ranges_.push_back(Range{std::move(owner), p, std::string(p, length)});
    }
  }

  // Whether any range differs from what it held at the last call (or at
  // construction); remembers what they hold now.
  bool Changed() {
    bool changed = false;
    for (Range& r : ranges_) {
      if (std::memcmp(r.address, r.last.data(), r.last.size()) != 0) {
        r.last.assign(r.address, r.last.size());
        changed = true;
      }
    }
    return changed;
  }

 private:
  struct Range {
    py::object owner;
    const char* address;
    std::string last;
  };
  std::vector<Range> ranges_;
};

}  // namespace

void DefineMemoryWatch(py::module_& m) {
  py::class_<MemoryWatch>(m, "MemoryWatch",
                          "Whether ranges of objects' memory changed since the last look "
                          "(zcc._rng_state: generators' words).")
      .def(py::init<std::vector<std::tuple<py::object, uintptr_t, size_t>>>(), py::arg("ranges"),
           "ranges: [(owner, address, length)]; each owner is held while watched.")
      .def("changed", &MemoryWatch::Changed,
           "Whether any range changed since the last call (or construction).");
}

}  // namespace zcc::python
