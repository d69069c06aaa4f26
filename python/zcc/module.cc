// zcc._zcc: the Python binding of the C++ trainer client (client/client.h).
// The public Python API is the `zcc` package (python/zcc/__init__.py), which
// re-exports what is defined here and defines the exception classes.
//
// Error handling: everything inside the binding works with absl::Status; a
// non-OK status is thrown as StatusError and turned into the `zcc` exception
// for its code in exactly one place (the translator registered below, which
// calls zcc.errors.from_status).
//
// The GIL is released around every call that can wait: registration, restore,
// flush, EMA reads, status queries and save requests (RPCs), snapshots (which
// block under Backpressure.BLOCK), fences (the host copier blocks) and closing
// the client (which flushes and unregisters).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/log.h"
#include "copy/device_copier.h"
#include "format/dtype.h"
#include "python/zcc/capsules.h"
#include "python/zcc/memory_watch.h"
#include "python/zcc/py_collective.h"
#include "python/zcc/tensor_view.h"

namespace zcc::python {
namespace py = pybind11;
namespace {

// A non-OK status on its way to Python; see TranslateStatusError.
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError(value.status());
  return *std::move(value);
}

// The one place a Status becomes a Python exception: zcc.errors maps the code
// to its class (NotFound -> zcc.NotFoundError, a LookupError, ...).
void SetPythonError(const absl::Status& status) {
  try {
    py::object make = py::module_::import("zcc.errors").attr("from_status");
    py::object exc = make(static_cast<int>(status.code()),
                          absl::StatusCodeToString(status.code()), std::string(status.message()));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (const py::error_already_set& e) {
    PyErr_SetString(PyExc_RuntimeError, absl::StrCat(status.ToString(), " (and zcc.errors failed: ",
                                                     e.what(), ")").c_str());
  }
}

absl::Duration Seconds(double s, const char* name) {
  if (!(s >= 0) || s > 1e9) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(name, " must be >= 0 seconds")));
  }
  return absl::Seconds(s);
}

uint32_t U32(int64_t v, const char* name) {
  if (v < 0 || v > UINT32_MAX) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(name, " must be in [0, 2^32)")));
  }
  return static_cast<uint32_t>(v);
}

// An enum argument given as the enum itself or as its lower-case name.
template <typename E>
E ParseEnum(py::handle value, const std::vector<std::pair<const char*, E>>& names, const char* what) {
  if (py::isinstance<py::str>(value)) {
    const std::string s = absl::AsciiStrToLower(value.cast<std::string>());
    for (const auto& [name, e] : names) {
      if (s == name) return e;
    }
    std::string choices;
    for (const auto& [name, e] : names) absl::StrAppend(&choices, choices.empty() ? "" : ", ", "'", name, "'");
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat(what, " '", s, "' is not one of ", choices)));
  }
  try {
    return value.cast<E>();
  } catch (const py::cast_error&) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat(what, " must be a zcc enum value or its name, not ",
                     Py_TYPE(value.ptr())->tp_name)));
  }
}

// The manifest's spellings ("param", "optim", "extra"); TensorKindName returns
// views of string literals, so data() is NUL-terminated.
const std::vector<std::pair<const char*, TensorKind>> kTensorKinds = [] {
  std::vector<std::pair<const char*, TensorKind>> kinds;
  for (uint32_t k = 0; k < format::kNumTensorKinds; ++k) {
    const auto kind = static_cast<TensorKind>(k);
    kinds.emplace_back(format::TensorKindName(kind).data(), kind);
  }
  return kinds;
}();
const std::vector<std::pair<const char*, SnapshotKind>> kSnapshotKinds = {
    {"full", SnapshotKind::kFull}, {"ema_only", SnapshotKind::kEmaOnly}};
const std::vector<std::pair<const char*, Backpressure>> kBackpressures = {
    {"skip", Backpressure::kSkip}, {"block", Backpressure::kBlock}};
const std::vector<std::pair<const char*, ReplicaGroup::Kind>> kReplicaKinds = {
    {"none", ReplicaGroup::Kind::kNone},
    {"data_parallel", ReplicaGroup::Kind::kDataParallel},
    {"expert_data_parallel", ReplicaGroup::Kind::kExpertDataParallel}};

const char* ResultName(SnapshotResult r) {
  switch (r) {
    case SnapshotResult::kEnqueued: return "enqueued";
    case SnapshotResult::kSkippedNoSlot: return "skipped_no_slot";
    case SnapshotResult::kSkippedDisconnected: return "skipped_disconnected";
    case SnapshotResult::kSkippedCopyFailed: return "skipped_copy_failed";
  }
  return "unknown";
}

