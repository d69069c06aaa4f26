// The safetensors container: an 8-byte little-endian header length N, N bytes
// of JSON header, then the data section. Header keys are tensor names mapping
// to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
// start of the data section), plus an optional "__metadata__" string map.
// The data section is fully covered by the tensors, with no holes or overlaps.
#ifndef ZCC_FORMAT_SAFETENSORS_H_
#define ZCC_FORMAT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/dtype.h"

namespace zcc::format {

// Upper bound on one tensor's entry in a header EncodeSafetensorsHeader
// writes: a 512-byte name (kMaxTensorNameBytes; names hold no byte that JSON
// escapes), 16 dimensions of up to 19 digits (zccd's limit), two 20-digit
// offsets and the punctuation come to 921 bytes.
inline constexpr uint64_t kMaxSafetensorsEntryBytes = 1024;
// Headers larger than this are refused when encoding and decoding. Sized so
// that a shard of 1,048,576 tensors (zccd's default max_tensors_per_rank) of
// the largest entries, plus metadata, fits: 1 GiB + 1 MiB. The reference
// implementation refuses headers over 100 MB, which zcc's files only reach
// with ~100k tensors of long names or 1M of short ones; zcc reads them back.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes =
    (uint64_t{1} << 20) * kMaxSafetensorsEntryBytes + (uint64_t{1} << 20);

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets in the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;  // ordered by `begin`
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data section: 8 + header length
};

// Encodes the 8-byte length and JSON header for `tensors`, whose begin/end must
// already tile [0, total) in order. The JSON is padded with trailing spaces
// (allowed by the format) so that the data section starts at a multiple of
// `align` in the file (align 1 = no padding; a power of two otherwise).
// InvalidArgument for invalid names, overlapping or gapped offsets, or sizes
// that disagree with dtype x shape.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata, uint64_t align);

// Decodes and validates the header of a file of `file_size` bytes, given at
// least its first 8 bytes in `prefix`. When `prefix` is shorter than the full
// header, returns OutOfRange with the number of bytes needed in the message
// (callers can call HeaderBytesNeeded instead). Validation: length within
// limits and the file, valid UTF-8 JSON object, known dtypes, non-negative
// shapes, size == dtype x shape, offsets tile the data section exactly and
// end at file_size, names pass ValidateTensorName, no duplicate names.
// Every failure is InvalidArgument / DataLoss with a message naming the problem.
absl::StatusOr<SafetensorsHeader> DecodeSafetensorsHeader(absl::string_view prefix,
                                                          uint64_t file_size);

// The total header size (8 + N) announced by the first 8 bytes of a file;
// DataLoss when fewer than 8 bytes or N exceeds the limit or the file.
absl::StatusOr<uint64_t> HeaderBytesNeeded(absl::string_view first8, uint64_t file_size);

}  // namespace zcc::format

#endif  // ZCC_FORMAT_SAFETENSORS_H_
