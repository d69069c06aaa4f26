#include "python/zcc/tensor_view.h"

#include <Python.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zcc::python {
namespace py = pybind11;
namespace {

// DLPack's C ABI (dmlc/dlpack, dlpack.h v0.x "dltensor" capsules), declared
// here because Debian ships no dlpack header. Only the layout matters.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

enum DLDeviceType : int32_t {
  kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLROCM = 10, kDLROCMHost = 11, kDLCUDAManaged = 13,
};
enum DLDataTypeCode : uint8_t {
  kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6,
};

constexpr char kDlpackName[] = "dltensor";
constexpr char kUsedDlpackName[] = "used_dltensor";
constexpr char kOwnerName[] = "zcc.dlpack_owner";

absl::Status Invalid(absl::string_view protocol, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(protocol, ": ", what));
}

// The message of the pending Python exception (which is cleared).
std::string TakePythonError() {
  py::error_already_set e;
  return e.what();
}

// obj.<name>, or None when the attribute does not exist (AttributeError);
// other exceptions raised by the accessor become an error.
absl::StatusOr<py::object> OptionalAttr(py::handle obj, const char* name) {
  PyObject* value = PyObject_GetAttrString(obj.ptr(), name);
  if (value != nullptr) return py::reinterpret_steal<py::object>(value);
  if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
    PyErr_Clear();
    return py::object(py::none());
  }
  return Invalid(name, TakePythonError());
}

absl::StatusOr<format::DType> DTypeFromTypestr(absl::string_view protocol, const std::string& typestr) {
  if (typestr.size() < 3) return Invalid(protocol, absl::StrCat("bad typestr '", typestr, "'"));
  const char order = typestr[0];
  const char kind = typestr[1];
  const std::string size = typestr.substr(2);
  const bool one_byte = size == "1";
  if (order == '>' && !one_byte) {
    return Invalid(protocol, absl::StrCat("big-endian dtype '", typestr, "' is not supported"));
  }
  if (order != '<' && order != '|' && order != '=' && order != '>') {
    return Invalid(protocol, absl::StrCat("bad typestr '", typestr, "'"));
  }
  if (kind == 'f' && size == "2") return format::DType::kF16;
  if (kind == 'f' && size == "4") return format::DType::kF32;
  if (kind == 'f' && size == "8") return format::DType::kF64;
  if (kind == 'i' && size == "1") return format::DType::kI8;
  if (kind == 'i' && size == "2") return format::DType::kI16;
  if (kind == 'i' && size == "4") return format::DType::kI32;
  if (kind == 'i' && size == "8") return format::DType::kI64;
  if (kind == 'u' && size == "1") return format::DType::kU8;
  if (kind == 'b' && size == "1") return format::DType::kBool;
  return Invalid(protocol, absl::StrCat("dtype '", typestr,
                                        "' is not supported (zcc stores F64, F32, F16, BF16, I64, "
                                        "I32, I16, I8, U8 and BOOL)"));
}

absl::StatusOr<format::DType> DTypeFromDlpack(const DLDataType& t) {
  constexpr absl::string_view kProto = "__dlpack__";
  if (t.lanes != 1) return Invalid(kProto, absl::StrCat("vector dtypes (", t.lanes, " lanes) are not supported"));
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 16) return format::DType::kF16;
      if (t.bits == 32) return format::DType::kF32;
      if (t.bits == 64) return format::DType::kF64;
      break;
    case kDLBfloat:
      if (t.bits == 16) return format::DType::kBF16;
      break;
    case kDLInt:
      if (t.bits == 8) return format::DType::kI8;
      if (t.bits == 16) return format::DType::kI16;
      if (t.bits == 32) return format::DType::kI32;
      if (t.bits == 64) return format::DType::kI64;
      break;
    case kDLUInt:
      if (t.bits == 8) return format::DType::kU8;
      break;
    case kDLBool:
      if (t.bits == 8) return format::DType::kBool;
      break;
    default:
      break;
  }
  static const char* const kCodes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string code = t.code < 7 ? kCodes[t.code] : absl::StrCat("code ", t.code);
  return Invalid(kProto, absl::StrCat("dtype ", code, t.bits,
                                      " is not supported (zcc stores F64, F32, F16, BF16, I64, I32, "
                                      "I16, I8, U8 and BOOL)"));
}

