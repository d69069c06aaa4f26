#include "daemon/peer/peer_service.h"

#include <grpcpp/grpcpp.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/thread_priority.h"
#include "common/validate.h"
#include "daemon/peer/replica_proto.h"
#include "format/checksum.h"
#include "format/manifest.h"

namespace zcc::daemon::peer {
namespace {

// Why a piece's receiving ended: its room was revoked (ShrinkTo).
absl::Status RoomTakenBack(const ReplicaKey& key) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the room of piece '", key.piece, "' of step ", key.step, " was taken back for a trainer's "
      "registration on this zccd"));
}

}  // namespace

absl::Status ValidateReplicaKey(const ReplicaKey& key) {
  if (absl::Status st = ValidateJobId(key.job_id); !st.ok()) return st;
  // A piece is a file of a rank's step, written under its name into a step
  // directory when a lost node's step is recovered: one path component.
  for (absl::Status st : {ValidateTensorName(key.piece), format::ValidatePlainFileName(key.piece)}) {
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("replica piece: ", st.message()));
  }
  if (key.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("replica step ", key.step, " is negative"));
  }
  return absl::OkStatus();
}

std::string PeerIdentity(const grpc::ServerContext& ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    std::vector<std::string> names;
    for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
      names.emplace_back(name.data(), name.size());
    }
    if (!names.empty()) return absl::StrJoin(names, ",");
  }
  return ctx.peer();
}

grpc::Status PeerService::Hello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                                v1::PeerHelloResponse* resp) {
  ZCC_LOG(DEBUG) << "peer: hello from " << PeerIdentity(*ctx) << " (node '" << req->node()
                 << "', failure domain '" << req->failure_domain() << "')";
  resp->set_node(node_);
  resp->set_failure_domain(failure_domain_);
  resp->set_replica_budget_bytes(store_->budget_bytes());
  resp->set_replica_bytes_held(store_->bytes_held());
  resp->set_instance(instance_);
  resp->set_takes_parts(true);
  // (Every peer says hello every few seconds: pieces left half-assembled
  // go even when no part arrives any more.)
  parts_.DropIdle();
  return grpc::Status::OK;
}

std::string PeerService::NewInstance() {
  uint64_t id;
  try {
    std::random_device random;
    id = (uint64_t{random()} << 32) ^ random();
  } catch (const std::exception&) {  // no entropy source: this run's time and pid
    id = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^ (uint64_t{
        static_cast<uint32_t>(::getpid())} << 40);
  }
  return absl::StrFormat("%016x", id);
}

