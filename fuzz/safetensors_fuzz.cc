#include "fuzz/fuzz_targets.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/validate.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "fuzz/fuzz_util.h"

namespace zcc::fuzz {

using internal::AsView;
using internal::IsDecodeError;

namespace {

std::string Describe(const format::SafetensorsTensor& t) {
  return absl::StrCat("'", t.name, "' ", format::DTypeName(t.dtype), " [", t.shape.size(),
                      " dims] [", t.begin, ", ", t.end, ")");
}

bool SameTensors(const std::vector<format::SafetensorsTensor>& a,
                 const std::vector<format::SafetensorsTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape ||
        a[i].begin != b[i].begin || a[i].end != b[i].end) {
      return false;
    }
  }
  return true;
}

// What DecodeSafetensorsHeader promises about a header it accepted for a file
// of `file_size` bytes.
void CheckAcceptedHeader(const format::SafetensorsHeader& h, uint64_t file_size) {
  FUZZ_CHECK(h.data_start >= 8 && h.data_start <= file_size,
             absl::StrCat("data_start ", h.data_start, " file_size ", file_size));
  const uint64_t data_size = file_size - h.data_start;
  uint64_t expected = 0;
  for (const format::SafetensorsTensor& t : h.tensors) {
    FUZZ_CHECK(ValidateTensorName(t.name).ok(), Describe(t));
    FUZZ_CHECK(t.begin == expected && t.end >= t.begin, Describe(t));
    const auto bytes = format::TensorBytes(t.dtype, t.shape);
    FUZZ_CHECK(bytes.ok() && *bytes == t.end - t.begin, Describe(t));
    expected = t.end;
  }
  FUZZ_CHECK(expected == data_size, absl::StrCat("tensors cover ", expected, " of ", data_size));
}

}  // namespace

int FuzzSafetensorsHeader(const uint8_t* data, size_t size) {
  const absl::string_view file = AsView(data, size);
  const auto need = format::HeaderBytesNeeded(file.substr(0, 8), size);
  const auto header = format::DecodeSafetensorsHeader(file, size);
  if (!header.ok()) {
    // The whole file is there, so "send more bytes" (OutOfRange) is wrong.
    FUZZ_CHECK(IsDecodeError(header.status()), header.status().ToString());
  } else {
    CheckAcceptedHeader(*header, size);
    FUZZ_CHECK(need.ok() && *need == header->data_start, need.status().ToString());
    const uint64_t data_size = size - header->data_start;

    // A prefix that stops short of the header asks for more bytes.
    if (header->data_start > 8) {
      const auto partial = format::DecodeSafetensorsHeader(
          file.substr(0, header->data_start - 1), size);
      FUZZ_CHECK(partial.status().code() == absl::StatusCode::kOutOfRange,
                 partial.status().ToString());
    }

    // Accepted headers re-encode (plain and page aligned) to headers that
    // decode to the same tensors and metadata.
    for (uint64_t align : {uint64_t{1}, uint64_t{4096}}) {
      const auto encoded = format::EncodeSafetensorsHeader(header->tensors, header->metadata, align);
      FUZZ_CHECK(encoded.ok(), encoded.status().ToString());
      FUZZ_CHECK(encoded->size() % align == 0, absl::StrCat(encoded->size()));
      const auto again = format::DecodeSafetensorsHeader(*encoded, encoded->size() + data_size);
      FUZZ_CHECK(again.ok(), again.status().ToString());
      FUZZ_CHECK(SameTensors(again->tensors, header->tensors), "tensors changed in a round trip");
      FUZZ_CHECK(again->metadata == header->metadata, "metadata changed in a round trip");
      FUZZ_CHECK(again->data_start == encoded->size(), absl::StrCat(again->data_start));
    }
  }

  // The same bytes as the start of a longer file (the reader hands the header
  // prefix of a large shard with the shard's real size): the last 4 bytes, if
  // any, say how much longer.
  if (size >= 12) {
    uint32_t extra;
    std::memcpy(&extra, data + size - 4, 4);
    const uint64_t file_size = uint64_t{size} + extra;
    const auto longer_need = format::HeaderBytesNeeded(file.substr(0, 8), file_size);
    const auto longer = format::DecodeSafetensorsHeader(file, file_size);
    if (longer.ok()) {
      CheckAcceptedHeader(*longer, file_size);
    } else if (longer.status().code() == absl::StatusCode::kOutOfRange) {
      FUZZ_CHECK(longer_need.ok() && *longer_need > size, longer.status().ToString());
    } else {
      FUZZ_CHECK(IsDecodeError(longer.status()), longer.status().ToString());
    }
  }
  // Fewer than 8 bytes of a file that has them: OutOfRange, never a crash.
  if (size < 8) {
    const auto shorter = format::DecodeSafetensorsHeader(file, 64);
    FUZZ_CHECK(shorter.status().code() == absl::StatusCode::kOutOfRange,
               shorter.status().ToString());
  }
  return 0;
}

}  // namespace zcc::fuzz
