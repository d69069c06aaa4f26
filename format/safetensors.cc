#include "format/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/validate.h"
#include "format/strict_json.h"

namespace zcc::format {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr char kMetadataKey[] = "__metadata__";
// Deepest legitimate nesting: header object > tensor object > shape array.
constexpr int kMaxHeaderDepth = 3;

uint64_t LoadLittleEndian64(absl::string_view bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

void AppendLittleEndian64(uint64_t v, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// The checks shared by encoding and decoding of one tensor: its name, and a
// byte range that matches dtype x shape. InvalidArgument.
absl::Status CheckTensor(const SafetensorsTensor& t) {
  ZCC_RETURN_IF_ERROR(ValidateTensorName(t.name));
  if (t.name == kMetadataKey) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", kMetadataKey, "' is reserved and cannot name a tensor"));
  }
  const std::string where = absl::StrCat("tensor '", t.name, "': ");
  if (t.end < t.begin) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "data_offsets [", t.begin, ", ", t.end, "] end before they begin"));
  }
  absl::StatusOr<uint64_t> bytes = TensorBytes(t.dtype, t.shape);
  if (!bytes.ok()) return Annotate(bytes.status(), where);
  if (*bytes != t.end - t.begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, DTypeName(t.dtype), " x ", ShapeString(t.shape), " is ", *bytes,
        " bytes but data_offsets [", t.begin, ", ", t.end, "] span ", t.end - t.begin));
  }
  return absl::OkStatus();
}

// `ordered` must tile [0, total) in order: each tensor begins where the
// previous one ended. Returns the end of the last tensor (0 when empty).
absl::StatusOr<uint64_t> CheckTiling(const std::vector<SafetensorsTensor>& ordered) {
  uint64_t expected = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor& t : ordered) {
    if (t.begin > expected) {
      return absl::InvalidArgumentError(
          previous == nullptr
              ? absl::StrCat("tensor '", t.name, "' begins at offset ", t.begin,
                             ", leaving the start of the data section not covered by any tensor")
              : absl::StrCat("gap of ", t.begin - expected, " bytes between tensor '",
                             previous->name, "' (ends at ", expected, ") and tensor '", t.name,
                             "' (begins at ", t.begin, ")"));
    }
    if (t.begin < expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' [", t.begin, ", ", t.end, ") overlaps tensor '", previous->name,
          "', which ends at ", expected, " (or the tensors are out of order)"));
    }
    expected = t.end;
    previous = &t;
  }
  return expected;
}

absl::Status AsDataLoss(const absl::Status& status) {
  if (status.ok()) return status;
  return absl::DataLossError(status.message());
}

absl::Status FieldError(absl::string_view tensor, absl::string_view message) {
  return absl::DataLossError(absl::StrCat("tensor '", tensor, "': ", message));
}

// Reads `field` of a tensor entry as an array of non-negative integers that
// fit `max`.
absl::StatusOr<std::vector<uint64_t>> ReadUnsignedArray(const json& entry, absl::string_view tensor,
                                                        const char* field, uint64_t max) {
  const auto it = entry.find(field);
  if (it == entry.end()) return FieldError(tensor, absl::StrCat("missing \"", field, "\""));
  if (!it->is_array()) {
    return FieldError(tensor, absl::StrCat("\"", field, "\" must be an array, not ",
                                           internal::JsonTypeName(*it)));
  }
  std::vector<uint64_t> values;
  values.reserve(it->size());  // bounded by the header size, already checked
  for (size_t i = 0; i < it->size(); ++i) {
    const json& v = (*it)[i];
    if (v.is_number_integer() && !v.is_number_unsigned()) {
      return FieldError(
          tensor, absl::StrCat("\"", field, "\"[", i, "] is negative (", v.get<int64_t>(), ")"));
    }
    if (!v.is_number_unsigned()) {
      return FieldError(
          tensor, absl::StrCat("\"", field, "\"[", i, "] must be a non-negative integer, not ",
                               internal::JsonTypeName(v)));
    }
    const uint64_t u = v.get<uint64_t>();
    if (u > max) {
      return FieldError(tensor,
                        absl::StrCat("\"", field, "\"[", i, "] = ", u, " is larger than ", max));
    }
    values.push_back(u);
  }
  return values;
}