// Sets the copy backend from connect(copier=...): None or "host", a device
// copier another extension module made (a "zcc.DeviceCopier" capsule, whose
// copier the client shares), or daemon-pull (a "zcc.DaemonPull" capsule from
// zcc.daemon_pull(), capsules.h). Returns the backend's name.
std::string SetCopier(py::handle copier, ClientOptions* o) {
  if (copier.is_none()) return "host";
  if (py::isinstance<py::str>(copier) && copier.cast<std::string>() == "host") return "host";
  if (PyCapsule_IsValid(copier.ptr(), kCopierCapsule)) {
    auto* p = static_cast<std::shared_ptr<DeviceCopier>*>(
        PyCapsule_GetPointer(copier.ptr(), kCopierCapsule));
    if (p != nullptr && *p != nullptr) {
      o->copier = *p;
      return o->copier->name();
    }
  }
  if (PyCapsule_IsValid(copier.ptr(), kDaemonPullCapsule)) {
    auto* choice =
        static_cast<DaemonPullChoice*>(PyCapsule_GetPointer(copier.ptr(), kDaemonPullCapsule));
    if (choice != nullptr && choice->factory) {
      o->copy_backend = ClientOptions::CopyBackend::kCudaIpc;
      o->cuda_device = choice->device;
      o->daemon_pull_copier = choice->factory;
      return "cuda_ipc";
    }
  }
  throw StatusError(absl::InvalidArgumentError(
      "copier must be None or 'host' (the host copier), zcc.cuda_copier(...), "
      "zcc.daemon_pull(...), or a 'zcc.DeviceCopier' capsule holding a "
      "std::shared_ptr<zcc::DeviceCopier>*"));
}

// One tensor to register, as Python code describes it.
struct TensorSpec {
  std::string name;
  py::object tensor;
  TensorKind kind = TensorKind::kParam;
  bool ema_eligible = false;
  ReplicaGroup replica;
  // A piece of a global tensor (TensorRef::global_shape/box_offset).
  std::vector<int64_t> global_shape;
  std::vector<int64_t> box_offset;
  bool optional = false;  // TensorRef::optional
};

// What the binding remembers of a registered tensor (for read_ema).
struct Registered {
  format::DType dtype;
  std::vector<int64_t> shape;
  uint64_t elements = 0;
  bool ema_eligible = false;
};

// A zcc::Client owned by Python, with references to every registered
// tensor's memory owner so that no registered memory is freed while the client
// may still copy from or into it.
//
// Thread-safety: meant for one Python thread (the trainer's), like the C++
// client; stats() may be called from any thread. Every method runs with the
// GIL and drops it only around the C++ call, holding its own reference to the
// client meanwhile.
class PyClient {
 private:
  std::shared_ptr<Client> Get() const {
    if (client_ == nullptr) throw StatusError(absl::FailedPreconditionError("the zcc client is closed"));
    return client_;
  }

  // Runs f(client) without the GIL. The reference to the client is dropped
  // before the GIL is taken back: if close() ran meanwhile on another thread,
  // the client's (waiting) destructor runs here, not under the GIL.
  template <typename F>
  auto CallWithoutGil(F&& f) const {
    std::shared_ptr<Client> c = Get();
    py::gil_scoped_release release;
    auto result = f(*c);
    c.reset();
    return result;
  }

 public:
  explicit PyClient(std::unique_ptr<Client> client, std::string copier_name)
      : client_(std::move(client)), copier_name_(std::move(copier_name)) {}

  ~PyClient() {
    try {
      Release(std::nullopt);
    } catch (...) {
      // A destructor reports nothing; Release() itself does not throw.
    }
  }

  // close(keep_snapshots=False): the trainer is done (Client::Close).
  void Close(bool keep_snapshots) { Release(keep_snapshots); }

  // Closes with `keep_snapshots`, or, without (the object is collected
  // unclosed: an exception ended the script), lets ~Client keep them.
  void Release(std::optional<bool> keep_snapshots) {
    std::shared_ptr<Client> c = std::move(client_);
    if (c == nullptr) return;
    // With the GIL held and client_ null, no new reference can appear; one
    // still held by a call on another thread (a misuse) outlives this.
    const bool last = c.use_count() == 1;
    {
      // Close and ~Client flush and unregister: they may wait for the daemon.
      py::gil_scoped_release release;
      if (keep_snapshots.has_value()) {
        const absl::Status closed = c->Close(*keep_snapshots);
        if (!closed.ok()) ZCC_LOG(WARNING) << "zcc client: " << closed;
      }
      c.reset();
    }
    // The tensors go only once nothing can copy from or into them; otherwise
    // with this object (whose methods hold it while they run).
    if (last) keep_alive_.clear();
  }

