// A committed step as the Status service's ListCheckpoints answers it: one
// conversion for zccd and for zccctl's offline listing.
#ifndef ZCC_PROTO_CHECKPOINT_INFO_H_
#define ZCC_PROTO_CHECKPOINT_INFO_H_

#include <string>

#include "checkpoint/reader.h"
#include "proto/zcc.pb.h"

namespace zcc::proto {

// `path` is how the step's directory is shown (a local path, an s3:// URL).
void FillCheckpointInfo(const checkpoint::CommittedStep& step, const std::string& path,
                        v1::CheckpointInfo* out);

}  // namespace zcc::proto

#endif  // ZCC_PROTO_CHECKPOINT_INFO_H_