absl::StatusOr<SafetensorsTensor> ParseTensorEntry(const std::string& name, const json& entry) {
  SafetensorsTensor t;
  t.name = name;
  // Validate the name first so that later messages can quote it verbatim.
  ZCC_RETURN_IF_ERROR(AsDataLoss(ValidateTensorName(name)));
  if (!entry.is_object()) {
    return FieldError(name, absl::StrCat("expected an object with dtype, shape and "
                                         "data_offsets, not ",
                                         internal::JsonTypeName(entry)));
  }
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end()) return FieldError(name, "missing \"dtype\"");
  if (!dtype->is_string()) {
    return FieldError(
        name, absl::StrCat("\"dtype\" must be a string, not ", internal::JsonTypeName(*dtype)));
  }
  absl::StatusOr<DType> parsed = ParseDTypeName(dtype->get_ref<const std::string&>());
  if (!parsed.ok()) return FieldError(name, parsed.status().message());
  t.dtype = *parsed;

  ZCC_ASSIGN_OR_RETURN(std::vector<uint64_t> dims,
                       ReadUnsignedArray(entry, name, "shape", static_cast<uint64_t>(INT64_MAX)));
  t.shape.assign(dims.begin(), dims.end());

  ZCC_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets,
                       ReadUnsignedArray(entry, name, "data_offsets", UINT64_MAX));
  if (offsets.size() != 2) {
    return FieldError(name, absl::StrCat("\"data_offsets\" must be [begin, end], got ",
                                         offsets.size(), " numbers"));
  }
  t.begin = offsets[0];
  t.end = offsets[1];
  ZCC_RETURN_IF_ERROR(AsDataLoss(CheckTensor(t)));
  return t;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(const json& value) {
  if (!value.is_object()) {
    return absl::DataLossError(absl::StrCat("\"", kMetadataKey, "\" must be an object, not ",
                                            internal::JsonTypeName(value)));
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return absl::DataLossError(
          absl::StrCat("\"", kMetadataKey, "\" entry '", internal::PrintableForError(key),
                       "' must be a string, not ", internal::JsonTypeName(v)));
    }
    metadata.emplace(key, v.get<std::string>());
  }
  return metadata;
}

