#include "checkpoint/rank_shards.h"

#include "format/manifest.h"

namespace zcc::checkpoint {

std::string ShardFileForKind(format::TensorKind kind, uint32_t rank) {
  switch (kind) {
    case format::TensorKind::kParam: return format::ShardFileName("model", rank);
    case format::TensorKind::kOptim: return format::ShardFileName("optim", rank);
    case format::TensorKind::kExtra: return format::ExtraFileName(rank);
  }
  return format::ExtraFileName(rank);
}

}  // namespace zcc::checkpoint
