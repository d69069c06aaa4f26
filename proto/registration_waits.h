// What zccd answers a registration that must wait, in one place so that the
// two sides agree: a gRPC status carries a code and a message, and the client
// acts on this reason (it registers again at once), not only shows it.
#ifndef ZCC_PROTO_REGISTRATION_WAITS_H_
#define ZCC_PROTO_REGISTRATION_WAITS_H_

namespace zcc::v1 {

// UNAVAILABLE with a message that begins so: the rank's previous trainer died
// and zccd is still retiring its session (writing a checkpoint that was due or
// its checkpoint-on-failure, then committing it) before the rank's snapshots
// can go to the new registration. zccd answers so shortly before the
// registration's deadline; the client registers again at once and waits on.
inline constexpr char kPredecessorRetiring[] = "the rank's previous trainer is still retiring";

}  // namespace zcc::v1

#endif  // ZCC_PROTO_REGISTRATION_WAITS_H_