  bool closed() const { return client_ == nullptr; }

  void RegisterTensors(const std::vector<TensorSpec>& specs) { Register(specs, false); }

  // Client::ReplaceTensors: a state blob outgrew its tensor.
  void ReplaceTensors(const std::vector<TensorSpec>& specs) { Register(specs, true); }

  void Register(const std::vector<TensorSpec>& specs, bool replace) {
    Get();  // closed: fail before taking any tensor
    std::vector<TensorRef> refs;
    std::vector<py::object> owners;
    std::map<std::string, Registered> registered;
    for (const TensorSpec& spec : specs) {
      auto view = ViewTensor(spec.tensor);
      if (!view.ok()) {
        throw StatusError(absl::InvalidArgumentError(
            absl::StrCat("tensor '", spec.name, "': ", view.status().message())));
      }
      if (view->memory == MemoryKind::kDevice && copier_name_ == "host") {
        throw StatusError(absl::InvalidArgumentError(absl::StrCat(
            "tensor '", spec.name, "' is in device memory (", view->protocol,
            "); the host copier cannot read it: connect with a device copier")));
      }
      TensorRef ref;
      ref.name = spec.name;
      ref.dtype = view->dtype;
      ref.shape = view->shape;
      ref.data = view->data;
      ref.kind = spec.kind;
      ref.ema_eligible = spec.ema_eligible;
      ref.replica = spec.replica;
      ref.global_shape = spec.global_shape;
      ref.box_offset = spec.box_offset;
      ref.optional = spec.optional;
      uint64_t elements = 1;
      for (int64_t d : ref.shape) elements *= static_cast<uint64_t>(d < 0 ? 0 : d);
      registered[spec.name] = Registered{ref.dtype, ref.shape, elements, spec.ema_eligible};
      refs.push_back(std::move(ref));
      owners.push_back(std::move(view->owner));
    }
    const absl::Status st = CallWithoutGil([&](Client& c) {
      return replace ? c.ReplaceTensors(std::move(refs)) : c.RegisterTensors(std::move(refs));
    });
    ThrowIfError(st);
    // Replaced tensors stay alive until close too (nothing copies from them
    // after ReplaceTensors returns; they are a few state blobs at most).
    for (py::object& o : owners) keep_alive_.push_back(std::move(o));
    registered_ = std::move(registered);
  }

  std::string Snapshot(int64_t step, py::handle kind, uintptr_t stream) {
    const SnapshotKind k = ParseEnum(kind, kSnapshotKinds, "snapshot kind");
    return ResultName(
        CallWithoutGil([&](Client& c) { return c.Snapshot(step, k, reinterpret_cast<void*>(stream)); }));
  }

  void Fence(uintptr_t stream) {
    ThrowIfError(CallWithoutGil([&](Client& c) { return c.FenceBeforeUpdate(reinterpret_cast<void*>(stream)); }));
  }

  int64_t Restore(int64_t step, uintptr_t stream) {
    return ValueOrThrow(
        CallWithoutGil([&](Client& c) { return c.Restore(step, reinterpret_cast<void*>(stream)); }));
  }

  // Restore with RestoreOptions: {"step", "source" ("memory"|"disk"),
  // "restored" (per registered tensor, in order), "skipped", "missing"
  // (optional tensors the step lacks, filled with zeros)}.
  py::dict RestoreTensors(int64_t step, uintptr_t stream, bool owned_only, bool allow_older,
                          const std::vector<bool>& early_copy) {
    RestoreOptions options;
    options.step = step;
    options.owned_only = owned_only;
    options.allow_older = allow_older;
    options.early_copy = early_copy;
    RestoreResult r = ValueOrThrow(CallWithoutGil(
        [&](Client& c) { return c.Restore(options, reinterpret_cast<void*>(stream)); }));
    py::dict out;
    out["step"] = r.step;
    out["source"] = r.from_memory ? "memory" : "disk";
    out["ema_step"] = r.ema_step;
    py::list restored;
    for (bool b : r.restored) restored.append(b);
    out["restored"] = restored;
    py::list skipped;
    for (const std::string& why : r.skipped_steps) skipped.append(why);
    out["skipped"] = skipped;
    out["missing"] = py::cast(r.missing);
    return out;
  }

