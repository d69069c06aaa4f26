#include "format/manifest.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "common/validate.h"
#include "format/box.h"
#include "format/strict_json.h"

namespace zcc::format {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Deepest legitimate nesting: root > "tensors" array > tensor > "shape".
constexpr int kMaxManifestDepth = 4;
constexpr size_t kMaxFileNameBytes = 255;  // NAME_MAX
constexpr int kMinStepDigits = 8;

// Names written by this build never hold invalid UTF-8 (they were validated
// when registered), but the encoders return a plain string, so rather than
// throw they replace such bytes with U+FFFD; decoding then sees a different
// name and the mismatch surfaces there.
constexpr auto kDumpErrors = ordered_json::error_handler_t::replace;

std::string Hex64(uint64_t value) { return absl::StrFormat("%016x", value); }

// Exactly 16 lowercase hex digits, as Hex64 writes them.
bool ParseHex64(absl::string_view text, uint64_t* value) {
  if (text.size() != 16) return false;
  uint64_t v = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(digit);
  }
  *value = v;
  return true;
}

}  // namespace

// Shard files are opened inside the step directory by these names, so a name
// must stay a single path component.
absl::Status ValidatePlainFileName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("file name is empty");
  if (name.size() > kMaxFileNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("file name '", internal::PrintableForError(name),
                                                   "' is ", name.size(), " bytes; the limit is ",
                                                   kMaxFileNameBytes));
  }
  if (name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("file name '", name, "' is not a plain name"));
  }
  for (char ch : name) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '/' || c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat("file name '",
                                                     internal::PrintableForError(name),
                                                     "' contains '/' or a control character"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Typed access to the fields of one JSON object read from disk. Every failure
// is DataLoss and names the object (`where`) and the field.
class FieldReader {
 public:
  FieldReader(const json& object, std::string where) : object_(object), where_(std::move(where)) {}

  absl::Status Error(absl::string_view field, absl::string_view message) const {
    return absl::DataLossError(absl::StrCat(where_, ": \"", field, "\" ", message));
  }
  absl::Status Wrap(absl::string_view field, const absl::Status& status) const {
    if (status.ok()) return status;
    return Error(field, status.message());
  }

  bool Has(const char* field) const { return object_.find(field) != object_.end(); }

  absl::StatusOr<const json*> Get(const char* field) const {
    const auto it = object_.find(field);
    if (it == object_.end()) return Error(field, "is missing");
    return &*it;
  }

  absl::StatusOr<std::string> String(const char* field) const {
    ZCC_ASSIGN_OR_RETURN(const json* v, Get(field));
    if (!v->is_string()) return TypeError(field, "a string", *v);
    return v->get<std::string>();
  }

  absl::StatusOr<uint64_t> Unsigned(const char* field, uint64_t max = UINT64_MAX) const {
    ZCC_ASSIGN_OR_RETURN(const json* v, Get(field));
    if (!v->is_number_unsigned()) return TypeError(field, "a non-negative integer", *v);
    const uint64_t u = v->get<uint64_t>();
    if (u > max) return Error(field, absl::StrCat("is ", u, "; the maximum is ", max));
    return u;
  }

  absl::StatusOr<uint64_t> Hex(const char* field) const {
    ZCC_ASSIGN_OR_RETURN(std::string text, String(field));
    uint64_t value = 0;
    if (!ParseHex64(text, &value)) {
      return Error(field, absl::StrCat("is '", internal::PrintableForError(text),
                                       "', not 16 lowercase hex digits"));
    }
    return value;
  }

  absl::StatusOr<const json*> Array(const char* field) const {
    ZCC_ASSIGN_OR_RETURN(const json* v, Get(field));
    if (!v->is_array()) return TypeError(field, "an array", *v);
    return v;
  }

  absl::StatusOr<const json*> Object(const char* field) const {
    ZCC_ASSIGN_OR_RETURN(const json* v, Get(field));
    if (!v->is_object()) return TypeError(field, "an object", *v);
    return v;
  }

  absl::StatusOr<std::vector<int64_t>> Shape(const char* field) const {
    ZCC_ASSIGN_OR_RETURN(const json* v, Array(field));
    if (v->size() > kMaxManifestDims) {
      return Error(field, absl::StrCat("has ", v->size(), " dimensions; at most ",
                                       kMaxManifestDims));
    }
    std::vector<int64_t> shape;
    shape.reserve(v->size());  // bounded by the document size
    for (size_t i = 0; i < v->size(); ++i) {
      const json& d = (*v)[i];
      if (d.is_number_integer() && !d.is_number_unsigned()) {
        return Error(
            field, absl::StrCat("has the negative dimension ", d.get<int64_t>(), " at index ", i));
      }
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return Error(field, absl::StrCat("[", i, "] must be a non-negative 64-bit integer, not ",
                                         internal::JsonTypeName(d)));
      }
      shape.push_back(d.get<int64_t>());
    }
    return shape;
  }

  absl::Status FormatVersion() const {
    ZCC_ASSIGN_OR_RETURN(uint64_t version, Unsigned("format_version"));
    if (version != static_cast<uint64_t>(kFormatVersion) &&
        version != static_cast<uint64_t>(kSlicedFormatVersion)) {
      return Error("format_version", absl::StrCat("is ", version, "; this build reads versions ",
                                                  kFormatVersion, " and ", kSlicedFormatVersion));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> JobId() const {
    ZCC_ASSIGN_OR_RETURN(std::string job_id, String("job_id"));
    ZCC_RETURN_IF_ERROR(Wrap("job_id", ValidateJobId(job_id)));
    return job_id;
  }

 private:
  absl::Status TypeError(absl::string_view field, absl::string_view expected,
                         const json& got) const {
    return Error(field, absl::StrCat("must be ", expected, ", not ", internal::JsonTypeName(got)));
  }

  const json& object_;
  std::string where_;
};

// Parses `text` as a JSON object no larger than `max_bytes`, the elements of
// `streamed` (when given) handed to its callback.
absl::StatusOr<json> ParseDocument(absl::string_view text, absl::string_view what,
                                   const internal::StreamedArray* streamed = nullptr,
                                   uint64_t max_bytes = kMaxManifestBytes) {
  if (text.size() > max_bytes) {
    return absl::DataLossError(
        absl::StrCat(what, " is ", text.size(), " bytes; the limit is ", max_bytes));
  }
  ZCC_ASSIGN_OR_RETURN(json root,
                       streamed == nullptr
                           ? internal::ParseStrictJson(text, kMaxManifestDepth, what)
                           : internal::ParseStrictJson(text, kMaxManifestDepth, what, *streamed));
  if (!root.is_object()) {
    return absl::DataLossError(
        absl::StrCat(what, " must be a JSON object, not ", internal::JsonTypeName(root)));
  }
  return root;
}

bool IsWholePiece(const ManifestTensor& t) {
  if (t.global_shape.empty() && t.box_offset.empty()) return true;
  return t.global_shape == t.shape &&
         std::all_of(t.box_offset.begin(), t.box_offset.end(), [](int64_t o) { return o == 0; });
}

bool IsManifestKind(absl::string_view kind) {
  return kind == kEmaKindName || ParseTensorKindName(kind).ok();
}

// Where a tensor entry is, for messages: its index, and its name once valid.
std::string TensorWhere(size_t i, const std::string* name) {
  std::string where = absl::StrCat("manifest tensors[", i, "]");
  if (name != nullptr) absl::StrAppend(&where, " ('", *name, "')");
  return where;
}

// One element of "tensors", checked on its own (the checks against "files"
// come once the whole document is read: JSON members come in any order).
absl::StatusOr<ManifestTensor> DecodeTensorEntry(size_t i, const json& entry) {
  if (!entry.is_object()) {
    return absl::DataLossError(absl::StrCat(TensorWhere(i, nullptr), " must be an object, not ",
                                            internal::JsonTypeName(entry)));
  }
  ManifestTensor t;
  {
    const FieldReader f(entry, TensorWhere(i, nullptr));
    ZCC_ASSIGN_OR_RETURN(t.name, f.String("name"));
    ZCC_RETURN_IF_ERROR(f.Wrap("name", ValidateTensorName(t.name)));
  }
  // The name is valid now; quote it in every later message.
  const FieldReader f(entry, TensorWhere(i, &t.name));
  ZCC_ASSIGN_OR_RETURN(const std::string dtype, f.String("dtype"));
  absl::StatusOr<DType> parsed = ParseDTypeName(dtype);
  if (!parsed.ok()) return f.Wrap("dtype", parsed.status());
  t.dtype = *parsed;
  ZCC_ASSIGN_OR_RETURN(t.shape, f.Shape("shape"));
  if (f.Has("global_shape") || f.Has("box_offset")) {
    ZCC_ASSIGN_OR_RETURN(t.global_shape, f.Shape("global_shape"));
    ZCC_ASSIGN_OR_RETURN(t.box_offset, f.Shape("box_offset"));
    absl::StatusOr<uint64_t> global_bytes = TensorBytes(t.dtype, t.global_shape);
    if (!global_bytes.ok()) return f.Wrap("global_shape", global_bytes.status());
    ZCC_RETURN_IF_ERROR(f.Wrap("box_offset", ValidateBox(Box{t.box_offset, t.shape}, t.global_shape)));
  } else {
    t.global_shape = t.shape;
    t.box_offset.assign(t.shape.size(), 0);
  }
  ZCC_ASSIGN_OR_RETURN(t.kind, f.String("kind"));
  if (!IsManifestKind(t.kind)) {
    return f.Error("kind", absl::StrCat("is '", internal::PrintableForError(t.kind),
                                        "'; expected param, optim, extra or ema"));
  }
  ZCC_ASSIGN_OR_RETURN(t.file, f.String("file"));
  ZCC_ASSIGN_OR_RETURN(t.offset, f.Unsigned("offset"));
  ZCC_ASSIGN_OR_RETURN(t.nbytes, f.Unsigned("nbytes"));
  absl::StatusOr<uint64_t> expected = TensorBytes(t.dtype, t.shape);
  if (!expected.ok()) return f.Wrap("shape", expected.status());
  if (*expected != t.nbytes) {
    return f.Error("nbytes",
                   absl::StrCat("is ", t.nbytes, " but ", dtype, " x [",
                                absl::StrJoin(t.shape, ","), "] is ", *expected, " bytes"));
  }
  ZCC_ASSIGN_OR_RETURN(t.xxh3, f.Hex("xxh3"));
  return t;
}

// A rank's manifest, or (`index`) a step's global index: the same document
// without "rank" and "manifest_hash", in which a name appears once per piece.
absl::StatusOr<RankManifest> DecodeManifestDocument(absl::string_view text, bool index,
                                                    uint64_t max_bytes = kMaxManifestBytes) {
  RankManifest m;
  const char* const what = index ? "step index" : "manifest";
  // The tensors are decoded as the parser completes each entry, never held
  // as one DOM (for a million tensors that took gigabytes and most of the
  // decoding time).
  // "kind/name" (a manifest) or "kind/name/file" (an index: a name once per
  // piece, and a file holds a name once); kinds and files hold no '/'.
  absl::flat_hash_set<std::string> seen;
  internal::StreamedArray tensors_stream;
  tensors_stream.key = "tensors";
  tensors_stream.on_element = [&](size_t i, json entry) -> absl::Status {
    ZCC_ASSIGN_OR_RETURN(ManifestTensor t, DecodeTensorEntry(i, entry));
    std::string key = absl::StrCat(t.kind, "/", t.name);
    if (index) absl::StrAppend(&key, "/", t.file);
    if (!seen.insert(std::move(key)).second) {
      return absl::DataLossError(absl::StrCat(TensorWhere(i, &t.name), ": a ", t.kind,
                                              index ? " piece of this name in this file" : " tensor of this name",
                                              " is listed twice"));
    }
    m.tensors.push_back(std::move(t));
    return absl::OkStatus();
  };
  ZCC_ASSIGN_OR_RETURN(const json root, ParseDocument(text, what, &tensors_stream, max_bytes));
  const FieldReader top(root, what);
  ZCC_RETURN_IF_ERROR(top.FormatVersion());
  ZCC_ASSIGN_OR_RETURN(const uint64_t version, top.Unsigned("format_version"));
  m.format_version = static_cast<int>(version);
  ZCC_ASSIGN_OR_RETURN(m.job_id, top.JobId());
  ZCC_ASSIGN_OR_RETURN(const uint64_t step, top.Unsigned("step", INT64_MAX));
  m.step = static_cast<int64_t>(step);
  ZCC_ASSIGN_OR_RETURN(m.world_size, top.Unsigned("world_size", UINT32_MAX));
  if (m.world_size == 0) return top.Error("world_size", "is 0");
  if (top.Has("ema_step")) {
    ZCC_ASSIGN_OR_RETURN(const uint64_t ema_step, top.Unsigned("ema_step", INT64_MAX));
    if (static_cast<int64_t>(ema_step) > m.step) {
      return top.Error("ema_step", absl::StrCat("is ", ema_step, ", after the step, ", m.step));
    }
    m.ema_step = static_cast<int64_t>(ema_step);
  }
  // (Every rank's of a step the same: the step index has it too.)
  if (top.Has("timeline")) {
    ZCC_ASSIGN_OR_RETURN(m.timeline, top.String("timeline"));
    if (m.timeline.empty() || !ValidateRunTag(m.timeline, "timeline").ok()) {
      return top.Error("timeline", "must be 1 to 128 printable bytes without spaces, quotes or "
                                   "backslashes");
    }
  }
  if (!index) {
    ZCC_ASSIGN_OR_RETURN(m.rank, top.Unsigned("rank", UINT32_MAX));
    if (m.rank >= m.world_size) {
      return top.Error("rank", absl::StrCat("is ", m.rank, " but world_size is ", m.world_size));
    }
    ZCC_ASSIGN_OR_RETURN(m.manifest_hash, top.Hex("manifest_hash"));
    if (top.Has("run_id")) {
      ZCC_ASSIGN_OR_RETURN(m.run_id, top.String("run_id"));
      if (m.run_id.empty() || !ValidateRunTag(m.run_id, "run_id").ok()) {
        return top.Error("run_id", "must be 1 to 128 printable bytes without spaces, quotes or "
                                   "backslashes");
      }
    }
    if (top.Has("replica_groups")) {
      ZCC_ASSIGN_OR_RETURN(const json* groups, top.Array("replica_groups"));
      // At most one group per tensor (a group per global expert id).
      if (groups->size() > kMaxManifestEntries) {
        return top.Error("replica_groups",
                         absl::StrCat("holds more than ", kMaxManifestEntries, " groups"));
      }
      for (size_t i = 0; i < groups->size(); ++i) {
        const std::string where = absl::StrCat(what, " replica_groups[", i, "]");
        if (!(*groups)[i].is_object()) {
          return absl::DataLossError(absl::StrCat(where, " must be an object"));
        }
        const FieldReader g((*groups)[i], where);
        ReplicaDigest d;
        ZCC_ASSIGN_OR_RETURN(d.kind, g.String("kind"));
        if (d.kind != "dp" && d.kind != "expert_dp") {
          return g.Error("kind", absl::StrCat("is '", internal::PrintableForError(d.kind),
                                              "'; expected dp or expert_dp"));
        }
        if (d.kind == "expert_dp") {
          ZCC_ASSIGN_OR_RETURN(const uint64_t id, g.Unsigned("expert_id", UINT32_MAX));
          d.expert_id = static_cast<int64_t>(id);
        }
        ZCC_ASSIGN_OR_RETURN(d.size, g.Unsigned("size", UINT32_MAX));
        ZCC_ASSIGN_OR_RETURN(d.member, g.Unsigned("member", UINT32_MAX));
        if (d.size == 0 || d.member >= d.size) {
          return g.Error("member", absl::StrCat("is ", d.member, " in a group of ", d.size));
        }
        ZCC_ASSIGN_OR_RETURN(d.hash, g.Hex("hash"));
        m.replica_groups.push_back(std::move(d));
      }
    }
  }

  ZCC_ASSIGN_OR_RETURN(const json* files, top.Array("files"));
  std::map<std::string, uint64_t> file_bytes;
  for (size_t i = 0; i < files->size(); ++i) {
    const json& entry = (*files)[i];
    const std::string where = absl::StrCat(what, " files[", i, "]");
    if (!entry.is_object()) {
      return absl::DataLossError(
          absl::StrCat(where, " must be an object, not ", internal::JsonTypeName(entry)));
    }
    const FieldReader f(entry, where);
    ManifestFile file;
    ZCC_ASSIGN_OR_RETURN(file.name, f.String("name"));
    ZCC_RETURN_IF_ERROR(f.Wrap("name", ValidatePlainFileName(file.name)));
    ZCC_ASSIGN_OR_RETURN(file.bytes, f.Unsigned("bytes"));
    if (!file_bytes.emplace(file.name, file.bytes).second) {
      return f.Error("name", absl::StrCat("'", file.name, "' is listed twice"));
    }
    m.files.push_back(std::move(file));
  }

  // Present, and an array (its elements were streamed out of it).
  ZCC_RETURN_IF_ERROR(top.Array("tensors").status());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const ManifestTensor& t = m.tensors[i];
    const auto error = [&](absl::string_view field, absl::string_view message) {
      return absl::DataLossError(
          absl::StrCat(TensorWhere(i, &t.name), ": \"", field, "\" ", message));
    };
    const auto file = file_bytes.find(t.file);
    if (file == file_bytes.end()) {
      return error("file", absl::StrCat("'", internal::PrintableForError(t.file),
                                        "' is not in the manifest's \"files\""));
    }
    // offset + nbytes <= file size, written so that it cannot overflow.
    if (t.offset > file->second || t.nbytes > file->second - t.offset) {
      return error("offset", absl::StrCat("[", t.offset, ", +", t.nbytes, ") lies outside '",
                                          t.file, "', which is ", file->second, " bytes"));
    }
  }
  return m;
}

absl::StatusOr<CommitRecord> DecodeCommitRecordJson(absl::string_view text) {
  ZCC_ASSIGN_OR_RETURN(const json root, ParseDocument(text, "commit record"));
  const FieldReader f(root, "commit record");
  CommitRecord r;
  ZCC_RETURN_IF_ERROR(f.FormatVersion());
  ZCC_ASSIGN_OR_RETURN(r.job_id, f.JobId());
  ZCC_ASSIGN_OR_RETURN(const uint64_t step, f.Unsigned("step", INT64_MAX));
  r.step = static_cast<int64_t>(step);
  ZCC_ASSIGN_OR_RETURN(r.world_size, f.Unsigned("world_size", UINT32_MAX));
  if (r.world_size == 0) return f.Error("world_size", "is 0");
  ZCC_ASSIGN_OR_RETURN(r.manifest_hash, f.Hex("manifest_hash"));
  ZCC_ASSIGN_OR_RETURN(r.total_bytes, f.Unsigned("total_bytes"));
  ZCC_ASSIGN_OR_RETURN(r.committed_at, f.String("committed_at"));
  absl::Time parsed;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, r.committed_at, &parsed, &err)) {
    return f.Error("committed_at", absl::StrCat("is '", internal::PrintableForError(r.committed_at),
                                                "', not an RFC 3339 time: ", err));
  }
  if (f.Has("index_xxh3")) {
    ZCC_ASSIGN_OR_RETURN(r.index_xxh3, f.Hex("index_xxh3"));
    if (r.index_xxh3 == 0) return f.Error("index_xxh3", "is 0");
  }
  // (Shown by zccctl list: printable, as zccd takes them.)
  for (auto [name, value] : {std::pair<const char*, std::string*>{"run_id", &r.run_id},
                             std::pair<const char*, std::string*>{"timeline", &r.timeline}}) {
    if (!f.Has(name)) continue;
    ZCC_ASSIGN_OR_RETURN(*value, f.String(name));
    if (value->empty() || !ValidateRunTag(*value, name).ok()) {
      return f.Error(name, "must be 1 to 128 printable bytes without spaces, quotes or "
                           "backslashes");
    }
  }
  return r;
}

