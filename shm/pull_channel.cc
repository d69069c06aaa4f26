#include "shm/pull_channel.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "shm/control_block.h"

namespace zcc::shm {

PullGeometry PullGeometryFor(uint32_t num_tensors) {
  // A snapshot copies one region per tensor from at most one allocation per
  // tensor; the floor leaves room for a few extra blobs.
  const uint32_t n = std::max<uint32_t>(num_tensors, 64);
  PullGeometry g;
  g.max_sources = n;
  g.regions_per_request = n;
  g.sources_offset = RoundUpToPage(sizeof(PullChannel));
  g.regions_offset = g.sources_offset + RoundUpToPage(uint64_t{n} * sizeof(PullSource));
  g.bytes = g.regions_offset + RoundUpToPage(uint64_t{kPullRequests} * n * sizeof(PullRegion));
  return g;
}

void InitPullChannel(PullChannel* ch, const PullGeometry& g, int32_t device) {
  std::memset(static_cast<void*>(ch), 0, sizeof(PullChannel));
  ch->magic = kPullMagic;
  ch->version = kPullVersion;
  ch->device = device;
  ch->max_sources = g.max_sources;
  ch->regions_per_request = g.regions_per_request;
  ch->sources_offset = g.sources_offset;
  ch->regions_offset = g.regions_offset;
}

absl::Status ValidatePullChannel(const PullChannel& ch, const PullGeometry& g) {
  if (ch.magic != kPullMagic || ch.version != kPullVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("the daemon-pull channel has magic ", ch.magic, " version ", ch.version,
                     "; expected ", kPullMagic, " version ", kPullVersion));
  }
  if (ch.max_sources != g.max_sources || ch.regions_per_request != g.regions_per_request ||
      ch.sources_offset != g.sources_offset || ch.regions_offset != g.regions_offset) {
    return absl::FailedPreconditionError(
        "the daemon-pull channel's geometry differs from what zccd registered");
  }
  return absl::OkStatus();
}

}  // namespace zcc::shm