absl::StatusOr<SafetensorsHeader> DecodeHeaderJson(absl::string_view text, uint64_t data_start,
                                                   uint64_t file_size) {
  if (text.empty() || text.front() != '{') {
    return absl::DataLossError(
        "safetensors header does not start with '{' (not a safetensors file, or corrupt)");
  }
  SafetensorsHeader header;
  header.data_start = data_start;
  const uint64_t data_size = file_size - data_start;
  // Each entry is decoded as the parser completes it, never held in one DOM
  // of the whole header (a million tensors: gigabytes, and most of the time).
  internal::StreamedMembers members;
  members.on_member = [&](std::string key, json value) -> absl::Status {
    if (key == kMetadataKey) {
      ZCC_ASSIGN_OR_RETURN(header.metadata, ParseMetadata(value));
      return absl::OkStatus();
    }
    ZCC_ASSIGN_OR_RETURN(SafetensorsTensor t, ParseTensorEntry(key, value));
    if (t.end > data_size) {
      return FieldError(
          t.name, absl::StrCat("data_offsets [", t.begin, ", ", t.end,
                               "] run past the data section, which is ", data_size, " bytes"));
    }
    header.tensors.push_back(std::move(t));
    return absl::OkStatus();
  };
  ZCC_ASSIGN_OR_RETURN(json root, internal::ParseStrictJson(text, kMaxHeaderDepth,
                                                            "safetensors header", members));
  if (!root.is_object()) {
    return absl::DataLossError(absl::StrCat("safetensors header must be a JSON object, not ",
                                            internal::JsonTypeName(root)));
  }
  // JSON object keys are unique (ParseStrictJson), so names are too.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  absl::StatusOr<uint64_t> covered = CheckTiling(header.tensors);
  if (!covered.ok()) return AsDataLoss(covered.status());
  if (*covered != data_size) {
    return absl::DataLossError(
        absl::StrCat("tensors cover ", *covered, " bytes of a data section of ", data_size,
                     " bytes (file of ", file_size, " bytes, data starting at ", data_start, ")"));
  }
  return header;
}

}  // namespace

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata, uint64_t align) {
  if (align == 0 || (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("alignment ", align, " is not a power of two"));
  }
  std::set<absl::string_view> names;
  for (const SafetensorsTensor& t : tensors) {
    ZCC_RETURN_IF_ERROR(CheckTensor(t));
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' appears twice"));
    }
  }
  ZCC_RETURN_IF_ERROR(CheckTiling(tensors).status());

  // The JSON is written entry by entry, each entry dumped on its own, rather
  // than built as one ordered_json document: ordered_json's operator[] finds
  // keys by a linear scan, which made the header quadratic in the tensor
  // count, and one small document per entry also keeps the memory of a
  // 1M-tensor header to its text. The bytes are those nlohmann writes for the
  // whole document: the metadata first, then the tensors in the order given
  // (offset order), which makes the header readable; the format itself does
  // not care about the order.
  std::string text;
  try {
    const auto dump = [](const auto& value) {
      return value.dump(-1, ' ', /*ensure_ascii=*/false, ordered_json::error_handler_t::strict);
    };
    text.push_back('{');
    if (!metadata.empty()) {
      // json (not ordered_json) objects iterate in key order, as std::map does.
      absl::StrAppend(&text, dump(json(kMetadataKey)), ":", dump(json(metadata)));
    }
    for (const SafetensorsTensor& t : tensors) {
      ordered_json entry = ordered_json::object();
      entry["dtype"] = std::string(DTypeName(t.dtype));
      entry["shape"] = t.shape;
      entry["data_offsets"] = {t.begin, t.end};
      if (text.size() > 1) text.push_back(',');
      absl::StrAppend(&text, dump(json(t.name)), ":", dump(entry));
    }
    text.push_back('}');
  } catch (const json::exception& e) {
    // Only reachable through a name or metadata string that is not UTF-8.
    return absl::InvalidArgumentError(
        absl::StrCat("cannot encode the safetensors header (names and metadata must be UTF-8): ",
                     internal::PrintableForError(e.what(), 256)));
  }

  // Pad with spaces so that 8 + N is a multiple of `align`. No overflow: the
  // text is far below 2^63 and the result is at most max(align, 2 * text).
  const uint64_t unpadded = 8 + text.size();
  const uint64_t padded = unpadded + (align - unpadded % align) % align;
  const uint64_t header_len = padded - 8;
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header of ", header_len, " bytes (", tensors.size(), " tensors, alignment ",
        align, ") exceeds the limit of ", kMaxSafetensorsHeaderBytes));
  }
  std::string out;
  out.reserve(padded);
  AppendLittleEndian64(header_len, &out);
  out += text;
  out.append(padded - out.size(), ' ');
  return out;
}

absl::StatusOr<uint64_t> HeaderBytesNeeded(absl::string_view first8, uint64_t file_size) {
  if (file_size < 8) {
    return absl::DataLossError(absl::StrCat("safetensors file is ", file_size,
                                            " bytes, too short for the 8-byte header length"));
  }
  if (first8.size() < 8) {
    return absl::DataLossError(
        absl::StrCat("need the first 8 bytes of the safetensors file, got ", first8.size()));
  }
  const uint64_t n = LoadLittleEndian64(first8);
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::DataLossError(absl::StrCat("safetensors header length ", n,
                                            " exceeds the limit of ", kMaxSafetensorsHeaderBytes,
                                            " bytes (corrupt file?)"));
  }
  if (n > file_size - 8) {
    return absl::DataLossError(absl::StrCat("safetensors header length ", n,
                                            " runs past the end of the file of ", file_size,
                                            " bytes (truncated file?)"));
  }
  return 8 + n;
}

absl::StatusOr<SafetensorsHeader> DecodeSafetensorsHeader(absl::string_view prefix,
                                                          uint64_t file_size) {
  if (prefix.size() < 8 && file_size >= 8) {
    return absl::OutOfRangeError(absl::StrCat(
        "need the first 8 bytes of the safetensors file to find its header, got ", prefix.size()));
  }
  ZCC_ASSIGN_OR_RETURN(const uint64_t needed, HeaderBytesNeeded(prefix, file_size));
  if (prefix.size() < needed) {
    return absl::OutOfRangeError(absl::StrCat(
        "need ", needed, " bytes to decode the safetensors header, got ", prefix.size()));
  }
  try {
    return DecodeHeaderJson(prefix.substr(8, needed - 8), needed, file_size);
  } catch (const json::exception& e) {
    // Not expected (types are checked before every access); kept so that no
    // exception can escape on hostile input.
    return absl::DataLossError(
        absl::StrCat("safetensors header: ", internal::PrintableForError(e.what(), 256)));
  }
}

}  // namespace zcc::format