absl::StatusOr<std::map<std::string, std::string>> DecodeWeightMapIndexJson(
    absl::string_view text) {
  ZCC_ASSIGN_OR_RETURN(const json root, ParseDocument(text, "weight map index"));
  const FieldReader top(root, "weight map index");
  // transformers always writes "metadata"; only "weight_map" is needed to load.
  if (root.contains("metadata")) {
    ZCC_ASSIGN_OR_RETURN(const json* metadata, top.Object("metadata"));
    if (metadata->contains("total_size")) {
      ZCC_RETURN_IF_ERROR(
          FieldReader(*metadata, "weight map index metadata").Unsigned("total_size").status());
    }
  }
  ZCC_ASSIGN_OR_RETURN(const json* map, top.Object("weight_map"));
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, file] : map->items()) {
    ZCC_RETURN_IF_ERROR(top.Wrap("weight_map", ValidateTensorName(name)));
    if (!file.is_string()) {
      return top.Error("weight_map", absl::StrCat("entry '", name, "' must be a string, not ",
                                                  internal::JsonTypeName(file)));
    }
    const std::string& file_name = file.get_ref<const std::string&>();
    ZCC_RETURN_IF_ERROR(top.Wrap("weight_map", Annotate(ValidatePlainFileName(file_name),
                                                        absl::StrCat("entry '", name, "'"))));
    weight_map.emplace(name, file_name);
  }
  return weight_map;
}

