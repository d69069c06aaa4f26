#include "fuzz/fuzz_targets.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/peer/piece_assembly.h"
#include "format/checksum.h"
#include "fuzz/fuzz_util.h"

namespace zcc::fuzz {

using internal::ByteReader;

namespace {

// What the pieces being assembled may take together (Begin's max_bytes).
constexpr uint64_t kMaxBytes = 1 << 16;
constexpr int kPieces = 4;

// Byte `i` of piece `w`: what an honest pusher sends there.
uint8_t ContentAt(int w, uint64_t i) { return static_cast<uint8_t>(w * 131 + i * 7 + (i >> 9)); }

std::string Content(int w, uint64_t nbytes) {
  std::string s(nbytes, '\0');
  for (uint64_t i = 0; i < nbytes; ++i) s[i] = static_cast<char>(ContentAt(w, i));
  return s;
}

}  // namespace

int FuzzPieceAssembly(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  // The pieces the peer pushes: sizes from small to past the room (a
  // buffer of nbytes is made only when it fits), each with its true XXH3
  // or a wrong one, from one of two peers.
  struct Piece {
    daemon::peer::PieceAssembly::Whole whole;
    bool honest = true;
  };
  std::vector<Piece> pieces(kPieces);
  for (int w = 0; w < kPieces; ++w) {
    Piece& p = pieces[w];
    p.whole.key = daemon::peer::ReplicaKey{"job", 1000, static_cast<uint32_t>(w % 2), 7,
                                   absl::StrCat("model-0000", w, ".safetensors")};
    const uint8_t kind = in.U8();
    p.whole.nbytes = kind < 200 ? (uint64_t{in.U8()} << 8 | in.U8()) % 20000
                                : in.U64();  // anything, up to 2^64 - 1
    p.honest = (kind & 1) == 0;
    p.whole.xxh3 = p.whole.nbytes <= 20000
                       ? format::Xxh3(Content(w, p.whole.nbytes).data(), p.whole.nbytes) ^
                             (p.honest ? 0 : 1)
                       : in.U64();
    p.whole.from = in.Bool() ? "node-a" : "node-b";
  }
  daemon::peer::PieceAssembly assembly(absl::Minutes(10));
  struct Open {
    daemon::peer::PieceAssembly::Part part;
    int w;
  };
  std::vector<Open> open;  // begun, not ended
  auto end = [&](size_t i, bool written) {
    const Open o = open[i];
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
    auto ended = assembly.End(o.part, written);
    if (!ended.ok() || !ended->has_value()) return;
    // Handed over whole: exactly the bytes sent, which match the XXH3.
    const Piece& p = pieces[o.w];
    FUZZ_CHECK(p.honest, "a piece with a wrong XXH3 was handed over");
    FUZZ_CHECK((*ended)->bytes == Content(o.w, p.whole.nbytes),
               absl::StrCat("piece ", o.w, ": ", (*ended)->bytes.size(), " bytes handed over, ",
                            p.whole.nbytes, " sent"));
    if (in.Bool()) assembly.Kept(o.part.id);
  };
  for (int ops = 0; ops < 256 && !in.empty(); ++ops) {
    switch (in.Below(5)) {
      case 0: {  // a part begins
        const int w = static_cast<int>(in.Below(kPieces));
        const Piece& p = pieces[w];
        const uint8_t shape = in.U8();
        uint64_t offset, length;
        if (shape < 230) {  // within the piece, mostly
          const uint64_t raw = uint64_t{in.U8()} << 8 | in.U8();
          offset = p.whole.nbytes < UINT64_MAX ? raw % (p.whole.nbytes + 1) : raw;
          length = (uint64_t{in.U8()} << 8 | in.U8()) % 20001;
        } else {
          offset = in.U64();
          length = in.U64();
        }
        auto part = assembly.Begin(p.whole, offset, length, kMaxBytes);
        if (!part.ok()) break;
        FUZZ_CHECK(part->offset == offset && part->length == length,
                   absl::StrCat(offset, "+", length));
        FUZZ_CHECK(length > 0 && offset <= p.whole.nbytes && length <= p.whole.nbytes - offset,
                   absl::StrCat("part ", offset, "+", length, " of ", p.whole.nbytes,
                                " bytes accepted"));
        if (part->data != nullptr) {
          for (uint64_t i = 0; i < length; ++i) {
            part->data[i] = static_cast<char>(ContentAt(w, offset + i));
          }
        }
        open.push_back({*std::move(part), w});
        break;
      }
      case 1:  // a part ends, written or not
        if (!open.empty()) end(in.Below(static_cast<uint32_t>(std::min<size_t>(open.size(), 256))),
                               in.U8() < 200);
        break;
      case 2: {  // the store dropped a piece
        const Piece& p = pieces[in.Below(kPieces)];
        assembly.Forget({p.whole.key, p.whole.nbytes, p.whole.xxh3, p.whole.from});
        break;
      }
      case 3:
        assembly.DropIdle();
        break;
      default: {  // a piece kept by another route
        const Piece& p = pieces[in.Below(kPieces)];
        assembly.Kept({p.whole.key, p.whole.nbytes, p.whole.xxh3, p.whole.from});
        break;
      }
    }
    FUZZ_CHECK(assembly.bytes() <= kMaxBytes,
               absl::StrCat(assembly.bytes(), " bytes being assembled, room for ", kMaxBytes));
  }
  while (!open.empty()) end(open.size() - 1, false);
  FUZZ_CHECK(assembly.bytes() <= kMaxBytes, absl::StrCat(assembly.bytes()));
  return 0;
}

}  // namespace zcc::fuzz
