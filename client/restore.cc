// Restore and EMA reads: zccd fills a buffer segment, the client copies it
// into the trainer's tensors and releases the buffer.
#include "client/client.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "shm/control_block.h"

namespace zcc {

using client_internal::IsTransient;

absl::StatusOr<int64_t> Client::Restore(int64_t step, void* stream) {
  Impl& im = *impl_;
  std::shared_ptr<Session> s = im.CurrentSession();
  if (s == nullptr) {
    zcc::MutexLock lock(&im.mu);
    return absl::UnavailableError(absl::StrCat("not registered with zccd: ",
                                               im.last_error.empty() ? "call RegisterTensors first"
                                                                     : im.last_error));
  }
  std::vector<TensorRef> refs;
  {
    zcc::MutexLock lock(&im.mu);
    refs = im.tensors;
  }
  v1::RestoreRequest req;
  req.set_job_id(im.options.job_id);
  req.set_rank(im.options.rank);
  req.set_generation(s->resp.generation());
  req.set_step(step);
  v1::RestoreResponse resp;
  auto ctx = im.Context();
  const std::shared_ptr<const Stubs> stubs = im.GetStubs();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(stubs->control->Restore(ctx.get(), req, &resp)));
  for (const std::string& why : resp.skipped_steps()) {
    ZCC_LOG(WARNING) << "zcc client: restore skipped " << why;
  }
  // The restored bytes arrive in a buffer of their own, holding every
  // registered tensor (replicated ones too), validated before use.
  absl::Status copied;
  if (static_cast<size_t>(resp.placements_size()) != refs.size() ||
      resp.data_offset() > resp.segment_bytes()) {
    copied = absl::DataLossError("zccd's restore reply does not match the registration");
  }
  for (size_t i = 0; copied.ok() && i < refs.size(); ++i) {
    const v1::TensorPlacement& p = resp.placements(i);
    const uint64_t room = resp.segment_bytes() - resp.data_offset();
    if (p.name() != refs[i].name || p.nbytes() != *format::TensorBytes(refs[i].dtype, refs[i].shape) ||
        p.offset() > room || p.nbytes() > room - p.offset()) {
      copied = absl::DataLossError(
          absl::StrCat("zccd's restore placement of '", refs[i].name, "' is inconsistent"));
    }
  }
  if (copied.ok()) {
    auto buffer = shm::Segment::Open(resp.shm_name(), resp.segment_bytes());
    if (!buffer.ok()) {
      copied = buffer.status();
    } else {
      const uint8_t* base = buffer->base() + resp.data_offset();
      std::vector<CopyRegion> regions;
      for (size_t i = 0; i < refs.size(); ++i) {
        regions.push_back(
            CopyRegion{base + resp.placements(i).offset(), refs[i].data, resp.placements(i).nbytes()});
      }
      copied = im.copier->RegisterHostMemory(buffer->base(), buffer->size());
      if (copied.ok()) {
        copied = im.copier->CopyToDevice(regions, stream);
        const absl::Status unpinned = im.copier->UnregisterHostMemory(buffer->base());
        if (copied.ok()) copied = unpinned;
      }
    }
  }
  const absl::Status released = im.ReleaseBuffer(*stubs, *s, resp.restore_id());
  ZCC_RETURN_IF_ERROR(copied);
  ZCC_RETURN_IF_ERROR(released);
  return resp.step();
}

absl::StatusOr<int64_t> Client::ReadEma(const std::vector<EmaOutput>& outputs) {
  Impl& im = *impl_;
  std::shared_ptr<Session> s = im.CurrentSession();
  if (s == nullptr) return absl::UnavailableError("not registered with zccd");
  v1::ReadEmaRequest req;
  req.set_job_id(im.options.job_id);
  req.set_rank(im.options.rank);
  req.set_generation(s->resp.generation());
  v1::ReadEmaResponse resp;
  auto ctx = im.Context();
  const std::shared_ptr<const Stubs> stubs = im.GetStubs();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(stubs->control->ReadEma(ctx.get(), req, &resp)));
  absl::Status copied;
  {
    auto buffer = shm::Segment::Open(resp.shm_name(), resp.segment_bytes());
    if (!buffer.ok()) {
      copied = buffer.status();
    } else if (resp.data_offset() > buffer->size()) {
      copied = absl::DataLossError("zccd's EMA buffer is inconsistent");
    } else {
      const uint64_t room = buffer->size() - resp.data_offset();
      const uint8_t* base = buffer->base() + resp.data_offset();
      // By name, once: a search of the placements per output is quadratic.
      absl::flat_hash_map<absl::string_view, const v1::TensorPlacement*> by_name;
      by_name.reserve(resp.placements_size());
      for (const v1::TensorPlacement& p : resp.placements()) by_name.emplace(p.name(), &p);
      for (const EmaOutput& out : outputs) {
        const auto found = by_name.find(out.name);
        const v1::TensorPlacement* it = found == by_name.end() ? nullptr : found->second;
        if (it == nullptr) {
          copied = absl::NotFoundError(absl::StrCat(
              "zccd keeps no EMA of '", out.name, "' for this rank (another replica writes it, or "
              "it is not an EMA-eligible parameter)"));
          break;
        }
        if (it->nbytes() != out.elements * sizeof(float) || it->offset() > room ||
            it->nbytes() > room - it->offset()) {
          copied = absl::InvalidArgumentError(absl::StrCat(
              "EMA of '", out.name, "' has ", it->nbytes() / 4, " elements; ", out.elements, " given"));
          break;
        }
        if (resp.step() >= 0) std::memcpy(out.data, base + it->offset(), it->nbytes());
      }
    }
  }
  const absl::Status released = im.ReleaseBuffer(*stubs, *s, resp.restore_id());
  ZCC_RETURN_IF_ERROR(copied);
  ZCC_RETURN_IF_ERROR(released);
  return resp.step();
}

}  // namespace zcc