// Runs a decoder with a net under it: the decoders check every type before
// reading a value, so this only turns a missed check into an error instead of
// an exception escaping the module.
template <typename Decode>
auto DecodeWithoutExceptions(Decode decode, absl::string_view text, absl::string_view what)
    -> decltype(decode(text)) {
  try {
    return decode(text);
  } catch (const json::exception& e) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", internal::PrintableForError(e.what(), 256)));
  }
}

}  // namespace

// Plain ASCII without the bytes JSON escapes: copied into the text as is.
bool IsPlainJsonString(absl::string_view s) {
  for (const char c : s) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') return false;
  }
  return true;
}

void AppendJsonArray(const std::vector<int64_t>& values, std::string* out) {
  if (values.empty()) {
    out->append("[]");
    return;
  }
  out->append("[\n");
  for (size_t i = 0; i < values.size(); ++i) {
    absl::StrAppend(out, "    ", values[i], i + 1 < values.size() ? ",\n" : "\n");
  }
  out->append("   ]");
}

// One tensor entry, in exactly the bytes nlohmann's dump(1) writes for it at
// the manifest's nesting (the tests compare the two), without building a DOM:
// the entries are most of a manifest's encoding time. False (nothing
// appended) for strings that would need escaping: the caller uses nlohmann.
bool AppendPlainEntry(const ManifestTensor& t, std::string* out) {
  if (!IsPlainJsonString(t.name) || !IsPlainJsonString(t.kind) || !IsPlainJsonString(t.file)) {
    return false;
  }
  absl::StrAppend(out, "  {\n   \"name\": \"", t.name, "\",\n   \"dtype\": \"", DTypeName(t.dtype),
                  "\",\n   \"shape\": ");
  AppendJsonArray(t.shape, out);
  if (!IsWholePiece(t)) {
    out->append(",\n   \"global_shape\": ");
    AppendJsonArray(t.global_shape, out);
    out->append(",\n   \"box_offset\": ");
    AppendJsonArray(t.box_offset, out);
  }
  absl::StrAppend(out, ",\n   \"kind\": \"", t.kind, "\",\n   \"file\": \"", t.file,
                  "\",\n   \"offset\": ", t.offset, ",\n   \"nbytes\": ", t.nbytes,
                  ",\n   \"xxh3\": \"", Hex64(t.xxh3), "\"\n  }");
  return true;
}