  // RestoreTensors with the job's ranks together through `collective`
  // (Client::RestoreTogether): the dict also says which tensors arrived from
  // another rank ("received").
  py::dict RestoreTogether(int64_t step, uintptr_t stream, uint32_t rank, uint32_t size,
                           py::object all_gather, py::object broadcast_many,
                           const std::vector<bool>& early_copy) {
    python::PyCollective collective(rank, size, std::move(all_gather), std::move(broadcast_many));
    RestoreOptions options;
    options.step = step;
    options.collective = &collective;
    options.early_copy = early_copy;
    RestoreResult r = ValueOrThrow(CallWithoutGil(
        [&](Client& c) { return c.Restore(options, reinterpret_cast<void*>(stream)); }));
    py::dict out;
    out["step"] = r.step;
    out["source"] = r.from_memory ? "memory" : "disk";
    out["ema_step"] = r.ema_step;
    out["restored"] = py::cast(r.restored);
    out["received"] = py::cast(r.received);
    py::list skipped;
    for (const std::string& why : r.skipped_steps) skipped.append(why);
    out["skipped"] = skipped;
    out["missing"] = py::cast(r.missing);
    return out;
  }

  py::dict RestoreCandidatesDict(bool owned_only) {
    RestoreCandidates r = ValueOrThrow(
        CallWithoutGil([&](Client& c) { return c.ListRestoreCandidates(owned_only); }));
    py::dict out;
    out["memory"] = py::cast(r.memory_steps);
    out["disk"] = py::cast(r.disk_steps);
    return out;
  }

  void Flush(double timeout_s) {
    const absl::Duration timeout = Seconds(timeout_s, "timeout");
    ThrowIfError(CallWithoutGil([&](Client& c) { return c.Flush(timeout); }));
  }

  void PutJobFile(const std::string& name, const py::bytes& content) {
    std::string data = content;
    ThrowIfError(CallWithoutGil([&](Client& c) { return c.PutJobFile(name, data); }));
  }

  void SaveNow() {
    ThrowIfError(CallWithoutGil([&](Client& c) { return c.SaveNow(); }));
  }

  std::string PeerAddress() const { return Get()->PeerAddress(); }

  std::vector<std::string> SetJobPeers(const std::vector<std::string>& by_rank) {
    return ValueOrThrow(CallWithoutGil([&](Client& c) { return c.SetJobPeers(by_rank); }));
  }

  bool WaitConnected(double timeout_s) {
    if (!(timeout_s >= 0)) throw py::value_error("timeout must be a number of seconds >= 0");
    const absl::Duration timeout =
        std::isinf(timeout_s) ? absl::InfiniteDuration() : absl::Seconds(timeout_s);
    return CallWithoutGil([&](Client& c) { return c.WaitConnected(timeout); });
  }

  py::dict Stats() const {
    std::shared_ptr<Client> c = Get();
    const ClientStats s = c->Stats();
    py::dict d;
    d["connected"] = s.connected;
    d["snapshots_enqueued"] = s.snapshots_enqueued;
    d["snapshots_published"] = s.snapshots_published;
    d["skipped_no_slot"] = s.skipped_no_slot;
    d["skipped_disconnected"] = s.skipped_disconnected;
    d["skipped_copy_failed"] = s.skipped_copy_failed;
    d["registrations"] = s.registrations;
    d["last_published_step"] = s.last_published_step;
    d["replaced_by_checkpoint"] = s.replaced_by_checkpoint;
    d["checkpoint_failures"] = s.checkpoint_failures;
    d["last_failed_checkpoint_step"] = s.last_failed_checkpoint_step;
    d["last_error"] = s.last_error;
    return d;
  }

  py::dict CheckpointStatus() const {
    const zcc::CheckpointStatus s = ValueOrThrow(CallWithoutGil([&](Client& c) { return c.QueryCheckpointStatus(); }));
    py::dict d;
    d["last_committed_step"] = s.last_committed_step;
    d["last_checkpoint_bytes"] = s.last_checkpoint_bytes;
    d["last_checkpoint_seconds"] = s.last_checkpoint_seconds;
    d["last_checkpoint_gbps"] = s.last_checkpoint_gbps;
    d["pending_commits"] = s.pending_commits;
    d["last_error"] = s.last_error;
    return d;
  }

