#include "checkpoint/rank_shards.h"

#include "format/manifest.h"

namespace zcc::checkpoint {

const char* KindForGroup(shm::FileGroup group) {
  switch (group) {
    case shm::FileGroup::kModel: return "param";
    case shm::FileGroup::kOptim: return "optim";
    case shm::FileGroup::kExtra: return "extra";
  }
  return "extra";
}

std::string FileForGroup(shm::FileGroup group, uint32_t rank) {
  switch (group) {
    case shm::FileGroup::kModel: return format::ShardFileName("model", rank);
    case shm::FileGroup::kOptim: return format::ShardFileName("optim", rank);
    case shm::FileGroup::kExtra: return format::ExtraFileName(rank);
  }
  return format::ExtraFileName(rank);
}

}  // namespace zcc::checkpoint