// The slow path of the same, kept for the test that compares the two.
std::string NlohmannEntry(const ManifestTensor& t) {
  ordered_json entry = ordered_json::object();
  entry["name"] = t.name;
  entry["dtype"] = std::string(DTypeName(t.dtype));
  entry["shape"] = t.shape;
  if (!IsWholePiece(t)) {
    entry["global_shape"] = t.global_shape;
    entry["box_offset"] = t.box_offset;
  }
  entry["kind"] = t.kind;
  entry["file"] = t.file;
  entry["offset"] = t.offset;
  entry["nbytes"] = t.nbytes;
  entry["xxh3"] = Hex64(t.xxh3);
  std::string text = "  ";
  for (char c : entry.dump(1, ' ', /*ensure_ascii=*/false, kDumpErrors)) {
    text.push_back(c);
    if (c == '\n') text += "  ";
  }
  return text;
}

std::string EncodeManifestDocument(const RankManifest& manifest,
                                   const std::vector<ManifestTensor>& tensors, bool index) {
  ordered_json root = ordered_json::object();
  // A manifest with a piece of a sliced tensor is refused by readers that
  // predate pieces (they would take the piece for the tensor).
  const bool sliced = std::any_of(tensors.begin(), tensors.end(),
                                  [](const ManifestTensor& t) { return !IsWholePiece(t); });
  root["format_version"] =
      !index && sliced ? std::max(manifest.format_version, kSlicedFormatVersion)
                       : manifest.format_version;
  root["job_id"] = manifest.job_id;
  root["step"] = manifest.step;
  if (!index) root["rank"] = manifest.rank;
  root["world_size"] = manifest.world_size;
  if (!index) root["manifest_hash"] = Hex64(manifest.manifest_hash);
  if (!index && !manifest.run_id.empty()) root["run_id"] = manifest.run_id;
  if (!manifest.timeline.empty()) root["timeline"] = manifest.timeline;
  if (manifest.ema_step >= 0) root["ema_step"] = manifest.ema_step;
  if (!index && !manifest.replica_groups.empty()) {
    ordered_json groups = ordered_json::array();
    for (const ReplicaDigest& g : manifest.replica_groups) {
      ordered_json entry = ordered_json::object();
      entry["kind"] = g.kind;
      if (g.kind == "expert_dp") entry["expert_id"] = g.expert_id;
      entry["size"] = g.size;
      entry["member"] = g.member;
      entry["hash"] = Hex64(g.hash);
      groups.push_back(std::move(entry));
    }
    root["replica_groups"] = std::move(groups);
  }
  ordered_json files = ordered_json::array();
  for (const ManifestFile& file : manifest.files) {
    ordered_json entry = ordered_json::object();
    entry["name"] = file.name;
    entry["bytes"] = file.bytes;
    files.push_back(std::move(entry));
  }
  root["files"] = std::move(files);
  root["tensors"] = ordered_json::array();
  std::string text = root.dump(1, ' ', /*ensure_ascii=*/false, kDumpErrors);
  if (tensors.empty()) return text + "\n";

  // The tensors are appended entry by entry, in the bytes nlohmann writes for
  // the whole document, instead of being built as one document first: a
  // DOM of a million entries takes gigabytes, the text a fraction of that.
  // Each entry is dumped on its own and indented by the two levels it sits
  // at; a raw newline in a dump is always a line break (dump escapes the
  // ones inside strings).
  constexpr absl::string_view kEmptyTail = "[]\n}";
  text.resize(text.size() - kEmptyTail.size());
  text += "[\n";
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ManifestTensor& t = tensors[i];
    if (i > 0) text += ",\n";
    if (!AppendPlainEntry(t, &text)) text += NlohmannEntry(t);
  }
  text += "\n ]\n}\n";
  return text;
}