  // stats() plus the daemon's view of the job under "checkpoint" (None, with
  // the reason under "checkpoint_error", when zccd cannot be asked).
  py::dict Status() const {
    py::dict d = Stats();
    try {
      d["checkpoint"] = CheckpointStatus();
      d["checkpoint_error"] = py::none();
    } catch (const StatusError& e) {
      d["checkpoint"] = py::none();
      d["checkpoint_error"] = e.status().ToString();
    }
    return d;
  }

  // read_ema(names=None, out=None) -> (step, {name: array}). Without `out`,
  // fresh float32 NumPy arrays shaped like the registered tensors (zeros while
  // the step is -1); with `out` (name -> writable, C-contiguous float32 host
  // buffer of the same element count), those buffers are filled and returned.
  // With min_step, zccd answers once its EMA includes that step or a newer
  // one, or after `timeout` seconds with the EMA as it is (see the step).
  py::tuple ReadEma(py::object names, py::object out, int64_t min_step, double timeout) {
    py::dict result;
    std::vector<Client::EmaOutput> outputs;
    if (!out.is_none()) {
      if (!names.is_none()) {
        throw StatusError(absl::InvalidArgumentError("pass names or out, not both"));
      }
      for (auto item : py::reinterpret_borrow<py::dict>(out)) {
        const std::string name = item.first.cast<std::string>();
        auto view = ViewTensor(item.second);
        if (!view.ok()) {
          throw StatusError(absl::InvalidArgumentError(
              absl::StrCat("EMA output '", name, "': ", view.status().message())));
        }
        if (view->memory != MemoryKind::kHost || view->dtype != format::DType::kF32) {
          throw StatusError(absl::InvalidArgumentError(absl::StrCat(
              "EMA output '", name, "' must be a float32 buffer in host memory")));
        }
        uint64_t elements = 1;
        for (int64_t d : view->shape) elements *= static_cast<uint64_t>(d);
        outputs.push_back({name, static_cast<float*>(view->data), elements});
        result[py::str(name)] = item.second;
      }
    } else {
      std::vector<std::string> wanted;
      if (names.is_none()) {
        for (const auto& [name, r] : registered_) {
          if (r.ema_eligible) wanted.push_back(name);
        }
      } else {
        for (py::handle n : names) wanted.push_back(n.cast<std::string>());
      }
      for (const std::string& name : wanted) {
        auto it = registered_.find(name);
        if (it == registered_.end()) {
          throw StatusError(absl::NotFoundError(absl::StrCat("no tensor '", name, "' is registered")));
        }
        py::array_t<float> array(it->second.shape);
        std::fill(array.mutable_data(), array.mutable_data() + it->second.elements, 0.0f);
        outputs.push_back({name, array.mutable_data(), it->second.elements});
        result[py::str(name)] = array;
      }
    }
    if (!(timeout >= 0) || std::isinf(timeout)) {
      throw py::value_error("timeout must be a finite number of seconds >= 0");
    }
    const int64_t step = ValueOrThrow(CallWithoutGil(
        [&](Client& c) { return c.ReadEma(outputs, min_step, absl::Seconds(timeout)); }));
    return py::make_tuple(step, result);
  }

  std::string copier_name() const { return copier_name_; }

 private:
  std::shared_ptr<Client> client_;
  std::string copier_name_;
  std::vector<py::object> keep_alive_;
  std::map<std::string, Registered> registered_;
};

