// The largest gRPC message zccd and the client exchange, in one place so that
// the two sides agree.
#ifndef ZCC_PROTO_MESSAGE_LIMITS_H_
#define ZCC_PROTO_MESSAGE_LIMITS_H_

namespace zcc::v1 {

// Sized for zccd's default max_tensors_per_rank, 1,048,576: the largest
// TensorSpec the daemon accepts (a 512-byte name, 16 dimensions of 10-byte
// varints, the replica group and the tags and lengths) encodes to about 715
// bytes, so a RegisterRequest of that many tensors stays under 768 MiB, and
// the placements of a RegisterResponse or RestoreResponse (a name and three
// scalars each, about 545 bytes) under 576 MiB. 1 GiB leaves room, and stays
// below the 2 GiB protobuf and gRPC cap on any message.
inline constexpr int kMaxMessageBytes = 1 << 30;

}  // namespace zcc::v1

#endif  // ZCC_PROTO_MESSAGE_LIMITS_H_
