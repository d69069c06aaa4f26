#include "daemon/peer/peer_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "daemon/peer/replica_proto.h"
#include "format/checksum.h"

namespace zcc::daemon::peer {
namespace {

std::unique_ptr<grpc::ClientContext> ContextWithin(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

absl::Status FromPeer(const std::string& target, const grpc::Status& st) {
  const absl::Status s = FromGrpcStatus(st);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("peer ", target, ": ", s.message()));
}

}  // namespace

namespace {

// A peer behind a partition drops packets rather than refusing them: a call
// in flight would wait for its deadline (minutes for a large piece).
// Keepalive pings find the dead link within about 15 s instead. A listing
// of what a peer holds for a job (ListReplicas, one answer) may pass gRPC's
// default 4 MB: 64 MB holds about 400,000 pieces (chunks are 1 MiB).
std::shared_ptr<grpc::Channel> PeerChannel(const std::string& target,
                                           std::shared_ptr<grpc::ChannelCredentials> creds,
                                           int connection) {
  grpc::ChannelArguments args;
  // An argument of zcc's own: channels whose arguments differ get
  // subchannels (connections) of their own.
  if (connection != 0) args.SetInt("zcc.peer_connection", connection);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(target, std::move(creds), args);
}

}  // namespace

PeerClient::PeerClient(const std::string& target, std::shared_ptr<grpc::ChannelCredentials> creds,
                       int connection)
    : target_(target),
      channel_(PeerChannel(target, std::move(creds), connection)),
      stub_(v1::Peer::NewStub(channel_)) {}

absl::StatusOr<v1::PeerHelloResponse> PeerClient::Hello(const std::string& node,
                                                        const std::string& failure_domain,
                                                        absl::Duration timeout) {
  v1::PeerHelloRequest req;
  req.set_node(node);
  req.set_failure_domain(failure_domain);
  v1::PeerHelloResponse resp;
  auto ctx = ContextWithin(timeout);
  const absl::Status st = FromPeer(target_, stub_->Hello(ctx.get(), req, &resp));
  if (!st.ok()) return st;
  return resp;
}

absl::Status PeerClient::Push(const ReplicaKey& key, const void* data, size_t nbytes,
                              absl::Duration timeout) {
  return Push(key, data, nbytes, format::Xxh3(data, nbytes), timeout);
}

absl::Status PeerClient::Push(const ReplicaKey& key, const void* data, size_t nbytes,
                              uint64_t xxh3, absl::Duration timeout, CallCancel* cancel,
                              int64_t went_on_from, uint64_t offset, uint64_t length,
                              bool* kept, const std::vector<std::string>* with_pieces) {
  if (length == 0) {
    offset = 0;
    length = nbytes;
  } else if (offset > nbytes || length > nbytes - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("part [", offset, ", +", length, ") of a piece of ", nbytes, " bytes"));
  }
  auto ctx = ContextWithin(timeout);
  const CallCancel::Scope cancellable(cancel, ctx.get());
  v1::PushReplicaResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::ReplicaChunk>> writer =
      stub_->PushReplica(ctx.get(), &resp);
  v1::ReplicaChunk chunk;
  v1::ReplicaHeader* header = chunk.mutable_header();
  *header->mutable_key() = ToProto(key);
  header->set_nbytes(nbytes);
  header->set_xxh3(xxh3);
  if (went_on_from >= 0) {
    header->set_supersedes_newer(true);
    header->set_went_on_from(went_on_from);
  }
  if (length != nbytes) {
    header->set_offset(offset);
    header->set_length(length);
  }
  if (with_pieces != nullptr) {
    for (const std::string& name : *with_pieces) header->add_with_pieces(name);
  }
  bool sent = writer->Write(chunk);
  const auto* bytes = static_cast<const char*>(data) + offset;
  for (size_t off = 0; sent && off < length; off += kReplicaChunkBytes) {
    chunk.Clear();
    chunk.set_data(bytes + off, std::min<size_t>(kReplicaChunkBytes, length - off));
    sent = writer->Write(chunk);
  }
  // A write fails when the peer has ended the call: Finish says why.
  writer->WritesDone();
  const absl::Status st = FromPeer(target_, writer->Finish());
  if (kept != nullptr) *kept = st.ok() && resp.kept();
  return st;
}