std::unique_ptr<PyClient> Connect(const std::string& job_id, const std::string& socket_path,
                                  int64_t rank, int64_t world_size, int64_t num_slots,
                                  int64_t save_every, int64_t keep_last,
                                  const std::string& checkpoint_root, py::handle backpressure,
                                  double ema_decay, int64_t ema_interval, bool persist_on_failure,
                                  py::handle copier, double rpc_timeout, double heartbeat_interval,
                                  double daemon_timeout, double reconnect_max_backoff,
                                  double restore_timeout, bool prefetch_restore,
                                  py::handle store_credentials, const std::string& upload_root,
                                  int64_t upload_keep_last, bool node_local_root,
                                  const std::string& run_id) {
  ClientOptions o;
  o.upload_root = upload_root;
  o.upload_keep_last = U32(upload_keep_last, "upload_keep_last");
  o.node_local_root = node_local_root;
  o.run_id = run_id;
  if (!store_credentials.is_none()) {
    // (access key id, secret[, session token]), made by zcc.connect.
    auto keys = store_credentials.cast<std::vector<std::string>>();
    if (keys.size() < 2 || keys.size() > 3 || keys[0].empty() || keys[1].empty()) {
      throw StatusError(absl::InvalidArgumentError(
          "store_credentials: an access key id and its secret (and a session token)"));
    }
    o.store_credentials.access_key_id = keys[0];
    o.store_credentials.secret_access_key = keys[1];
    if (keys.size() == 3) o.store_credentials.session_token = keys[2];
  }
  o.socket_path = socket_path;
  o.job_id = job_id;
  o.rank = U32(rank, "rank");
  o.world_size = U32(world_size, "world_size");
  o.num_slots = U32(num_slots, "num_slots");
  o.save_every = U32(save_every, "save_every");
  o.keep_last = U32(keep_last, "keep_last");
  o.checkpoint_root = checkpoint_root;
  o.backpressure = ParseEnum(backpressure, kBackpressures, "backpressure");
  if (!(ema_decay >= 0 && ema_decay < 1)) {
    throw StatusError(absl::InvalidArgumentError("ema_decay must be in [0, 1)"));
  }
  o.ema_decay = static_cast<float>(ema_decay);
  o.ema_interval = U32(ema_interval, "ema_interval");
  o.persist_on_failure = persist_on_failure;
  const std::string copier_name = SetCopier(copier, &o);
  o.rpc_timeout = Seconds(rpc_timeout, "rpc_timeout");
  o.heartbeat_interval = Seconds(heartbeat_interval, "heartbeat_interval");
  o.daemon_timeout = Seconds(daemon_timeout, "daemon_timeout");
  o.reconnect_max_backoff = Seconds(reconnect_max_backoff, "reconnect_max_backoff");
  o.restore_timeout = Seconds(restore_timeout, "restore_timeout");
  o.prefetch_restore = prefetch_restore;
  absl::StatusOr<std::unique_ptr<Client>> client;
  {
    py::gil_scoped_release release;
    client = Client::Connect(std::move(o));
  }
  return std::make_unique<PyClient>(ValueOrThrow(std::move(client)), copier_name);
}

py::dict DescribeTensor(py::handle obj) {
  TensorView v = ValueOrThrow(ViewTensor(obj));
  py::dict d;
  d["dtype"] = std::string(format::DTypeName(v.dtype));
  d["shape"] = py::tuple(py::cast(v.shape));
  d["data"] = reinterpret_cast<uintptr_t>(v.data);
  d["nbytes"] = ValueOrThrow(format::TensorBytes(v.dtype, v.shape));
  d["memory"] = v.memory == MemoryKind::kHost ? "host" : "device";
  d["protocol"] = v.protocol;
  return d;
}

}  // namespace