grpc::Status PeerService::PushReplica(grpc::ServerContext* ctx,
                                      grpc::ServerReader<v1::ReplicaChunk>* reader,
                                      v1::PushReplicaResponse* resp) {
  // Holding other nodes' pieces is background work: it never takes a core
  // from this node's trainers, its ingest or its writes.
  IdlePriority idle;
  const std::string from = PeerIdentity(*ctx);
  auto refuse = [&](const absl::Status& why) {
    ZCC_LOG(WARNING) << "peer: refused a replica from " << from << ": " << why;
    return ToGrpcStatus(why);
  };
  v1::ReplicaChunk chunk;
  if (!reader->Read(&chunk) || !chunk.has_header()) {
    return refuse(absl::InvalidArgumentError("a push must begin with the piece's header"));
  }
  const v1::ReplicaHeader header = chunk.header();
  Replica replica;
  replica.info.key = FromProto(header.key());
  if (absl::Status st = ValidateReplicaKey(replica.info.key); !st.ok()) return refuse(st);
  // Refused before any byte is read: a piece that cannot be kept.
  if (header.nbytes() > store_->budget_bytes()) {
    return refuse(absl::ResourceExhaustedError(
        absl::StrCat("a piece of ", header.nbytes(), " bytes is larger than this zccd's replica "
                     "budget (", store_->budget_bytes(), " bytes)")));
  }
  if (const uint64_t cap = store_->cap(); header.nbytes() > cap) {
    return refuse(absl::ResourceExhaustedError(absl::StrCat(
        "a piece of ", header.nbytes(), " bytes is larger than the ", cap,
        " bytes this zccd's staging budget leaves for replicas beside its trainers "
        "(raise staging_budget_bytes)")));
  }
  if (header.length() > 0) {
    // (Only a rank's manifest, a few KB and pushed whole, names pieces.)
    if (header.with_pieces_size() > 0) {
      return refuse(absl::InvalidArgumentError("a piece pushed in parts names no other pieces"));
    }
    return PushPart(*ctx, reader, header, from, resp);
  }
  if (header.offset() != 0) {
    return refuse(absl::InvalidArgumentError("a push with an offset names the part's length"));
  }
  // Its room in the replica store from the start: the bytes arriving take
  // memory before they can be checked and kept.
  const int64_t went_on_from =
      header.supersedes_newer() ? std::max<int64_t>(header.went_on_from(), 0) : -1;
  absl::StatusOr<std::shared_ptr<ReplicaStore::Incoming>> room =
      store_->Reserve(replica.info.key, header.nbytes(), went_on_from);
  if (!room.ok()) return refuse(room.status());
  replica.bytes.reserve(header.nbytes());
  format::Xxh3Stream sum;
  while (reader->Read(&chunk)) {
    if (chunk.part_case() != v1::ReplicaChunk::kData) {
      return refuse(absl::InvalidArgumentError("after its header, a push carries only bytes"));
    }
    if ((*room)->revoked()) return refuse(RoomTakenBack(replica.info.key));
    const std::string& data = chunk.data();
    if (data.size() > header.nbytes() - replica.bytes.size()) {
      return refuse(absl::InvalidArgumentError(absl::StrCat(
          "more bytes than the header's ", header.nbytes(), " for piece '",
          replica.info.key.piece, "'")));
    }
    sum.Update(data.data(), data.size());
    replica.bytes.append(data);
  }
  if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "push cancelled");
  if (replica.bytes.size() != header.nbytes()) {
    return refuse(absl::DataLossError(absl::StrCat("piece '", replica.info.key.piece, "' ended after ",
                                                   replica.bytes.size(), " of its ",
                                                   header.nbytes(), " bytes")));
  }
  if (sum.Digest() != header.xxh3()) {
    return refuse(absl::DataLossError(absl::StrCat("piece '", replica.info.key.piece,
                                                   "' does not match its checksum")));
  }
  replica.info.xxh3 = header.xxh3();
  replica.info.from_node = from;
  replica.info.received = absl::Now();
  replica.with_pieces.assign(header.with_pieces().begin(), header.with_pieces().end());
  if (absl::Status st = store_->Put(std::move(replica), went_on_from, room->get()); !st.ok()) {
    return refuse(st);
  }
  resp->set_replica_bytes_held(store_->bytes_held());
  resp->set_kept(true);
  return grpc::Status::OK;
}

namespace {

// Who sends a piece's parts, the same for all of them: the names in its
// certificate, or else (a plaintext listener, in tests) its host, without
// the port, which differs from one connection to the next.
std::string PartsSender(const grpc::ServerContext& ctx) {
  std::string who = PeerIdentity(ctx);
  if (who != ctx.peer()) return who;  // (its certificate's names)
  const size_t colon = who.rfind(':');
  return colon == std::string::npos ? who : who.substr(0, colon);
}

}  // namespace

