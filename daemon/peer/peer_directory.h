// The other zccds this one knows of (from its jobs' membership), each probed
// with Hello every `probe_interval` on a thread of its own: whether it
// answers, its node name and failure domain, and since when it has not.
// Probing never runs on a trainer's path or under another owner's lock; a
// peer that does not answer costs the probe thread one timeout a round.
//
// Thread-safety: every method may be called from any thread.
#ifndef ZCC_DAEMON_PEER_PEER_DIRECTORY_H_
#define ZCC_DAEMON_PEER_PEER_DIRECTORY_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "daemon/peer/peer_client.h"

namespace zcc::daemon::peer {

struct PeerState {
  std::string node;            // from its last answer
  std::string failure_domain;  // from its last answer
  bool up = false;
  bool probed = false;         // answered or failed at least once
  absl::Time last_seen;        // its last answer (InfinitePast: never)
  std::string error;           // the last probe's, when down
  // Its zccd's run (PeerHelloResponse.instance): changes when it restarts,
  // its replica memory empty. Empty until it answers.
  std::string instance;
  // It keeps a piece pushed in parts (PeerHelloResponse.takes_parts), as
  // of its last answer.
  bool takes_parts = false;
};

class PeerDirectory {
 public:
  struct Options {
    std::string self_node;
    std::string self_failure_domain;
    absl::Duration probe_interval = absl::Seconds(5);
    absl::Duration probe_timeout = absl::Seconds(2);
  };
  PeerDirectory(Options options, std::shared_ptr<grpc::ChannelCredentials> creds);
  ~PeerDirectory();
  PeerDirectory(const PeerDirectory&) = delete;
  PeerDirectory& operator=(const PeerDirectory&) = delete;

  // Starts probing `address` (host:port) now if it is new.
  void Watch(const std::string& address);
  // What is known of `address`; nullopt if it is not watched.
  std::optional<PeerState> State(const std::string& address) const;
  // A connection to `address` with this zccd's credentials (watched or
  // not); each `connection` number its own (PeerClient), for calls that
  // run side by side.
  std::shared_ptr<PeerClient> Client(const std::string& address, int connection = 0);

 private:
  void Run();
  void ProbeAll();

  const Options options_;
  const std::shared_ptr<grpc::ChannelCredentials> creds_;
  mutable zcc::Mutex mu_;
  std::map<std::string, PeerState> states_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, std::shared_ptr<PeerClient>> clients_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // a new address: probe now
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_PEER_DIRECTORY_H_
