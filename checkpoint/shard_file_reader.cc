#include "checkpoint/shard_file_reader.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/read_progress.h"
#include "common/status.h"
#include "format/checksum.h"
#include "storage/io_pipeline.h"

namespace zcc::checkpoint {
namespace {

using storage::AlignDown;
using storage::AlignedBuffer;
using storage::AlignUp;
using storage::kDirectIoAlignment;

// Requests contiguous in the file, read and hashed front to back.
struct Run {
  size_t first = 0;  // requests [first, last)
  size_t last = 0;
  size_t cursor = 0;  // first request not yet complete
};

// One read request. The bytes of [begin, end) land at `dst` (straight into the
// caller's memory) or, when `dst` is null, in a bounce buffer at
// begin - read_offset.
struct Piece {
  size_t run = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t read_offset = 0;
  size_t read_len = 0;
  uint8_t* dst = nullptr;
};

uint64_t Begin(const TensorReadRequest& r) { return r.tensor->offset; }
uint64_t End(const TensorReadRequest& r) { return r.tensor->offset + r.tensor->nbytes; }

absl::Status Mismatch(const TensorReadRequest& r, const std::string& path) {
  return absl::DataLossError(
      absl::StrCat("checksum mismatch for tensor '", r.tensor->name, "' in ", path));
}

// Bounce pieces over [s, e), each within one aligned chunk.
void AddBouncePieces(size_t run, uint64_t s, uint64_t e, uint64_t align, uint64_t chunk,
                     std::vector<Piece>* pieces) {
  for (uint64_t p = s; p < e;) {
    const uint64_t q = std::min(AlignDown(p, align) + chunk, e);
    Piece piece;
    piece.run = run;
    piece.begin = p;
    piece.end = q;
    piece.read_offset = AlignDown(p, align);
    piece.read_len = static_cast<size_t>(AlignUp(q, align) - piece.read_offset);
    pieces->push_back(piece);
    p = q;
  }
}

}  // namespace

absl::Status ReadShardTensors(storage::File& file, uint64_t file_size,
                              std::vector<TensorReadRequest> requests, const IoOptions& options,
                              std::vector<AlignedBuffer>* bounce) {
  const std::string& path = file.path();
  const uint64_t align = file.direct() ? kDirectIoAlignment : 1;
  // At least what the file serves best (an object store's ranged reads).
  const uint64_t chunk = std::max<uint64_t>(
      AlignDown(std::max<uint64_t>(options.chunk_bytes, file.preferred_request_bytes()),
                kDirectIoAlignment),
      kDirectIoAlignment);
  for (const TensorReadRequest& r : requests) {
    if (End(r) > file_size || End(r) < Begin(r)) {
      return absl::DataLossError(absl::StrCat("tensor '", r.tensor->name, "' lies outside ", path));
    }
    if (r.tensor->nbytes == 0 && format::Xxh3(nullptr, 0) != r.tensor->xxh3) {
      return Mismatch(r, path);
    }
  }
  if (options.verified != nullptr) {
    for (const TensorReadRequest& r : requests) {
      if (r.tensor->nbytes == 0) (*options.verified)(*r.tensor);
    }
  }
  requests.erase(std::remove_if(requests.begin(), requests.end(),
                                [](const TensorReadRequest& r) { return r.tensor->nbytes == 0; }),
                 requests.end());
  std::stable_sort(
      requests.begin(), requests.end(),
      [](const TensorReadRequest& a, const TensorReadRequest& b) { return Begin(a) < Begin(b); });

  // Runs, and the pieces that read them.
  std::vector<Run> runs;
  std::vector<Piece> pieces;
  for (size_t i = 0; i < requests.size();) {
    const TensorReadRequest& head = requests[i];
    // Straight into memory when the destination's address is congruent with
    // the file offset modulo the alignment, so whole blocks line up.
    const bool in_place =
        head.dst != nullptr && reinterpret_cast<uintptr_t>(head.dst) % align == Begin(head) % align;
    size_t j = i + 1;
    while (j < requests.size() && Begin(requests[j]) == End(requests[j - 1])) {
      if (in_place && requests[j].dst != requests[j - 1].dst + requests[j - 1].tensor->nbytes)
        break;
      ++j;
    }
    const size_t run = runs.size();
    runs.push_back(Run{i, j, i});
    const uint64_t s = Begin(requests[i]);
    const uint64_t e = End(requests[j - 1]);
    const uint64_t inner_begin = AlignUp(s, align);
    const uint64_t inner_end = AlignDown(e, align);
    if (in_place && inner_begin < inner_end) {
      AddBouncePieces(run, s, inner_begin, align, chunk, &pieces);
      for (uint64_t p = inner_begin; p < inner_end; p += chunk) {
        Piece piece;
        piece.run = run;
        piece.begin = p;
        piece.end = std::min(p + chunk, inner_end);
        piece.read_offset = p;
        piece.read_len = static_cast<size_t>(piece.end - p);
        piece.dst = head.dst + (p - s);
        pieces.push_back(piece);
      }
      AddBouncePieces(run, inner_end, e, align, chunk, &pieces);
    } else {
      AddBouncePieces(run, s, e, align, chunk, &pieces);
    }
    i = j;
  }

  // Each round: refill the queue, wait for the oldest piece, take in every
  // other finished one, refill again, and only then hash and copy what came
  // in. Devices tend to finish a queue's requests together; hashing between
  // refills would leave the device idle. Pieces that came in but are not
  // processed yet still hold their bounce buffers, hence two per request slot.
  // Streaming hash state only for tensors split across pieces; a tensor
  // that arrives in one piece is hashed in one call. (One state per request
  // would be ~600 bytes and an allocation per tensor.)
  absl::flat_hash_map<size_t, format::Xxh3Stream> partial;
  std::vector<uint8_t*> landed(pieces.size());
  const size_t buffers = 2 * size_t{file.queue_depth()};
  if (bounce->size() < buffers) bounce->resize(buffers);
  size_t bounce_used = 0;
  size_t submitted = 0;  // pieces handed to the pipeline
  size_t arrived = 0;    // pieces retired from it (bytes in memory)
  std::vector<size_t> got(pieces.size());
  storage::IoPipeline pipe(&file);
  auto refill = [&]() -> absl::Status {
    while (submitted < pieces.size() && !pipe.full()) {
      const Piece& p = pieces[submitted];
      uint8_t* target = p.dst;
      if (target == nullptr) {
        // Buffer k is next used by bounce piece k + 2 x depth; by then piece
        // k has been processed (at most depth pieces are in flight and depth
        // waiting to be processed).
        AlignedBuffer& buf = (*bounce)[bounce_used++ % buffers];
        if (buf.size() < p.read_len) buf = AlignedBuffer::Uninitialized(p.read_len);
        target = buf.data();
      }
      landed[submitted] = target;
      ZCC_RETURN_IF_ERROR(pipe.SubmitRead(p.read_offset, target, p.read_len));
      ++submitted;
    }
    return absl::OkStatus();
  };
  for (size_t processed = 0; processed < pieces.size();) {
    if (options.cancelled != nullptr && *options.cancelled && (*options.cancelled)()) {
      return absl::CancelledError(absl::StrCat("read of ", path, " cancelled"));
    }
    ZCC_RETURN_IF_ERROR(refill());
    ZCC_ASSIGN_OR_RETURN(got[arrived], pipe.RetireOldest());
    ++arrived;
    while (pipe.OldestDone()) {
      ZCC_ASSIGN_OR_RETURN(got[arrived], pipe.RetireOldest());
      ++arrived;
    }
    ZCC_RETURN_IF_ERROR(refill());
    for (; processed < arrived; ++processed) {
      const Piece& p = pieces[processed];
      if (p.read_offset + got[processed] < p.end) {
        return absl::DataLossError(
            absl::StrCat(path, " ends early at byte ", p.read_offset + got[processed]));
      }
      const uint8_t* bytes = landed[processed] + (p.begin - p.read_offset);
      Run& run = runs[p.run];
      for (size_t k = run.cursor; k < run.last && Begin(requests[k]) < p.end; ++k) {
        const TensorReadRequest& r = requests[k];
        const uint64_t from = std::max(Begin(r), p.begin);
        const uint64_t to = std::min(End(r), p.end);
        if (from >= to) continue;
        const uint8_t* src = bytes + (from - p.begin);
        if (p.dst == nullptr && r.dst != nullptr) {
          std::memcpy(r.dst + (from - Begin(r)), src, to - from);
        }
        if (from == Begin(r) && to == End(r)) {
          if (format::Xxh3(src, to - from) != r.tensor->xxh3) return Mismatch(r, path);
          run.cursor = k + 1;
          if (options.verified != nullptr) (*options.verified)(*r.tensor);
          continue;
        }
        format::Xxh3Stream& stream = partial[k];
        stream.Update(src, to - from);
        if (to == End(r)) {
          if (stream.Digest() != r.tensor->xxh3) return Mismatch(r, path);
          partial.erase(k);
          run.cursor = k + 1;
          if (options.verified != nullptr) (*options.verified)(*r.tensor);
        }
      }
      if (options.progress != nullptr) options.progress->AddRead(p.end - p.begin);
    }
  }
  return absl::OkStatus();
}

}  // namespace zcc::checkpoint