// C-contiguity with strides in bytes; dimensions of extent 1 may have any stride.
bool IsCContiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& byte_strides,
                   int64_t item_bytes) {
  for (int64_t d : shape) {
    if (d == 0) return true;  // empty: nothing is read or written
  }
  int64_t expected = item_bytes;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && byte_strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string ShapeString(const std::vector<int64_t>& v) {
  return absl::StrCat("(", absl::StrJoin(v, ", "), ")");
}

absl::StatusOr<TensorView> FromArrayInterface(py::handle obj, const py::object& iface,
                                              const char* protocol, MemoryKind memory) {
  if (!py::isinstance<py::dict>(iface)) return Invalid(protocol, "is not a dict");
  py::dict d = py::reinterpret_borrow<py::dict>(iface);
  TensorView view;
  view.memory = memory;
  view.protocol = protocol;
  try {
    if (!d.contains("shape") || !d.contains("typestr") || !d.contains("data")) {
      return Invalid(protocol, "needs 'shape', 'typestr' and 'data'");
    }
    for (py::handle dim : py::reinterpret_borrow<py::tuple>(d["shape"])) {
      view.shape.push_back(dim.cast<int64_t>());
    }
    auto dtype = DTypeFromTypestr(protocol, d["typestr"].cast<std::string>());
    if (!dtype.ok()) return dtype.status();
    view.dtype = *dtype;
    if (d.contains("mask") && !d["mask"].is_none()) {
      return Invalid(protocol, "masked arrays are not supported");
    }
    py::object data = d["data"];
    if (!py::isinstance<py::tuple>(data) || py::len(data) != 2) {
      return Invalid(protocol, "'data' must be a (pointer, read_only) tuple");
    }
    py::tuple pair = py::reinterpret_borrow<py::tuple>(data);
    if (pair[1].cast<bool>()) {
      return Invalid(protocol, "the array is read-only (restore writes into registered tensors)");
    }
    uintptr_t ptr = pair[0].cast<uintptr_t>();
    if (d.contains("offset")) ptr += d["offset"].cast<uintptr_t>();
    view.data = reinterpret_cast<void*>(ptr);
    const int64_t item = static_cast<int64_t>(format::DTypeSize(view.dtype));
    if (d.contains("strides") && !d["strides"].is_none()) {
      std::vector<int64_t> strides;
      for (py::handle s : py::reinterpret_borrow<py::tuple>(d["strides"])) {
        strides.push_back(s.cast<int64_t>());
      }
      if (strides.size() != view.shape.size()) return Invalid(protocol, "strides do not match the shape");
      if (!IsCContiguous(view.shape, strides, item)) {
        return Invalid(protocol, absl::StrCat("the array is not C-contiguous (shape ",
                                              ShapeString(view.shape), ", byte strides ",
                                              ShapeString(strides), "); pass a contiguous copy"));
      }
    }
  } catch (const py::error_already_set& e) {
    return Invalid(protocol, e.what());
  } catch (const py::cast_error& e) {
    return Invalid(protocol, absl::StrCat("malformed interface: ", e.what()));
  }
  view.owner = py::reinterpret_borrow<py::object>(obj);
  return view;
}

void ReleaseDlpackOwner(PyObject* capsule) {
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kOwnerName));
  if (managed == nullptr) {
    PyErr_Clear();
    return;
  }
  if (managed->deleter != nullptr) managed->deleter(managed);
}

absl::StatusOr<TensorView> FromDlpack(const py::object& method) {
  constexpr const char* kProto = "__dlpack__";
  py::object capsule;
  try {
    capsule = method();
  } catch (const py::error_already_set& e) {
    return Invalid(kProto, e.what());
  }
  if (!PyCapsule_IsValid(capsule.ptr(), kDlpackName)) {
    return Invalid(kProto, "did not return an unused 'dltensor' capsule");
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kDlpackName));
  // The consumer protocol: rename the capsule and own the tensor from here on.
  if (PyCapsule_SetName(capsule.ptr(), kUsedDlpackName) != 0) return Invalid(kProto, TakePythonError());
  TensorView view;
  view.protocol = kProto;
  view.owner = py::capsule(managed, kOwnerName, &ReleaseDlpackOwner);
  const DLTensor& t = managed->dl_tensor;
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
    case kDLROCMHost:
      view.memory = MemoryKind::kHost;
      break;
    case kDLCUDA:
    case kDLCUDAManaged:
    case kDLROCM:
      view.memory = MemoryKind::kDevice;
      break;
    default:
      return Invalid(kProto, absl::StrCat("device type ", t.device.device_type, " is not supported"));
  }
  auto dtype = DTypeFromDlpack(t.dtype);
  if (!dtype.ok()) return dtype.status();
  view.dtype = *dtype;
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) return Invalid(kProto, "bad shape");
  view.shape.assign(t.shape, t.shape + t.ndim);
  if (t.strides != nullptr) {
    const int64_t item = static_cast<int64_t>(format::DTypeSize(view.dtype));
    std::vector<int64_t> byte_strides;
    for (int i = 0; i < t.ndim; ++i) byte_strides.push_back(t.strides[i] * item);
    if (!IsCContiguous(view.shape, byte_strides, item)) {
      std::vector<int64_t> strides(t.strides, t.strides + t.ndim);
      return Invalid(kProto, absl::StrCat("the tensor is not C-contiguous (shape ",
                                          ShapeString(view.shape), ", strides ",
                                          ShapeString(strides), "); pass .contiguous()"));
    }
  }
  view.data = static_cast<uint8_t*>(t.data) + t.byte_offset;
  return view;
}

}  // namespace

absl::StatusOr<TensorView> ViewTensor(py::handle obj) {
  for (auto [name, memory] : {std::pair{"__cuda_array_interface__", MemoryKind::kDevice},
                              std::pair{"__array_interface__", MemoryKind::kHost}}) {
    auto iface = OptionalAttr(obj, name);
    if (!iface.ok()) return iface.status();
    if (!iface->is_none()) return FromArrayInterface(obj, *iface, name, memory);
  }
  auto dlpack = OptionalAttr(obj, "__dlpack__");
  if (!dlpack.ok()) return dlpack.status();
  if (!dlpack->is_none()) return FromDlpack(*dlpack);
  return absl::InvalidArgumentError(absl::StrCat(
      "a ", Py_TYPE(obj.ptr())->tp_name,
      " exposes no __cuda_array_interface__, __array_interface__ or __dlpack__"));
}

}  // namespace zcc::python
