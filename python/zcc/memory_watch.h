// zcc._zcc.MemoryWatch: whether a few ranges of other objects' memory (the
// words of Python's and NumPy's random generators) changed since the last
// look, at the cost of a memcmp. zcc._rng_state reads a generator's state
// through its public API (tens of microseconds, paid at every snapshot)
// only when its words moved.
#ifndef ZCC_PYTHON_ZCC_MEMORY_WATCH_H_
#define ZCC_PYTHON_ZCC_MEMORY_WATCH_H_

#include <pybind11/pybind11.h>

namespace zcc::python {

// Adds MemoryWatch to `m`.
void DefineMemoryWatch(pybind11::module_& m);

}  // namespace zcc::python

#endif  // ZCC_PYTHON_ZCC_MEMORY_WATCH_H_