void DefineModule(py::module_& m) {
  m.doc() = "Binding of the zcc C++ trainer client; use the `zcc` package.";
  DefineMemoryWatch(m);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      SetPythonError(e.status());
    }
  });

  py::enum_<TensorKind>(m, "TensorKind")
      .value("PARAM", TensorKind::kParam)
      .value("OPTIM", TensorKind::kOptim)
      .value("EXTRA", TensorKind::kExtra);
  py::enum_<SnapshotKind>(m, "SnapshotKind")
      .value("FULL", SnapshotKind::kFull)
      .value("EMA_ONLY", SnapshotKind::kEmaOnly);
  py::enum_<Backpressure>(m, "Backpressure")
      .value("SKIP", Backpressure::kSkip)
      .value("BLOCK", Backpressure::kBlock);
  py::enum_<ReplicaGroup::Kind>(m, "ReplicaKind")
      .value("NONE", ReplicaGroup::Kind::kNone)
      .value("DATA_PARALLEL", ReplicaGroup::Kind::kDataParallel)
      .value("EXPERT_DATA_PARALLEL", ReplicaGroup::Kind::kExpertDataParallel);
  m.attr("LATEST") = kLatestStep;

  py::class_<ReplicaGroup>(m, "ReplicaGroup",
                           "Which replicas hold identical copies of a tensor; a replicated "
                           "tensor is written once per group (client/client.h).")
      .def(py::init([](py::handle kind, int64_t group_size, int64_t rank_in_group, int64_t expert_id) {
             ReplicaGroup g;
             g.kind = ParseEnum(kind, kReplicaKinds, "replica kind");
             g.group_size = U32(group_size, "group_size");
             g.rank_in_group = U32(rank_in_group, "rank_in_group");
             g.expert_id = expert_id;
             return g;
           }),
           py::arg("kind") = ReplicaGroup::Kind::kNone, py::arg("group_size") = 1,
           py::arg("rank_in_group") = 0, py::arg("expert_id") = -1)
      .def_readonly("kind", &ReplicaGroup::kind)
      .def_readonly("group_size", &ReplicaGroup::group_size)
      .def_readonly("rank_in_group", &ReplicaGroup::rank_in_group)
      .def_readonly("expert_id", &ReplicaGroup::expert_id)
      .def("__repr__", [](const ReplicaGroup& g) {
        return absl::StrCat("ReplicaGroup(kind=", static_cast<int>(g.kind), ", group_size=",
                            g.group_size, ", rank_in_group=", g.rank_in_group,
                            ", expert_id=", g.expert_id, ")");
      });

  py::class_<TensorSpec>(m, "TensorSpec",
                         "A tensor to register: its checkpoint name, the object holding its "
                         "memory (__array_interface__, __cuda_array_interface__ or __dlpack__; "
                         "C-contiguous, writable), kind, EMA eligibility and replica group. "
                         "A piece of a larger global tensor (tensor parallel, FSDP shard) gives "
                         "global_shape and offset (where the piece starts, per dimension); the "
                         "checkpoint then restores into any other layout. An optional EXTRA "
                         "tensor may be absent from a step: it is restored as zeros and named "
                         "in the restore's \"missing\" list.")
      .def(py::init([](std::string name, py::object tensor, py::handle kind, bool ema_eligible,
                       py::object replica, std::optional<std::vector<int64_t>> global_shape,
                       std::optional<std::vector<int64_t>> offset, bool optional) {
             TensorSpec s;
             s.name = std::move(name);
             s.tensor = std::move(tensor);
             s.kind = ParseEnum(kind, kTensorKinds, "tensor kind");
             s.ema_eligible = ema_eligible;
             s.optional = optional;
             if (!replica.is_none()) s.replica = replica.cast<ReplicaGroup>();
             if (global_shape.has_value() != offset.has_value()) {
               throw StatusError(absl::InvalidArgumentError(absl::StrCat(
                   "tensor '", s.name, "': give both global_shape and offset, or neither")));
             }
             if (global_shape.has_value()) {
               s.global_shape = *std::move(global_shape);
               s.box_offset = *std::move(offset);
             }
             return s;
           }),
           py::arg("name"), py::arg("tensor"), py::arg("kind") = TensorKind::kParam,
           py::arg("ema_eligible") = false, py::arg("replica") = py::none(),
           py::arg("global_shape") = py::none(), py::arg("offset") = py::none(),
           py::arg("optional") = false)
      .def_readonly("global_shape", &TensorSpec::global_shape)
      .def_readonly("offset", &TensorSpec::box_offset)
      .def_readonly("name", &TensorSpec::name)
      .def_readonly("tensor", &TensorSpec::tensor)
      .def_readonly("kind", &TensorSpec::kind)
      .def_readonly("ema_eligible", &TensorSpec::ema_eligible)
      .def_readonly("optional", &TensorSpec::optional)
      .def_readonly("replica", &TensorSpec::replica)
      .def("__repr__", [](const TensorSpec& s) {
        return absl::StrCat("TensorSpec('", s.name, "', kind=", static_cast<int>(s.kind),
                            ", ema_eligible=", s.ema_eligible ? "True" : "False", ")");
      });

  py::class_<PyClient>(m, "Client")
      .def("register_tensors", &PyClient::RegisterTensors, py::arg("tensors"))
      .def("replace_tensors", &PyClient::ReplaceTensors, py::arg("tensors"),
           "Registers `tensors` in place of the registered ones (only EXTRA tensors may "
           "differ, in size), keeping the rank's EMA in zccd: for a state blob that outgrew "
           "its tensor. The snapshots zccd held of the old registration are dropped.")
      .def("snapshot", &PyClient::Snapshot, py::arg("step"), py::arg("kind") = SnapshotKind::kFull,
           py::arg("stream") = 0)
      .def("fence", &PyClient::Fence, py::arg("stream") = 0)
      .def("restore", &PyClient::Restore, py::arg("step") = kLatestStep, py::arg("stream") = 0)
      .def("restore_tensors", &PyClient::RestoreTensors, py::arg("step") = kLatestStep,
           py::arg("stream") = 0, py::arg("owned_only") = false, py::arg("allow_older") = false,
           py::arg("early_copy") = std::vector<bool>{},
           "Restore with its details: a dict with step, source ('memory' or 'disk'), restored "
           "(per registered tensor: filled; False only with owned_only) and skipped (newer "
           "steps passed over, with why) and missing (optional tensors the step lacks, "
           "filled with zeros). early_copy (per registered tensor, in order; empty: none): "
           "tensors nothing reads until the restore returns, copied as soon as zccd has "
           "checked them while it reads the rest (see RestoreOptions::early_copy).")
      .def("restore_together", &PyClient::RestoreTogether, py::arg("step"), py::arg("stream"),
           py::arg("rank"), py::arg("size"), py::arg("all_gather"), py::arg("broadcast_many"),
           py::arg("early_copy") = std::vector<bool>{},
           "Restore with the job's ranks together (every rank calls it): all_gather(bytes) -> "
           "list of bytes and broadcast_many([(address, nbytes), ...], root) carry the "
           "protocol (zcc.torch passes torch.distributed ones). The dict of restore_tensors, "
           "plus received (per registered tensor: it came from another rank). early_copy: as "
           "restore_tensors', for the pieces this rank reads.")
      .def("restore_candidates", &PyClient::RestoreCandidatesDict, py::arg("owned_only") = false,
           "The steps restore can serve this rank, newest first: {'memory': [...], "
           "'disk': [...]}.")
      .def("flush", &PyClient::Flush, py::arg("timeout") = 60.0)
      .def("save_now", &PyClient::SaveNow)
      .def_property_readonly("peer_address", &PyClient::PeerAddress,
                             "Where other zccds reach this rank's zccd (host:port); empty when "
                             "its peer service is off.")
      .def("set_job_peers", &PyClient::SetJobPeers, py::arg("by_rank"),
           "Tells zccd every rank's zccd peer address (a list indexed by rank, empty strings "
           "left out), exchanged over the job's process group; returns the zccds that hold "
           "this node's replicas.")
      .def("put_job_file", &PyClient::PutJobFile, py::arg("name"), py::arg("content"),
           "Stores a file (bytes) with the job, e.g. the model's config.json; zccctl export "
           "writes it next to the weights.")
      .def("stats", &PyClient::Stats)
      .def("wait_connected", &PyClient::WaitConnected, py::arg("timeout"),
           "Waits until the client is registered with zccd, at most `timeout` seconds; "
           "returns whether it is.")
      .def("checkpoint_status", &PyClient::CheckpointStatus)
      .def("status", &PyClient::Status)
      .def("read_ema", &PyClient::ReadEma, py::arg("names") = py::none(), py::arg("out") = py::none(),
           py::arg("min_step") = -1, py::arg("timeout") = 0.0)
      .def("close", &PyClient::Close, py::arg("keep_snapshots") = false,
           "Publishes snapshots in flight and unregisters; zccd releases the rank's staging "
           "memory at once unless keep_snapshots (then a trainer started next restores from "
           "memory). A client collected unclosed keeps them.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, py::object exc_type, py::object, py::object) {
        // Left by an exception: a restart is likely, keep the snapshots.
        c.Close(/*keep_snapshots=*/!exc_type.is_none());
        return false;
      })
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("copier", &PyClient::copier_name);

  m.def("_connect", &Connect, py::arg("job_id"), py::arg("socket_path") = "", py::arg("rank") = 0,
        py::arg("world_size") = 1, py::arg("num_slots") = 0, py::arg("save_every") = 0,
        py::arg("keep_last") = 0, py::arg("checkpoint_root") = "",
        py::arg("backpressure") = Backpressure::kSkip, py::arg("ema_decay") = 0.0,
        py::arg("ema_interval") = 1, py::arg("persist_on_failure") = false,
        py::arg("copier") = py::none(), py::arg("rpc_timeout") = 30.0,
        py::arg("heartbeat_interval") = 0.25, py::arg("daemon_timeout") = 3.0,
        py::arg("reconnect_max_backoff") = 5.0, py::arg("restore_timeout") = 1800.0,
        py::arg("prefetch_restore") = false, py::arg("store_credentials") = py::none(),
        py::arg("upload_root") = "", py::arg("upload_keep_last") = 0,
        py::arg("node_local_root") = false, py::arg("run_id") = "");
  m.def("describe_tensor", &DescribeTensor, py::arg("tensor"),
        "What zcc would register for `tensor`: dtype, shape, data pointer, bytes, memory "
        "kind and the protocol it was read through. Raises like register_tensors would.");
}

}  // namespace zcc::python

PYBIND11_MODULE(_zcc, m) { zcc::python::DefineModule(m); }