std::string EncodeRankManifest(const RankManifest& manifest) {
  return EncodeManifestDocument(manifest, manifest.tensors, /*index=*/false);
}

namespace internal {
bool ManifestEntryEncodersAgree(const ManifestTensor& t, std::string* fast, std::string* slow) {
  fast->clear();
  if (!AppendPlainEntry(t, fast)) return false;
  *slow = NlohmannEntry(t);
  return *fast == *slow;
}
}  // namespace internal

absl::StatusOr<RankManifest> DecodeRankManifest(absl::string_view json) {
  return DecodeWithoutExceptions(
      [](absl::string_view text) { return DecodeManifestDocument(text, /*index=*/false); }, json,
      "manifest");
}

std::string EncodeStepIndex(const StepIndex& index) {
  RankManifest doc;
  doc.format_version = index.format_version;
  doc.job_id = index.job_id;
  doc.step = index.step;
  doc.world_size = index.world_size;
  doc.ema_step = index.ema_step;
  doc.timeline = index.timeline;
  doc.files = index.files;
  return EncodeManifestDocument(doc, index.pieces, /*index=*/true);
}

absl::StatusOr<StepIndex> DecodeStepIndex(absl::string_view json, uint64_t max_bytes) {
  ZCC_ASSIGN_OR_RETURN(
      RankManifest doc,
      DecodeWithoutExceptions(
          [max_bytes](absl::string_view text) {
            return DecodeManifestDocument(text, /*index=*/true, max_bytes);
          },
          json, "step index"));
  StepIndex index;
  index.format_version = doc.format_version;
  index.job_id = std::move(doc.job_id);
  index.step = doc.step;
  index.world_size = doc.world_size;
  index.ema_step = doc.ema_step;
  index.timeline = std::move(doc.timeline);
  index.files = std::move(doc.files);
  index.pieces = std::move(doc.tensors);
  return index;
}

