// The peer benchmarks' reference: the same bytes through one plain TCP
// connection over loopback, one thread writing and another reading, in the
// same run as the peer tier's transfer it is compared with.
#ifndef ZCC_BENCH_PEER_TCP_STREAM_H_
#define ZCC_BENCH_PEER_TCP_STREAM_H_

#include <string>

namespace zcc::bench {

// Seconds to move `pieces` copies of `bytes` through the connection (the
// connect included); exits the process when loopback TCP fails.
double TcpSeconds(const std::string& bytes, int pieces);

}  // namespace zcc::bench

#endif  // ZCC_BENCH_PEER_TCP_STREAM_H_