absl::StatusOr<std::string> PeerClient::Pull(const ReplicaKey& key, absl::Duration timeout,
                                             CallCancel* cancel) {
  std::string bytes;
  ZCC_RETURN_IF_ERROR(PullInto(
      key, timeout,
      [&bytes](uint64_t nbytes) {
        // Room for the whole piece at once: growing by doubling faults in
        // and copies about twice its bytes (measured: 1 GiB pulled in 5.9 s
        // against 2.3 s). Bounded, since the size comes from the peer (an
        // allocation that fails would end zccd): a larger piece grows as it
        // arrives. Large pieces go to files (PullInto) in recovery.
        constexpr uint64_t kMaxReserve = uint64_t{256} << 20;
        bytes.reserve(std::min(nbytes, kMaxReserve));
        return absl::OkStatus();
      },
      [&bytes](absl::string_view chunk) {
        bytes.append(chunk.data(), chunk.size());
        return absl::OkStatus();
      },
      cancel));
  return bytes;
}

absl::Status PeerClient::PullInto(const ReplicaKey& key, absl::Duration timeout,
                                  absl::FunctionRef<absl::Status(uint64_t)> size,
                                  absl::FunctionRef<absl::Status(absl::string_view)> sink,
                                  CallCancel* cancel) {
  auto ctx = ContextWithin(timeout);
  const CallCancel::Scope cancellable(cancel, ctx.get());
  v1::PullReplicaRequest req;
  *req.mutable_key() = ToProto(key);
  std::unique_ptr<grpc::ClientReader<v1::ReplicaChunk>> reader = stub_->PullReplica(ctx.get(), req);
  v1::ReplicaChunk chunk;
  absl::Status bad;      // the peer's fault: damaged
  absl::Status refused;  // the sink's
  uint64_t got = 0, nbytes = 0, xxh3 = 0;
  const bool got_header = reader->Read(&chunk);
  if (!got_header) {
    // Nothing came: the call's status says why.
  } else if (!chunk.has_header() || !(FromProto(chunk.header().key()) == key)) {
    bad = absl::DataLossError("its reply did not begin with this piece's header");
  } else {
    nbytes = chunk.header().nbytes();
    xxh3 = chunk.header().xxh3();
    refused = size(nbytes);
    format::Xxh3Stream sum;
    while (bad.ok() && refused.ok() && reader->Read(&chunk)) {
      if (chunk.part_case() != v1::ReplicaChunk::kData || chunk.data().size() > nbytes - got) {
        bad = absl::DataLossError(absl::StrCat("it sent more than the ", nbytes,
                                               " bytes its header announced"));
        break;
      }
      sum.Update(chunk.data().data(), chunk.data().size());
      got += chunk.data().size();
      refused = sink(chunk.data());
    }
    if (bad.ok() && refused.ok() && got == nbytes && sum.Digest() != xxh3) {
      bad = absl::DataLossError("its bytes do not match the piece's checksum");
    }
  }
  if (!bad.ok() || !refused.ok()) ctx->TryCancel();
  const absl::Status finished = FromPeer(target_, reader->Finish());
  if (!refused.ok()) return refused;
  if (!bad.ok()) {
    return absl::DataLossError(absl::StrCat("peer ", target_, " served piece '", key.piece,
                                            "' of step ", key.step, " damaged: ", bad.message()));
  }
  if (!finished.ok()) return finished;
  if (!got_header) {
    return absl::DataLossError(absl::StrCat("peer ", target_, " answered a pull of piece '",
                                            key.piece, "' with nothing"));
  }
  if (got != nbytes) {
    return absl::DataLossError(absl::StrCat("peer ", target_, " served piece '", key.piece,
                                            "' of step ", key.step, " short: ", got, " of ",
                                            nbytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status PeerClient::PullRange(const ReplicaKey& key, uint64_t piece_bytes, uint64_t offset,
                                   void* dst, size_t n, bool check_held, absl::Duration timeout,
                                   CallCancel* cancel) {
  if (n == 0) return absl::OkStatus();
  auto ctx = ContextWithin(timeout);
  const CallCancel::Scope cancellable(cancel, ctx.get());
  v1::PullReplicaRequest req;
  *req.mutable_key() = ToProto(key);
  req.set_offset(offset);
  req.set_length(n);
  req.set_check_held(check_held);
  std::unique_ptr<grpc::ClientReader<v1::ReplicaChunk>> reader = stub_->PullReplica(ctx.get(), req);
  v1::ReplicaChunk chunk;
  absl::Status bad;  // the peer's fault: damaged
  size_t got = 0;
  const bool got_header = reader->Read(&chunk);
  if (!got_header) {
    // Nothing came: the call's status says why.
  } else if (!chunk.has_header() || !(FromProto(chunk.header().key()) == key)) {
    bad = absl::DataLossError("its reply did not begin with this piece's header");
  } else if (chunk.header().nbytes() != piece_bytes || piece_bytes < offset ||
             piece_bytes - offset < n) {
    bad = absl::DataLossError(absl::StrCat("it holds ", chunk.header().nbytes(),
                                           " bytes of the piece; ", piece_bytes, " are wanted"));
  } else {
    char* out = static_cast<char*>(dst);
    while (reader->Read(&chunk)) {
      if (chunk.part_case() != v1::ReplicaChunk::kData || chunk.data().size() > n - got) {
        bad = absl::DataLossError(absl::StrCat("it sent more than the ", n, " bytes asked for"));
        break;
      }
      std::memcpy(out + got, chunk.data().data(), chunk.data().size());
      got += chunk.data().size();
    }
  }
  if (!bad.ok()) ctx->TryCancel();
  const absl::Status finished = FromPeer(target_, reader->Finish());
  if (!bad.ok()) {
    return absl::DataLossError(absl::StrCat("peer ", target_, " served bytes of piece '",
                                            key.piece, "' of step ", key.step, " damaged: ",
                                            bad.message()));
  }
  if (!finished.ok()) return finished;
  if (!got_header || got != n) {
    return absl::DataLossError(absl::StrCat("peer ", target_, " served ", got, " of the ", n,
                                            " bytes asked for of piece '", key.piece,
                                            "' of step ", key.step, " from byte ", offset));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PeerClient::PinStep(const std::string& job_id, uint32_t uid,
                                            int64_t step, bool everyone_answered,
                                            absl::Duration timeout, CallCancel* cancel) {
  v1::PinStepRequest req;
  req.set_job_id(job_id);
  req.set_uid(uid);
  req.set_step(step);
  req.set_everyone_answered(everyone_answered);
  v1::PinStepResponse resp;
  auto ctx = ContextWithin(timeout);
  const CallCancel::Scope cancellable(cancel, ctx.get());
  ZCC_RETURN_IF_ERROR(FromPeer(target_, stub_->PinStep(ctx.get(), req, &resp)));
  return resp.pinned_step();
}

absl::StatusOr<bool> PeerClient::WentBack(const std::string& job_id, uint32_t uid,
                                          int64_t restored, const std::vector<uint32_t>& ranks,
                                          absl::Duration ago, absl::Duration timeout,
                                          CallCancel* cancel) {
  v1::WentBackRequest req;
  req.set_job_id(job_id);
  req.set_uid(uid);
  req.set_restored(restored);
  for (uint32_t rank : ranks) req.add_ranks(rank);
  // (Rounded up: the going on is never placed after it was.)
  req.set_went_on_ms_ago(
      absl::ToInt64Milliseconds(absl::Ceil(std::max(ago, absl::ZeroDuration()),
                                           absl::Milliseconds(1))));
  v1::WentBackResponse resp;
  auto ctx = ContextWithin(timeout);
  const CallCancel::Scope cancellable(cancel, ctx.get());
  ZCC_RETURN_IF_ERROR(FromPeer(target_, stub_->WentBack(ctx.get(), req, &resp)));
  return resp.applied();
}

absl::StatusOr<std::vector<ReplicaInfo>> PeerClient::List(const std::string& job_id, uint32_t uid,
                                                          absl::Duration timeout,
                                                          CallCancel* cancel) {
  v1::ListReplicasRequest req;
  req.set_job_id(job_id);
  req.set_uid(uid);
  v1::ListReplicasResponse resp;
  auto ctx = ContextWithin(timeout);
  const CallCancel::Scope cancellable(cancel, ctx.get());
  const absl::Status st = FromPeer(target_, stub_->ListReplicas(ctx.get(), req, &resp));
  if (!st.ok()) return st;
  std::vector<ReplicaInfo> out;
  for (const v1::ReplicaHeader& h : resp.replicas()) {
    out.push_back(ReplicaInfo{FromProto(h.key()), h.nbytes(), h.xxh3(), h.from_node(), {}});
  }
  return out;
}

}  // namespace zcc::daemon::peer
