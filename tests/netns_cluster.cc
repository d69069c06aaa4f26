#include "tests/netns_cluster.h"

#include <unistd.h>

#include <array>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zcc::testing {

absl::Status RunCommand(const std::string& command) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("cannot run: ", command));
  std::string out;
  std::array<char, 512> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int rc = ::pclose(p);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("`", command, "` failed (", rc, "): ", out));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NetnsCluster>> NetnsCluster::Create(int nodes) {
  if (::geteuid() != 0) {
    return absl::FailedPreconditionError("multi-node tests need root (network namespaces)");
  }
  const int pid = static_cast<int>(::getpid());
  const std::string prefix = absl::StrCat("zcc", pid % 100000);
  const std::string subnet = absl::StrCat("10.", 100 + pid % 100, ".", (pid / 100) % 250, ".");
  std::unique_ptr<NetnsCluster> c(new NetnsCluster(prefix, subnet));
  c->switch_ = prefix + "s";
  auto ip = [](const std::string& args) { return RunCommand("ip " + args); };
  if (absl::Status st = ip("netns add " + c->switch_); !st.ok()) {
    c->switch_.clear();
    return st;
  }
  for (const std::string& cmd : {absl::StrCat("-n ", c->switch_, " link set lo up"),
                                 absl::StrCat("-n ", c->switch_, " link add br0 type bridge"),
                                 absl::StrCat("-n ", c->switch_, " link set br0 up")}) {
    if (absl::Status st = ip(cmd); !st.ok()) return st;
  }
  for (int i = 0; i < nodes; ++i) {
    const std::string ns = absl::StrCat(prefix, "n", i);
    if (absl::Status st = ip("netns add " + ns); !st.ok()) return st;
    c->nodes_.push_back(ns);
    const std::string port = absl::StrCat("v", i);
    for (const std::string& cmd :
         {absl::StrCat("-n ", ns, " link set lo up"),
          absl::StrCat("-n ", c->switch_, " link add ", port, " type veth peer name eth0 netns ", ns),
          absl::StrCat("-n ", c->switch_, " link set ", port, " master br0"),
          absl::StrCat("-n ", c->switch_, " link set ", port, " up"),
          absl::StrCat("-n ", ns, " addr add ", c->ip(i), "/24 dev eth0"),
          absl::StrCat("-n ", ns, " link set eth0 up")}) {
      if (absl::Status st = ip(cmd); !st.ok()) return st;
    }
  }
  return c;
}

NetnsCluster::~NetnsCluster() {
  for (const std::string& ns : nodes_) {
    if (!ns.empty()) (void)RunCommand("ip netns del " + ns);
  }
  if (!switch_.empty()) (void)RunCommand("ip netns del " + switch_);
}

std::string NetnsCluster::ip(int i) const { return absl::StrCat(subnet_, i + 1); }

std::vector<std::string> NetnsCluster::Exec(int i) const {
  return {"/usr/sbin/ip", "netns", "exec", nodes_[i]};
}

absl::Status NetnsCluster::SetLink(int i, bool up) {
  return RunCommand(absl::StrCat("ip -n ", switch_, " link set v", i, up ? " up" : " down"));
}

absl::Status NetnsCluster::Remove(int i) {
  absl::Status st = RunCommand("ip netns del " + nodes_[i]);
  if (st.ok()) nodes_[i].clear();
  return st;
}

}  // namespace zcc::testing
