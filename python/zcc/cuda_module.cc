// The CUDA copier for Python: an extension module of its own, so that
// `import zcc` never loads the CUDA runtime. zcc.cuda_copier() imports it the
// first time a client needs to copy device memory; the dynamic linker then
// loads libcudart (already in the process when PyTorch with CUDA was imported
// first, else found through the module's run paths), and a machine without
// CUDA gets an ImportError that zcc turns into a FailedPreconditionError.
//
// The module hands the copier to _zcc.so as a "zcc.DeviceCopier" capsule
// holding a std::shared_ptr<zcc::DeviceCopier>* (python/zcc/module.cc,
// CopierFrom). Built twice from this file: _zcc_cuda.so against libcudart,
// and, for tests without a GPU, _zcc_cuda_fake.so against the fake CUDA
// runtime (cuda/fake_cudart), which also exposes the fake's "device" memory
// (host memory the fake tracks) as buffers with __cuda_array_interface__.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "copy/device_copier.h"
#include "cuda/cuda_copier.h"
#include "cuda/ipc_pull_copier.h"
#include "python/zcc/capsules.h"

#ifdef ZCC_FAKE_CUDART
#include "cuda/fake_cudart/fake_cudart.h"
#endif

namespace py = pybind11;

namespace zcc {
namespace {

// (capsule, None) or (None, (code name, message)): errors are raised by
// the Python side as zcc.errors classes, which this module does not link.
py::tuple Copier(int device, uint64_t chunk_bytes) {
  CudaCopierOptions options;
  options.device = device;
  options.chunk_bytes = static_cast<size_t>(chunk_bytes);
  absl::StatusOr<std::unique_ptr<DeviceCopier>> copier;
  {
    py::gil_scoped_release release;  // creating a CUDA context takes a while
    copier = NewCudaCopier(options);
  }
  if (!copier.ok()) {
    return py::make_tuple(py::none(), py::make_tuple(absl::StatusCodeToString(copier.status().code()),
                                                     std::string(copier.status().message())));
  }
  auto* held = new std::shared_ptr<DeviceCopier>(std::move(*copier));
  py::capsule capsule(held, kCopierCapsule, [](PyObject* o) {
    delete static_cast<std::shared_ptr<DeviceCopier>*>(PyCapsule_GetPointer(o, kCopierCapsule));
  });
  return py::make_tuple(capsule, py::none());
}

// Daemon-pull's copier factory for a client (ClientOptions::daemon_pull_copier),
// as a "zcc.DaemonPull" capsule (capsules.h; module.cc reads it).
py::capsule DaemonPull(int device) {
  auto* choice = new DaemonPullChoice;
  choice->device = device;
  choice->factory = [](IpcPullCopierOptions options)
      -> absl::StatusOr<std::shared_ptr<DeviceCopier>> {
    absl::StatusOr<std::unique_ptr<DeviceCopier>> made = NewIpcPullCopier(std::move(options));
    if (!made.ok()) return made.status();
    return std::shared_ptr<DeviceCopier>(std::move(*made));
  };
  return py::capsule(choice, kDaemonPullCapsule, [](PyObject* o) {
    delete static_cast<DaemonPullChoice*>(PyCapsule_GetPointer(o, kDaemonPullCapsule));
  });
}

#ifdef ZCC_FAKE_CUDART
// A block of the fake runtime's device memory, as a 1-D uint8 buffer with
// __cuda_array_interface__ (what zcc's tensor protocols read), plus host-side
// reads and writes (the fake's device memory is host memory).
class FakeDeviceBuffer {
 public:
  explicit FakeDeviceBuffer(size_t bytes)
      : bytes_(bytes), data_(fake_cudart::DeviceAlloc(bytes == 0 ? 1 : bytes)) {}
  ~FakeDeviceBuffer() { fake_cudart::DeviceFree(data_); }
  FakeDeviceBuffer(const FakeDeviceBuffer&) = delete;
  FakeDeviceBuffer& operator=(const FakeDeviceBuffer&) = delete;

  py::dict Interface() const {
    py::dict d;
    d["shape"] = py::make_tuple(bytes_);
    d["typestr"] = "|u1";
    d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(data_), false);
    d["version"] = 3;
    d["strides"] = py::none();
    d["stream"] = py::none();
    return d;
  }
  void Write(py::bytes raw) {
    const std::string s = raw;
    if (s.size() != bytes_) {
      throw py::value_error(absl::StrCat("write of ", s.size(), " bytes into ", bytes_));
    }
    std::memcpy(data_, s.data(), s.size());
  }
  py::bytes Read() const {
    return py::bytes(static_cast<const char*>(data_), bytes_);
  }
  size_t size() const { return bytes_; }

 private:
  size_t bytes_;
  void* data_;
};
#endif

}  // namespace
}  // namespace zcc

PYBIND11_MODULE(ZCC_CUDA_MODULE_NAME, m) {
  m.doc() = "zcc's CUDA copier (use zcc.cuda_copier()).";
  m.def("copier", &zcc::Copier, py::arg("device") = 0, py::arg("chunk_bytes") = uint64_t{64} << 20,
        "(capsule, None), or (None, (status code name, message)) when no copier can be made.");
  m.def("device_available", &zcc::CudaDeviceAvailable);
  m.def("daemon_pull", &zcc::DaemonPull, py::arg("device") = 0,
        "A 'zcc.DaemonPull' capsule: connect(copier=...) asks zccd to copy the device tensors.");
#ifdef ZCC_FAKE_CUDART
  py::class_<zcc::FakeDeviceBuffer>(m, "FakeDeviceBuffer")
      .def(py::init<size_t>())
      .def_property_readonly("__cuda_array_interface__", &zcc::FakeDeviceBuffer::Interface)
      .def("write", &zcc::FakeDeviceBuffer::Write)
      .def("read", &zcc::FakeDeviceBuffer::Read)
      .def("__len__", &zcc::FakeDeviceBuffer::size);
  m.def("device_copies", [] {
    int64_t n = 0;
    for (const auto& c : zcc::fake_cudart::Copies()) n += c.bytes > 0 ? 1 : 0;
    return n;
  }, "cudaMemcpyAsync calls the fake has seen.");
#endif
}
