#include "proto/checkpoint_info.h"

namespace zcc::proto {

void FillCheckpointInfo(const checkpoint::CommittedStep& step, const std::string& path,
                        v1::CheckpointInfo* out) {
  out->set_step(step.step);
  out->set_path(path);
  out->set_is_latest(step.is_latest);
  if (step.record.has_value()) {
    out->set_world_size(step.record->world_size);
    out->set_total_bytes(step.record->total_bytes);
    out->set_committed_at(step.record->committed_at);
    out->set_run_id(step.record->run_id);
    out->set_timeline(step.record->timeline);
  }
}

}  // namespace zcc::proto
