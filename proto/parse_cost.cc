#include "proto/parse_cost.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/message.h>
#include <google/protobuf/wire_format_lite.h>

#include <climits>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace zcc::proto {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

// Generous figures for what the generated classes allocate (protobuf 3.21 on
// a 64-bit libstdc++), checked against SpaceUsedLong() of parsed messages in
// parse_cost_test. A repeated field's array grows by doubling, copied into
// the new one before the old one is freed: at its peak it holds up to three
// times its elements.
constexpr uint64_t kAllocation = 16;     // malloc's header and rounding, per allocation
constexpr uint64_t kRepeatedArray = 64;  // a repeated field's first array: header, 4 elements
constexpr uint64_t kArraySlot = 3 * 8;   // a pointer of a repeated field, at the array's peak
// A std::string on the heap, its allocation and its buffer's.
constexpr uint64_t kString = 32 + 2 * kAllocation;
constexpr uint64_t kUnknownField = 3 * 16 + kAllocation;  // an unknown-field set's entry, at peak

// Bytes one element of a repeated scalar field takes at its array's peak.
uint64_t ElementBytes(const FieldDescriptor& f) {
  switch (f.cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      return 3;
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_ENUM:
      return 3 * 4;
    default:
      return 3 * 8;
  }
}

// The wire type a field's values arrive in: their own, or length-delimited
// for a packed repeated scalar. Anything else is parsed as an unknown field.
bool Matches(const FieldDescriptor& f, int wire_type) {
  const int own = WireFormatLite::WireTypeForFieldType(
      static_cast<WireFormatLite::FieldType>(f.type()));
  return wire_type == own ||
         (f.is_packable() && wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}

class Walk {
 public:
  Walk(CodedInputStream* in, const ParseCostLimits& limits) : in_(in), limits_(limits) {}

  uint64_t cost() const { return cost_; }

  absl::Status Add(uint64_t bytes) {
    cost_ += bytes;
    if (cost_ > limits_.max_cost) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "parsing it would take more than ", limits_.max_cost, " bytes of memory"));
    }
    return absl::OkStatus();
  }

  // A message object of `type`, as the parse allocates it (its prototype's
  // size, asked once per type: reflection is slower than the walk).
  uint64_t ObjectBytes(const Descriptor& type) {
    for (const auto& [known, bytes] : object_bytes_) {
      if (known == &type) return bytes;
    }
    const google::protobuf::Message* prototype =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(&type);
    const uint64_t bytes =
        (prototype != nullptr ? prototype->SpaceUsedLong()
                              : 64 + 16 * static_cast<uint64_t>(type.field_count())) +
        kAllocation;
    object_bytes_.emplace_back(&type, bytes);
    return bytes;
  }

  // The fields of one message, up to the limit pushed for it.
  absl::Status Message(const Descriptor& type, int depth) {
    if (depth > limits_.max_depth) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages nest deeper than ", limits_.max_depth, " levels"));
    }
    absl::InlinedVector<int, 8> repeated_seen;
    while (true) {
      const uint32_t tag = in_->ReadTag();
      if (tag == 0) {
        if (in_->BytesUntilLimit() == 0) return absl::OkStatus();
        return Invalid(absl::StrCat("a bad tag or a truncated field in ", type.full_name()));
      }
      const int number = WireFormatLite::GetTagFieldNumber(tag);
      const int wire_type = WireFormatLite::GetTagWireType(tag);
      if (number == 0) return Invalid("a field numbered 0");
      if (wire_type == WireFormatLite::WIRETYPE_START_GROUP ||
          wire_type == WireFormatLite::WIRETYPE_END_GROUP) {
        return Invalid("a group (the protocol has none)");
      }
      if (wire_type > WireFormatLite::WIRETYPE_FIXED32) {
        return Invalid(absl::StrCat("wire type ", wire_type));
      }
      const FieldDescriptor* f = type.FindFieldByNumber(number);
      if (f == nullptr || !Matches(*f, wire_type)) {
        ZCC_RETURN_IF_ERROR(Unknown(wire_type));
        continue;
      }
      if (f->is_repeated()) {
        bool seen = false;
        for (int n : repeated_seen) seen = seen || n == number;
        if (!seen) {
          repeated_seen.push_back(number);
          ZCC_RETURN_IF_ERROR(Add(kRepeatedArray));
        }
      }
      ZCC_RETURN_IF_ERROR(Known(*f, wire_type, depth));
    }
  }

 private:
  static absl::Status Invalid(absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("not a valid encoding: ", what));
  }

  // Reads a length and checks that the message's bytes hold it.
  absl::StatusOr<int> Length() {
    int length = 0;
    if (!in_->ReadVarintSizeAsInt(&length) || length < 0) return Invalid("a bad length");
    const int left = in_->BytesUntilLimit();
    if (left >= 0 && length > left) return Invalid("a length past the end of its message");
    return length;
  }

  absl::Status Scalar(int wire_type) {
    uint64_t v64 = 0;
    uint32_t v32 = 0;
    const bool ok = wire_type == WireFormatLite::WIRETYPE_VARINT    ? in_->ReadVarint64(&v64)
                    : wire_type == WireFormatLite::WIRETYPE_FIXED64 ? in_->ReadLittleEndian64(&v64)
                                                                    : in_->ReadLittleEndian32(&v32);
    return ok ? absl::OkStatus() : Invalid("a truncated value");
  }

  absl::Status Known(const FieldDescriptor& f, int wire_type, int depth) {
    const uint64_t slot = f.is_repeated() ? kArraySlot : 0;
    if (wire_type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      ZCC_RETURN_IF_ERROR(Scalar(wire_type));
      return f.is_repeated() ? Add(ElementBytes(f)) : absl::OkStatus();
    }
    ZCC_ASSIGN_OR_RETURN(const int length, Length());
    switch (f.type()) {
      case FieldDescriptor::TYPE_MESSAGE: {
        ZCC_RETURN_IF_ERROR(Add(ObjectBytes(*f.message_type()) + slot));
        const CodedInputStream::Limit limit = in_->PushLimit(length);
        ZCC_RETURN_IF_ERROR(Message(*f.message_type(), depth + 1));
        in_->PopLimit(limit);
        return absl::OkStatus();
      }
      case FieldDescriptor::TYPE_STRING:
      case FieldDescriptor::TYPE_BYTES:
        ZCC_RETURN_IF_ERROR(Add(static_cast<uint64_t>(length) + kString + slot));
        return in_->Skip(length) ? absl::OkStatus() : Invalid("a truncated string");
      default:
        return Packed(f, length);
    }
  }

  // A packed array of `length` bytes: each element counted as it is read.
  absl::Status Packed(const FieldDescriptor& f, int length) {
    const int wire_type = WireFormatLite::WireTypeForFieldType(
        static_cast<WireFormatLite::FieldType>(f.type()));
    if (wire_type != WireFormatLite::WIRETYPE_VARINT) {
      const int size = wire_type == WireFormatLite::WIRETYPE_FIXED64 ? 8 : 4;
      if (length % size != 0) return Invalid("a packed array that ends inside an element");
      ZCC_RETURN_IF_ERROR(Add(static_cast<uint64_t>(length / size) * ElementBytes(f)));
      return in_->Skip(length) ? absl::OkStatus() : Invalid("a truncated packed array");
    }
    const CodedInputStream::Limit limit = in_->PushLimit(length);
    while (in_->BytesUntilLimit() > 0) {
      uint64_t value = 0;
      if (!in_->ReadVarint64(&value)) return Invalid("a packed array that ends inside an element");
      ZCC_RETURN_IF_ERROR(Add(ElementBytes(f)));
    }
    in_->PopLimit(limit);
    return absl::OkStatus();
  }

  // A field the type does not have (or not in this wire type): kept in the
  // message's unknown-field set.
  absl::Status Unknown(int wire_type) {
    ZCC_RETURN_IF_ERROR(Add(kUnknownField));
    if (wire_type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) return Scalar(wire_type);
    ZCC_ASSIGN_OR_RETURN(const int length, Length());
    ZCC_RETURN_IF_ERROR(Add(static_cast<uint64_t>(length) + kString));
    return in_->Skip(length) ? absl::OkStatus() : Invalid("a truncated unknown field");
  }

  CodedInputStream* const in_;
  const ParseCostLimits limits_;
  uint64_t cost_ = 0;
  // The types met so far and their objects' bytes (a request has a few).
  absl::InlinedVector<std::pair<const Descriptor*, uint64_t>, 4> object_bytes_;
};

}  // namespace

absl::StatusOr<uint64_t> ParseCost(const Descriptor& type,
                                   google::protobuf::io::ZeroCopyInputStream* in, uint64_t size,
                                   const ParseCostLimits& limits) {
  if (size >= static_cast<uint64_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("a message of ", size, " bytes"));
  }
  CodedInputStream coded(in);
  coded.SetTotalBytesLimit(INT_MAX);
  coded.PushLimit(static_cast<int>(size));
  Walk walk(&coded, limits);
  ZCC_RETURN_IF_ERROR(walk.Add(walk.ObjectBytes(type)));
  ZCC_RETURN_IF_ERROR(walk.Message(type, 0));
  return walk.cost();
}

absl::StatusOr<uint64_t> ParseCost(const Descriptor& type, absl::string_view encoded,
                                   const ParseCostLimits& limits) {
  if (encoded.size() >= static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("a message of ", encoded.size(), " bytes"));
  }
  google::protobuf::io::ArrayInputStream in(encoded.data(), static_cast<int>(encoded.size()));
  return ParseCost(type, &in, encoded.size(), limits);
}

}  // namespace zcc::proto