std::string EncodeCommitRecord(const CommitRecord& record) {
  ordered_json root = ordered_json::object();
  root["format_version"] = record.format_version;
  root["job_id"] = record.job_id;
  root["step"] = record.step;
  root["world_size"] = record.world_size;
  root["manifest_hash"] = Hex64(record.manifest_hash);
  root["total_bytes"] = record.total_bytes;
  root["committed_at"] = record.committed_at;
  if (record.index_xxh3 != 0) root["index_xxh3"] = Hex64(record.index_xxh3);
  if (!record.run_id.empty()) root["run_id"] = record.run_id;
  if (!record.timeline.empty()) root["timeline"] = record.timeline;
  return root.dump(1, ' ', /*ensure_ascii=*/false, kDumpErrors) + "\n";
}

absl::StatusOr<CommitRecord> DecodeCommitRecord(absl::string_view json) {
  return DecodeWithoutExceptions(DecodeCommitRecordJson, json, "commit record");
}

std::string EncodeWeightMapIndex(const std::map<std::string, std::string>& weight_map,
                                 uint64_t total_size) {
  // json (not ordered_json): its objects are sorted maps, so "metadata" comes
  // before "weight_map" and the names keep std::map's order, as transformers
  // writes them, and the map converts in linear time. (ordered_json finds
  // every key by a linear scan: quadratic in the tensor count.)
  json root = json::object();
  root["metadata"] = json::object({{"total_size", total_size}});
  root["weight_map"] = json(weight_map);
  return root.dump(2, ' ', /*ensure_ascii=*/false, kDumpErrors) + "\n";
}

