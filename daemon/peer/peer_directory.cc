#include "daemon/peer/peer_directory.h"

#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/log.h"

namespace zcc::daemon::peer {

PeerDirectory::PeerDirectory(Options options, std::shared_ptr<grpc::ChannelCredentials> creds)
    : options_(std::move(options)), creds_(std::move(creds)) {
  thread_ = std::thread([this] { Run(); });
}

PeerDirectory::~PeerDirectory() {
  {
    zcc::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void PeerDirectory::Watch(const std::string& address) {
  zcc::MutexLock lock(&mu_);
  if (states_.count(address) > 0) return;
  PeerState state;
  state.last_seen = absl::InfinitePast();
  states_.emplace(address, std::move(state));
  wake_ = true;
}

std::optional<PeerState> PeerDirectory::State(const std::string& address) const {
  zcc::MutexLock lock(&mu_);
  auto it = states_.find(address);
  if (it == states_.end()) return std::nullopt;
  return it->second;
}

std::shared_ptr<PeerClient> PeerDirectory::Client(const std::string& address, int connection) {
  zcc::MutexLock lock(&mu_);
  std::shared_ptr<PeerClient>& c = clients_[{address, connection}];
  if (c == nullptr) c = std::make_shared<PeerClient>(address, creds_, connection);
  return c;
}

void PeerDirectory::ProbeAll() {
  std::vector<std::string> addresses;
  {
    zcc::MutexLock lock(&mu_);
    for (const auto& [address, _] : states_) addresses.push_back(address);
  }
  for (const std::string& address : addresses) {
    {
      zcc::MutexLock lock(&mu_);
      if (stop_) return;
    }
    // Outside the lock: a peer that does not answer holds only this thread.
    auto hello = Client(address)->Hello(options_.self_node, options_.self_failure_domain,
                                        options_.probe_timeout);
    zcc::MutexLock lock(&mu_);
    PeerState& s = states_[address];
    const bool was_up = s.up;
    s.probed = true;
    if (hello.ok()) {
      s.up = true;
      s.node = hello->node();
      s.failure_domain = hello->failure_domain();
      if (!s.instance.empty() && s.instance != hello->instance()) {
        ZCC_LOG(WARNING) << "peer " << address << " (node '" << s.node
                         << "') restarted: what it held for this node's jobs is gone";
      }
      s.instance = hello->instance();
      s.takes_parts = hello->takes_parts();
      s.last_seen = absl::Now();
      s.error.clear();
      if (!was_up) ZCC_LOG(INFO) << "peer " << address << " (node '" << s.node << "') is up";
    } else {
      s.up = false;
      s.error = std::string(hello.status().message());
      if (was_up) ZCC_LOG(WARNING) << "peer " << address << " is down: " << s.error;
    }
  }
}

void PeerDirectory::Run() {
  for (;;) {
    {
      zcc::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
      mu_.AwaitWithTimeout(absl::Condition(&woken), options_.probe_interval);
      if (stop_) return;
      wake_ = false;
    }
    ProbeAll();
  }
}

}  // namespace zcc::daemon::peer
