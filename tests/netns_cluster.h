// Several "nodes" on one machine for multi-node tests: each node a network
// namespace with its own address, joined by veth pairs to a bridge that lives
// in a namespace of its own, so that the host's network is never touched.
// Processes join a node by running under Exec(i) (`ip netns exec`); unix
// sockets and /dev/shm stay shared with the test, so the test still talks
// to each node's zccd over its socket. Needs root and iproute2
// (tools/setup.sh); Create says so when it cannot.
#ifndef ZCC_TESTS_NETNS_CLUSTER_H_
#define ZCC_TESTS_NETNS_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zcc::testing {

class NetnsCluster {
 public:
  // `nodes` namespaces on a fresh /24 of 10.0.0.0/8 picked from the pid.
  static absl::StatusOr<std::unique_ptr<NetnsCluster>> Create(int nodes);
  // Deletes every namespace it made (their links go with them).
  ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  int size() const { return static_cast<int>(nodes_.size()); }
  const std::string& ns(int i) const { return nodes_[i]; }
  // The node's address on the bridge.
  std::string ip(int i) const;
  // The argv prefix that runs a command in node i.
  std::vector<std::string> Exec(int i) const;
  // A partition: node i's link to the bridge down (false) or up again.
  absl::Status SetLink(int i, bool up);
  // The node is gone: its namespace deleted (kill its processes first).
  absl::Status Remove(int i);

 private:
  NetnsCluster(std::string prefix, std::string subnet) : prefix_(prefix), subnet_(subnet) {}
  const std::string prefix_;  // of every namespace's name
  const std::string subnet_;  // "10.a.b."
  std::string switch_;
  std::vector<std::string> nodes_;  // empty once removed
};

// Runs a shell command line; its output in the error when it fails.
absl::Status RunCommand(const std::string& command);

}  // namespace zcc::testing

#endif  // ZCC_TESTS_NETNS_CLUSTER_H_
