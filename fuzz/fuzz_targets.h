// Fuzz entry points for every parser of bytes that come from outside zccd:
// files read back from a checkpoint directory, RegisterRequest RPCs, the
// shared-memory control block a trainer writes, and the parts of pieces a
// peer zccd pushes.
//
// Each entry point takes arbitrary bytes, feeds them through the production
// decoder(s) exactly as the daemon or reader would, and then checks the
// decoder's documented promises (accepted input round-trips through the
// encoder, sizes and offsets stay in range, ...). A broken promise prints the
// reason to stderr and aborts, so libFuzzer and the replay test
// (regressions_test.cc) both see it as a crash. Returns 0 otherwise.
//
// The same functions back three consumers:
//   * libFuzzer binaries (libfuzzer_main.cc, built by fuzz/build.sh with
//     clang and -fsanitize=fuzzer,address,undefined);
//   * fuzz:regressions_test, which replays every file of fuzz/corpus/<target>
//     and fuzz/regressions/<target> (normal gcc Bazel build);
//   * make_seeds.cc, which uses the target names to lay out the corpus.
//
// Thread-safety: the entry points may run concurrently except
// FuzzStepDirLatest, which reuses one temporary file per process.
#ifndef ZCC_FUZZ_FUZZ_TARGETS_H_
#define ZCC_FUZZ_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>

namespace zcc::fuzz {

using FuzzFn = int (*)(const uint8_t* data, size_t size);

// format::HeaderBytesNeeded + DecodeSafetensorsHeader over the input as a
// whole file, as a truncated prefix, and as the start of a longer file;
// accepted headers must re-encode and decode to the same tensors.
int FuzzSafetensorsHeader(const uint8_t* data, size_t size);
// format::DecodeRankManifest; accepted manifests round-trip through the encoder.
int FuzzRankManifest(const uint8_t* data, size_t size);
// format::DecodeCommitRecord; accepted records round-trip.
int FuzzCommitRecord(const uint8_t* data, size_t size);
// format::DecodeWeightMapIndex; accepted indexes round-trip.
int FuzzWeightMapIndex(const uint8_t* data, size_t size);
// v1::RegisterRequest parsed from the raw bytes (protobuf wire format), then
// daemon::ParseTensors, AssignStaged and ShardsFor as Registry::Register runs
// them; an accepted registration must have a sane slot layout. Before the
// parse, proto::ParseCost must bound what the parse allocates.
int FuzzRegisterRequest(const uint8_t* data, size_t size);
// The same functions over requests built field by field from the bytes:
// mostly valid registrations of every rank of a small data-parallel world
// (so the shard assignment is reached), with fuzz-chosen invalid values.
int FuzzRegisterStructured(const uint8_t* data, size_t size);
// shm::ReadReadySlot for every slot index over a ControlBlock holding the
// bytes, as the daemon's ingest thread reads a block a client wrote.
int FuzzControlBlock(const uint8_t* data, size_t size);
// format::ParseStepDirName on the bytes, and checkpoint::ReadLatest on a job
// directory whose `latest` file holds them.
int FuzzStepDirLatest(const uint8_t* data, size_t size);
// daemon::peer::PieceAssembly fed a peer's parts as the bytes decide (pieces
// of any size up to 2^64 - 1, true or wrong XXH3s, parts in or out of
// bounds, overlapping, ended written or not, forgotten, kept, dropped idle):
// a piece handed over holds exactly the bytes sent and matches its XXH3, and
// the pieces being assembled never take more than the room given.
int FuzzPieceAssembly(const uint8_t* data, size_t size);

struct FuzzTarget {
  const char* name;  // directory name under fuzz/corpus and fuzz/regressions
  FuzzFn fn;
};

// Every target, in a fixed order.
inline constexpr FuzzTarget kFuzzTargets[] = {
    {"safetensors_header", FuzzSafetensorsHeader},
    {"rank_manifest", FuzzRankManifest},
    {"commit_record", FuzzCommitRecord},
    {"weight_map_index", FuzzWeightMapIndex},
    {"register_request", FuzzRegisterRequest},
    {"register_structured", FuzzRegisterStructured},
    {"control_block", FuzzControlBlock},
    {"step_dir_latest", FuzzStepDirLatest},
    {"piece_assembly", FuzzPieceAssembly},
};

}  // namespace zcc::fuzz

#endif  // ZCC_FUZZ_FUZZ_TARGETS_H_
