// What parsing an encoded protobuf message would allocate, found from the
// encoding and the message type's descriptor before any of it is parsed.
//
// A parse can allocate many times the size of what it parses: an empty
// sub-message is two bytes on the wire and a whole message object in memory,
// a packed varint one byte and eight, an unknown field two bytes and an entry
// of the unknown-field set. zccd's control socket is open to every user of
// the node and takes messages as large as a registration of the most tensors
// the configuration allows, so each request's cost is bounded before it is
// parsed (daemon/control/raw_call.h). No library answers this question:
// protobuf's own parser has a size limit on the input, not on what it builds.
#ifndef ZCC_PROTO_PARSE_COST_H_
#define ZCC_PROTO_PARSE_COST_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/zero_copy_stream.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc::proto {

struct ParseCostLimits {
  uint64_t max_cost = 0;  // bytes the parse may allocate
  int max_depth = 32;     // sub-messages nested deeper are refused
};

// An upper bound on the bytes that parsing `size` encoded bytes from `in` as
// a `type` allocates with the generated C++ classes (objects, strings,
// repeated fields' arrays at the peak of their growth, unknown fields),
// without parsing. Reads `in` to the end of the message.
//
// InvalidArgument: an encoding the parse would refuse (truncated, a bad tag
// or length, a packed array that ends inside an element), a group (the
// protocol has none), or nesting deeper than `max_depth`.
// ResourceExhausted: a cost above `max_cost`; the walk stops as soon as it
// knows, so a hostile encoding is refused after reading only as much of it as
// it takes to exceed the limit.
absl::StatusOr<uint64_t> ParseCost(const google::protobuf::Descriptor& type,
                                   google::protobuf::io::ZeroCopyInputStream* in, uint64_t size,
                                   const ParseCostLimits& limits);
absl::StatusOr<uint64_t> ParseCost(const google::protobuf::Descriptor& type,
                                   absl::string_view encoded, const ParseCostLimits& limits);

}  // namespace zcc::proto

#endif  // ZCC_PROTO_PARSE_COST_H_