absl::StatusOr<std::map<std::string, std::string>> DecodeWeightMapIndex(absl::string_view json) {
  return DecodeWithoutExceptions(DecodeWeightMapIndexJson, json, "weight map index");
}

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

std::string PartialStepDirName(int64_t step) { return StepDirName(step) + ".partial"; }
std::string SentStepDirName(int64_t step) { return StepDirName(step) + ".sent"; }

absl::StatusOr<int64_t> ParseStepDirName(absl::string_view name) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("'", internal::PrintableForError(name),
                                                   "' is not a step directory name: ", why));
  };
  constexpr absl::string_view kPrefix = "step-";
  if (name.substr(0, kPrefix.size()) != kPrefix) return bad("it does not start with 'step-'");
  const absl::string_view digits = name.substr(kPrefix.size());
  if (digits.size() < kMinStepDigits) return bad("fewer than 8 digits follow 'step-'");
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return bad("only decimal digits may follow 'step-'");
    }
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(digits, &step)) return bad("the step does not fit in 64 bits");
  // "step-000001000" would alias "step-00001000"; only StepDirName's spelling counts.
  if (StepDirName(step) != name) return bad("the step has extra leading zeros");
  return step;
}

std::string ShardFileName(absl::string_view prefix, uint32_t rank) {
  return absl::StrFormat("%s-r%05u.safetensors", prefix, rank);
}

std::string ExtraFileName(uint32_t rank) { return absl::StrFormat("extra-r%05u.bin", rank); }

std::string ManifestFileName(uint32_t rank) { return absl::StrFormat("r%05u.manifest.json", rank); }

}  // namespace zcc::format
