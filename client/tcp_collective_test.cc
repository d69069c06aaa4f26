#include "client/tcp_collective.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"

namespace zcc {
namespace {

// A port nothing listens on now (the kernel's pick for a socket just closed).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs body(rank, member) on `size` threads, each with its own member.
void RunMembers(uint32_t size, absl::Duration timeout,
                const std::function<void(uint32_t, TcpCollective&)>& body) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      TcpCollectiveOptions o;
      o.rank = r;
      o.size = size;
      o.address = address;
      o.timeout = timeout;
      auto c = TcpCollective::Create(o);
      CHECK_OK(c.status());
      if (c.ok()) body(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST_CASE("all-gather and broadcast across four members", "[collective]") {
  RunMembers(4, absl::Seconds(30), [](uint32_t rank, TcpCollective& c) {
    CHECK(c.rank() == rank);
    CHECK(c.size() == 4);
    for (int round = 0; round < 3; ++round) {
      auto all = c.AllGather(std::string(rank * 1000 + round, static_cast<char>('a' + rank)));
      REQUIRE_OK(all.status());
      REQUIRE(all->size() == 4);
      for (uint32_t r = 0; r < 4; ++r) {
        CHECK((*all)[r] == std::string(r * 1000 + round, static_cast<char>('a' + r)));
      }
    }
    for (uint32_t root = 0; root < 4; ++root) {
      std::vector<uint8_t> buf(3 << 20, 0);
      if (rank == root) {
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 7 + root);
      }
      // Member 2 keeps nothing of root 1's bytes: it passes no buffer.
      const bool keeps = !(rank == 2 && root == 1);
      REQUIRE_OK(c.Broadcast(keeps ? buf.data() : nullptr, buf.size(), root, nullptr));
      if (keeps) {
        bool same = true;
        for (size_t i = 0; i < buf.size(); ++i) same = same && buf[i] == static_cast<uint8_t>(i * 7 + root);
        CHECK(same);
      }
    }
    REQUIRE_OK(c.Broadcast(nullptr, 0, 3, nullptr));  // empty pieces take part too
  });
}

TEST_CASE("members calling the collectives in different orders fail, not hang",
          "[collective]") {
  RunMembers(3, absl::Seconds(5), [](uint32_t rank, TcpCollective& c) {
    uint8_t byte = 1;
    if (rank == 1) {
      // The root's send is buffered: it cannot tell yet; its next call fails.
      c.Broadcast(&byte, 1, 1, nullptr).IgnoreError();
    } else {
      CHECK_FALSE(c.AllGather("x").ok());
    }
    // Broken for good: later calls fail (rank 0 closed its connections).
    CHECK_FALSE(c.AllGather("y").ok());
  });
}

TEST_CASE("a member that goes away fails the others' calls", "[collective]") {
  RunMembers(3, absl::Seconds(20), [](uint32_t rank, TcpCollective& c) {
    if (rank == 2) return;  // leaves: its connection closes with the member
    absl::Status st = c.AllGather("x").status();
    CHECK_FALSE(st.ok());
    INFO(st.ToString());
    CHECK((absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)));
  });
}

TEST_CASE("bad options and addresses are errors", "[collective]") {
  TcpCollectiveOptions o;
  o.rank = 2;
  o.size = 2;
  o.address = "127.0.0.1:1";
  REQUIRE_STATUS_CODE(TcpCollective::Create(o).status(), absl::StatusCode::kInvalidArgument);
  o.rank = 1;
  o.address = "no-port";
  REQUIRE_STATUS_CODE(TcpCollective::Create(o).status(), absl::StatusCode::kInvalidArgument);
  o.address = absl::StrCat("127.0.0.1:", FreePort());
  o.timeout = absl::Milliseconds(200);  // nobody listens there
  REQUIRE_STATUS_CODE(TcpCollective::Create(o).status(), absl::StatusCode::kDeadlineExceeded);
  o.size = 1;
  o.rank = 0;
  auto alone = TcpCollective::Create(o);
  REQUIRE_OK(alone.status());
  auto all = (*alone)->AllGather("only");
  REQUIRE_OK(all.status());
  CHECK(*all == std::vector<std::string>{"only"});
}

}  // namespace
}  // namespace zcc
