// The peer benchmarks' reference: the same bytes through one plain TCP
// connection, in the same run as the peer tier's transfer it is compared
// with: over loopback within this process, or to a TcpSink in another
// network namespace (another process).
#ifndef ZCC_BENCH_PEER_TCP_STREAM_H_
#define ZCC_BENCH_PEER_TCP_STREAM_H_

#include <memory>
#include <string>
#include <thread>

namespace zcc::bench {

// Accepts connections one after another on host:port (port 0: any free one)
// and reads each to its end into a buffer of `buffer_bytes`, then answers
// one byte, so that the sender's time includes the reading. Exits the
// process when it cannot listen.
class TcpSink {
 public:
  TcpSink(const std::string& host, int port, size_t buffer_bytes);
  ~TcpSink();  // stops accepting; a connection being read is finished first
  TcpSink(const TcpSink&) = delete;
  TcpSink& operator=(const TcpSink&) = delete;
  int port() const { return port_; }

 private:
  void Serve(size_t buffer_bytes);
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// Seconds to send `pieces` copies of `bytes` to a TcpSink at host:port
// until it has read them all (the connect included); exits the process
// when the connection fails.
double TcpSendSeconds(const std::string& host, int port, const std::string& bytes, int pieces);

// The same over loopback, to a sink of this process.
double TcpSeconds(const std::string& bytes, int pieces);

}  // namespace zcc::bench

#endif  // ZCC_BENCH_PEER_TCP_STREAM_H_
