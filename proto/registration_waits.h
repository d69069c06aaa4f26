// What zccd answers a registration that must wait, in one place so that the
// two sides agree: a gRPC status carries a code and a message, and the client
// acts on this reason (it registers again at once), not only shows it.
#ifndef ZCC_PROTO_REGISTRATION_WAITS_H_
#define ZCC_PROTO_REGISTRATION_WAITS_H_

namespace zcc::v1 {

// UNAVAILABLE with a message that begins so: the client registers again at
// once, with a deadline of its own. zccd answers so shortly before a
// registration's deadline while the rank's previous trainer is still retiring
// (zccd writes and commits its last checkpoint before the rank's snapshots
// can go to the new registration), or when that retirement ended too close to
// the deadline to finish the registration in time.
inline constexpr char kRegisterAgain[] = "register again at once";

}  // namespace zcc::v1

#endif  // ZCC_PROTO_REGISTRATION_WAITS_H_