grpc::Status PeerService::PushPart(grpc::ServerContext& ctx,
                                   grpc::ServerReader<v1::ReplicaChunk>* reader,
                                   const v1::ReplicaHeader& header, const std::string& from,
                                   v1::PushReplicaResponse* resp) {
  auto refuse = [&](const absl::Status& why) {
    ZCC_LOG(WARNING) << "peer: refused a part of a replica from " << from << ": " << why;
    return ToGrpcStatus(why);
  };
  const PieceAssembly::Whole whole{FromProto(header.key()), header.nbytes(), header.xxh3(),
                                   PartsSender(ctx)};
  // Whether the store holds the piece as this part's header names it.
  auto held_as_pushed = [&] {
    auto held = store_->Get(whole.key);
    return held.ok() && (*held)->bytes.size() == whole.nbytes && (*held)->info.xxh3 == whole.xxh3;
  };
  // The pieces being assembled, together, within what a whole piece may be.
  const uint64_t room = std::min(store_->budget_bytes(), store_->cap());
  // A new piece's room in the store, taken by its first part.
  const int64_t went_on_from =
      header.supersedes_newer() ? std::max<int64_t>(header.went_on_from(), 0) : -1;
  const PieceAssembly::Reserve reserve = [&] {
    return store_->Reserve(whole.key, whole.nbytes, went_on_from);
  };
  auto part = parts_.Begin(whole, header.offset(), header.length(), room, reserve);
  if (part.ok() && part->data == nullptr) {
    // Kept once, but is it still? (The store may have dropped it since, and
    // this be its push again.)
    if (!held_as_pushed()) {
      parts_.Forget(part->id);
      part = parts_.Begin(whole, header.offset(), header.length(), room, reserve);
    }
  }
  if (!part.ok()) return refuse(part.status());
  uint64_t got = 0;
  absl::Status bad;
  v1::ReplicaChunk chunk;
  while (bad.ok() && reader->Read(&chunk)) {
    if (chunk.part_case() != v1::ReplicaChunk::kData) {
      bad = absl::InvalidArgumentError("after its header, a push carries only bytes");
      break;
    }
    if (part->room != nullptr && part->room->revoked()) {
      bad = RoomTakenBack(whole.key);
      break;
    }
    const std::string& data = chunk.data();
    if (data.size() > part->length - got) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "more bytes than the part's ", part->length, " of piece '", whole.key.piece, "'"));
      break;
    }
    if (part->data != nullptr) std::memcpy(part->data + got, data.data(), data.size());
    got += data.size();
  }
  if (bad.ok() && !ctx.IsCancelled() && got != part->length) {
    bad = absl::DataLossError(absl::StrCat("a part of piece '", whole.key.piece, "' ended after ",
                                           got, " of its ", part->length, " bytes"));
  }
  const bool written = bad.ok() && !ctx.IsCancelled();
  auto done = parts_.End(*part, written);
  if (ctx.IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "push cancelled");
  if (!bad.ok()) return refuse(bad);
  if (!done.ok()) return refuse(done.status());
  if (done->has_value()) {
    // The part that completed the piece: kept as a whole push's would be.
    Replica replica;
    replica.info.key = whole.key;
    replica.info.xxh3 = whole.xxh3;
    replica.info.from_node = from;
    replica.info.received = absl::Now();
    replica.bytes = std::move((*done)->bytes);
    if (absl::Status st = store_->Put(std::move(replica), went_on_from, (*done)->room.get());
        !st.ok()) {
      return refuse(st);
    }
    parts_.Kept(part->id);
    resp->set_kept(true);
  } else {
    // A part of a piece its other parts made whole before it (a push tried
    // again): kept, where the store holds it as pushed.
    resp->set_kept(held_as_pushed());
  }
  resp->set_replica_bytes_held(store_->bytes_held());
  return grpc::Status::OK;
}

