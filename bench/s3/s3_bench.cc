// Object-store transfers: zcc's S3 storage (streamed multipart upload of a
// shard-sized object, ranged reads into memory) against boto3's managed
// transfers (bench/s3/boto3_transfer.py) on the same server and bytes, in
// alternating rounds. The server is tools/s3/test_server.py (moto, in Python,
// signatures checked): both sides are bounded by it, so the rows compare the
// clients, not the network.
//
//   s3_upload_gbps_vs_boto3      zcc upload GB/s / boto3 upload_file GB/s
//   s3_download_gbps_vs_boto3    zcc ranged reads GB/s / boto3 download_fileobj GB/s
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "common/file_util.h"
#include "storage/aligned_buffer.h"
#include "storage/io_pipeline.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_storage.h"
#include "tests/process_harness.h"
#include "tests/s3_test_server.h"

namespace zcc::bench {
namespace {

constexpr size_t kChunk = size_t{8} << 20;  // the shard writer's request size
// Ranged GETs of the size of boto3's parts: each request to an object store
// has a cost of its own (moto's grows with the object), so reads from a
// store go in larger pieces than from a disk.
constexpr size_t kReadChunk = size_t{16} << 20;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// zcc: the object written as a direct writer streams it, synced.
double ZccUpload(storage::Storage& s3, const std::string& path, const storage::AlignedBuffer& data) {
  const absl::Time start = absl::Now();
  storage::OpenOptions direct;
  direct.direct = true;
  direct.queue_depth = 4;
  auto file = s3.OpenForWrite(path, direct);
  if (!file.ok()) return -1;
  storage::IoPipeline pipe(file->get());
  for (size_t off = 0; off < data.size(); off += kChunk) {
    if (pipe.full() && !pipe.RetireOldest().ok()) return -1;
    if (!pipe.SubmitWrite(off, data.data() + off, std::min(kChunk, data.size() - off)).ok()) {
      return -1;
    }
  }
  if (!pipe.Finish().ok() || !(*file)->Sync().ok() || !(*file)->Close().ok()) return -1;
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// zcc: the object read back with ranged GETs in flight, into memory.
double ZccDownload(storage::Storage& s3, const std::string& path, storage::AlignedBuffer& into) {
  const absl::Time start = absl::Now();
  storage::OpenOptions options;
  options.queue_depth = 8;
  auto file = s3.OpenForRead(path, options);
  if (!file.ok()) return -1;
  storage::IoPipeline pipe(file->get());
  for (size_t off = 0; off < into.size(); off += kReadChunk) {
    if (pipe.full() && !pipe.RetireOldest().ok()) return -1;
    if (!pipe.SubmitRead(off, into.data() + off, std::min(kReadChunk, into.size() - off)).ok()) {
      return -1;
    }
  }
  while (pipe.pending() > 0) {
    if (!pipe.RetireOldest().ok()) return -1;
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// boto3: one transfer, timed inside the Python process (its start-up aside).
double Boto3(const testing::S3TestServer& server, const std::string& log_dir, const char* op,
             const std::string& key, const std::string& file) {
  static int n = 0;
  auto python = testing::S3Python();
  if (!python.ok()) return -1;
  testing::Subprocess p({*python, testing::Runfile("bench/s3/boto3_transfer.py"), op,
                         server.endpoint, server.bucket, key, file},
                        absl::StrCat(log_dir, "/boto3.", n++, ".log"), -1,
                        {"AWS_ACCESS_KEY_ID=" + server.access_key,
                         "AWS_SECRET_ACCESS_KEY=" + server.secret_key});
  if (p.Wait(absl::Minutes(10)).value_or(-1) != 0) {
    std::fprintf(stderr, "s3_bench: boto3 %s failed:\n%s\n", op, p.Output().c_str());
    return -1;
  }
  double seconds = -1;
  if (!absl::SimpleAtod(p.Values()["seconds"], &seconds)) return -1;
  return seconds;
}

int Main(int argc, char** argv) {
  const bool quick = QuickMode(argc, argv);
  const size_t bytes = quick ? (size_t{256} << 20) : (size_t{1} << 30);
  const int rounds = quick ? 3 : 5;
  char tmpl[] = "/tmp/zcc-s3-bench.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { (void)RemoveTree(dir); }
  } cleanup{dir};
  auto server = testing::StartS3TestServer(dir);
  if (!server.ok()) {
    std::fprintf(stderr, "s3_bench: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  storage::s3::Endpoint endpoint;
  endpoint.url = server->endpoint;
  storage::s3::S3Client client(endpoint, {server->access_key, server->secret_key, "", "bench"});
  storage::s3::S3StorageOptions options;
  options.bucket = server->bucket;
  storage::s3::S3Storage s3(&client, options);
  if (!s3.MakeDirs("/bench").ok()) return 1;

  storage::AlignedBuffer data(bytes);
  for (size_t i = 0; i < bytes; i += 8) data.data()[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  const std::string file = JoinPath(dir, "object.bin");
  if (!WriteFileAtomic(file, std::string(reinterpret_cast<const char*>(data.data()), bytes)).ok()) {
    return 1;
  }
  std::vector<double> zcc_up, boto_up, zcc_down, boto_down;
  storage::AlignedBuffer back(bytes);
  for (int r = 0; r < rounds; ++r) {
    const std::string key = absl::StrCat("bench/zcc-", r);
    zcc_up.push_back(ZccUpload(s3, "/" + key, data));
    boto_up.push_back(Boto3(*server, dir, "upload", absl::StrCat("bench/boto3-", r), file));
    zcc_down.push_back(ZccDownload(s3, "/" + key, back));
    boto_down.push_back(Boto3(*server, dir, "download", key, file));
    std::fprintf(stderr,
                 "s3_bench: round %d, %.0f MB: upload zcc %.2f s, boto3 %.2f s; download zcc "
                 "%.2f s, boto3 %.2f s\n",
                 r, bytes / 1e6, zcc_up.back(), boto_up.back(), zcc_down.back(), boto_down.back());
  }
  for (const auto* v : {&zcc_up, &boto_up, &zcc_down, &boto_down}) {
    if (std::any_of(v->begin(), v->end(), [](double s) { return s <= 0; })) return 1;
  }
  if (std::string(reinterpret_cast<const char*>(back.data()), bytes) !=
      std::string(reinterpret_cast<const char*>(data.data()), bytes)) {
    std::fprintf(stderr, "s3_bench: the object read back differs\n");
    return 1;
  }
  Emit({"s3_upload_gbps_vs_boto3", bytes / Median(zcc_up) / 1e9, bytes / Median(boto_up) / 1e9, 0,
        ">= 1.0", "GB/s"});
  Emit({"s3_download_gbps_vs_boto3", bytes / Median(zcc_down) / 1e9,
        bytes / Median(boto_down) / 1e9, 0, ">= 1.0", "GB/s"});
  return 0;
}

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) { return zcc::bench::Main(argc, argv); }
