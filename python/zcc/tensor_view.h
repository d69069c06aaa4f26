// Reads a Python tensor's memory description (pointer, dtype, shape, device)
// from the standard exchange protocols, without linking any framework:
//
//   __cuda_array_interface__  (CuPy, Numba, PyTorch CUDA tensors)  device memory
//   __array_interface__       (NumPy and anything array-like)        host memory
//   __dlpack__                (PyTorch, JAX, CuPy, NumPy >= 1.22)    host or device
//
// tried in that order. zcc copies a tensor as one contiguous byte range, so the
// tensor must be C-contiguous (strides of size-1 dimensions are ignored) and
// writable (Restore fills it in place).
//
// Thread-safety: the caller holds the GIL. Ownership: the returned view keeps
// `owner` alive: the object itself for the array interfaces, and for DLPack
// a capsule that calls the producer's deleter when released. The memory stays
// valid while `owner` lives and the producer does not reallocate it.
#ifndef ZCC_PYTHON_ZCC_TENSOR_VIEW_H_
#define ZCC_PYTHON_ZCC_TENSOR_VIEW_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/dtype.h"

namespace zcc::python {

enum class MemoryKind { kHost, kDevice };

struct TensorView {
  format::DType dtype = format::DType::kF32;
  std::vector<int64_t> shape;
  void* data = nullptr;
  MemoryKind memory = MemoryKind::kHost;
  std::string protocol;  // "__array_interface__", "__cuda_array_interface__", "__dlpack__"
  pybind11::object owner;
};

// InvalidArgument, naming the problem, for an object that exposes none of the
// protocols, a non-contiguous or read-only tensor, a dtype zcc cannot store
// (complex, unsigned wider than 8 bits, big-endian, vector lanes, ...), or a
// malformed interface. Python exceptions raised by the protocol accessors are
// turned into InvalidArgument with their message (the Python error is cleared).
absl::StatusOr<TensorView> ViewTensor(pybind11::handle obj);

}  // namespace zcc::python

#endif  // ZCC_PYTHON_ZCC_TENSOR_VIEW_H_