grpc::Status PeerService::PullReplica(grpc::ServerContext* ctx, const v1::PullReplicaRequest* req,
                                      grpc::ServerWriter<v1::ReplicaChunk>* writer) {
  const ReplicaKey key = FromProto(req->key());
  if (absl::Status st = ValidateReplicaKey(key); !st.ok()) return ToGrpcStatus(st);
  auto held = store_->Get(key);
  if (!held.ok()) return ToGrpcStatus(held.status());
  const Replica& r = **held;
  const uint64_t size = r.bytes.size();
  if (req->offset() > size || req->length() > size - req->offset()) {
    return ToGrpcStatus(absl::OutOfRangeError(
        absl::StrCat("bytes [", req->offset(), ", +", req->length(), ") of piece '", key.piece,
                     "' of step ", key.step, ": it holds ", size)));
  }
  if (req->check_held() && format::Xxh3(r.bytes.data(), size) != r.info.xxh3) {
    ZCC_LOG(ERROR) << "the held bytes of piece '" << key.piece << "' of job " << key.job_id
                   << " rank " << key.rank << " step " << key.step
                   << " no longer match their checksum (damaged in this zccd's memory)";
    return ToGrpcStatus(absl::DataLossError(
        absl::StrCat("the held bytes of piece '", key.piece, "' of step ", key.step,
                     " no longer match their checksum")));
  }
  const uint64_t begin = req->offset();
  const uint64_t end = req->length() == 0 ? size : begin + req->length();
  v1::ReplicaChunk chunk;
  v1::ReplicaHeader* header = chunk.mutable_header();
  *header->mutable_key() = ToProto(r.info.key);
  header->set_nbytes(size);
  header->set_xxh3(r.info.xxh3);
  header->set_from_node(r.info.from_node);
  if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "puller went away");
  for (uint64_t off = begin; off < end; off += kReplicaChunkBytes) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "pull cancelled");
    chunk.Clear();
    chunk.set_data(r.bytes.data() + off, std::min<uint64_t>(kReplicaChunkBytes, end - off));
    if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "puller went away");
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::ListReplicas(grpc::ServerContext*, const v1::ListReplicasRequest* req,
                                       v1::ListReplicasResponse* resp) {
  if (absl::Status st = ValidateJobId(req->job_id()); !st.ok()) return ToGrpcStatus(st);
  for (const ReplicaInfo& info : store_->List(req->job_id(), req->uid())) {
    v1::ReplicaHeader* h = resp->add_replicas();
    *h->mutable_key() = ToProto(info.key);
    h->set_nbytes(info.nbytes);
    h->set_xxh3(info.xxh3);
    h->set_from_node(info.from_node);
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::PinStep(grpc::ServerContext*, const v1::PinStepRequest* req,
                                  v1::PinStepResponse* resp) {
  if (absl::Status st = ValidateJobId(req->job_id()); !st.ok()) return ToGrpcStatus(st);
  if (!on_pin_) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no pins taken here");
  absl::StatusOr<int64_t> pinned =
      on_pin_(req->job_id(), req->uid(), req->step(), req->everyone_answered());
  if (!pinned.ok()) return ToGrpcStatus(pinned.status());
  resp->set_pinned_step(*pinned);
  return grpc::Status::OK;
}

grpc::Status PeerService::WentBack(grpc::ServerContext* ctx, const v1::WentBackRequest* req,
                                   v1::WentBackResponse* resp) {
  if (absl::Status st = ValidateJobId(req->job_id()); !st.ok()) return ToGrpcStatus(st);
  if (req->restored() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("went back to step ", req->restored(), ": a step is not negative")));
  }
  if (!on_went_back_) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no goings back taken here");
  }
  if (req->went_on_ms_ago() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("a going on in the future"));
  }
  const std::set<uint32_t> ranks(req->ranks().begin(), req->ranks().end());
  absl::StatusOr<bool> applied = on_went_back_(req->job_id(), req->uid(), req->restored(), ranks,
                                               absl::Milliseconds(req->went_on_ms_ago()));
  if (!applied.ok()) return ToGrpcStatus(applied.status());
  if (*applied) {
    ZCC_LOG(INFO) << "peer: " << PeerIdentity(*ctx) << " told that job " << req->job_id()
                  << " went on from step " << req->restored();
  }
  resp->set_applied(*applied);
  return grpc::Status::OK;
}

}  // namespace zcc::daemon::peer
