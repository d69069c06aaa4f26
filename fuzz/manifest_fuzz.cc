#include "fuzz/fuzz_targets.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/validate.h"
#include "format/dtype.h"
#include "format/manifest.h"
#include "fuzz/fuzz_util.h"

namespace zcc::fuzz {

using internal::AsView;
using internal::IsDecodeError;

namespace {

bool SameManifest(const format::RankManifest& a, const format::RankManifest& b) {
  if (a.format_version != b.format_version || a.job_id != b.job_id || a.step != b.step ||
      a.rank != b.rank || a.world_size != b.world_size || a.manifest_hash != b.manifest_hash ||
      a.files.size() != b.files.size() || a.tensors.size() != b.tensors.size()) {
    return false;
  }
  for (size_t i = 0; i < a.files.size(); ++i) {
    if (a.files[i].name != b.files[i].name || a.files[i].bytes != b.files[i].bytes) return false;
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const format::ManifestTensor& x = a.tensors[i];
    const format::ManifestTensor& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.kind != y.kind ||
        x.file != y.file || x.offset != y.offset || x.nbytes != y.nbytes || x.xxh3 != y.xxh3) {
      return false;
    }
  }
  return true;
}

}  // namespace

int FuzzRankManifest(const uint8_t* data, size_t size) {
  const auto m = format::DecodeRankManifest(AsView(data, size));
  if (!m.ok()) {
    FUZZ_CHECK(IsDecodeError(m.status()), m.status().ToString());
    return 0;
  }
  // The promises the reader relies on before it opens and reads shard files.
  FUZZ_CHECK(ValidateJobId(m->job_id).ok(), m->job_id);
  FUZZ_CHECK(m->step >= 0 && m->world_size > 0 && m->rank < m->world_size,
             absl::StrCat("step ", m->step, " rank ", m->rank, "/", m->world_size));
  std::map<std::string, uint64_t> files;
  for (const format::ManifestFile& f : m->files) {
    FUZZ_CHECK(!f.name.empty() && f.name.find('/') == std::string::npos && f.name != "." &&
                   f.name != "..",
               f.name);
    FUZZ_CHECK(files.emplace(f.name, f.bytes).second, f.name);
  }
  for (const format::ManifestTensor& t : m->tensors) {
    FUZZ_CHECK(ValidateTensorName(t.name).ok(), t.name);
    const auto it = files.find(t.file);
    FUZZ_CHECK(it != files.end(), t.file);
    const auto bytes = format::TensorBytes(t.dtype, t.shape);
    FUZZ_CHECK(bytes.ok() && *bytes == t.nbytes, t.name);
    FUZZ_CHECK(t.offset <= it->second && t.nbytes <= it->second - t.offset,
               absl::StrCat(t.name, " [", t.offset, ", +", t.nbytes, ") in ", it->second));
  }
  const std::string encoded = format::EncodeRankManifest(*m);
  const auto again = format::DecodeRankManifest(encoded);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(SameManifest(*m, *again), "manifest changed in a round trip");
  return 0;
}

int FuzzCommitRecord(const uint8_t* data, size_t size) {
  const auto r = format::DecodeCommitRecord(AsView(data, size));
  if (!r.ok()) {
    FUZZ_CHECK(IsDecodeError(r.status()), r.status().ToString());
    return 0;
  }
  FUZZ_CHECK(ValidateJobId(r->job_id).ok(), r->job_id);
  FUZZ_CHECK(r->step >= 0 && r->world_size > 0, absl::StrCat(r->step, " ", r->world_size));
  const auto again = format::DecodeCommitRecord(format::EncodeCommitRecord(*r));
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(again->format_version == r->format_version && again->job_id == r->job_id &&
                 again->step == r->step && again->world_size == r->world_size &&
                 again->manifest_hash == r->manifest_hash &&
                 again->total_bytes == r->total_bytes && again->committed_at == r->committed_at,
             "commit record changed in a round trip");
  return 0;
}

int FuzzWeightMapIndex(const uint8_t* data, size_t size) {
  const auto map = format::DecodeWeightMapIndex(AsView(data, size));
  if (!map.ok()) {
    FUZZ_CHECK(IsDecodeError(map.status()), map.status().ToString());
    return 0;
  }
  for (const auto& [name, file] : *map) {
    FUZZ_CHECK(ValidateTensorName(name).ok(), name);
    FUZZ_CHECK(!file.empty() && file.find('/') == std::string::npos, file);
  }
  const auto again = format::DecodeWeightMapIndex(format::EncodeWeightMapIndex(*map, size));
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(*again == *map, "weight map changed in a round trip");
  return 0;
}

}  // namespace zcc::fuzz
