#include "client/tcp_collective.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/free_port.h"
#include "common/testing/status_matchers.h"

namespace zcc {
namespace {

// What a member's thread found wrong (Catch2's assertions are for the main
// thread only): one list per member, checked after the threads are joined.
using Problems = std::vector<std::string>;

#define EXPECT(problems, cond) \
  if (!(cond)) (problems).push_back(absl::StrCat(__LINE__, ": ", #cond))

// Runs body(rank, member, problems) on `size` threads, each with its own member.
void RunMembers(uint32_t size, absl::Duration timeout,
                const std::function<void(uint32_t, TcpCollective&, Problems&)>& body) {
  const std::string address = absl::StrCat("127.0.0.1:", testing::FreeTcpPort());
  std::vector<Problems> problems(size);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      TcpCollectiveOptions o;
      o.rank = r;
      o.size = size;
      o.address = address;
      o.timeout = timeout;
      auto c = TcpCollective::Create(o);
      if (!c.ok()) {
        problems[r].push_back(c.status().ToString());
        return;
      }
      body(r, **c, problems[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (uint32_t r = 0; r < size; ++r) {
    INFO("member " << r);
    CHECK(problems[r] == Problems{});
  }
}

TEST_CASE("all-gather and broadcast across four members", "[collective]") {
  RunMembers(4, absl::Seconds(30), [](uint32_t rank, TcpCollective& c, Problems& p) {
    EXPECT(p, c.rank() == rank);
    EXPECT(p, c.size() == 4);
    for (int round = 0; round < 3; ++round) {
      auto all = c.AllGather(std::string(rank * 1000 + round, static_cast<char>('a' + rank)));
      EXPECT(p, all.ok());
      if (!all.ok() || all->size() != 4) return;
      for (uint32_t r = 0; r < 4; ++r) {
        EXPECT(p, (*all)[r] == std::string(r * 1000 + round, static_cast<char>('a' + r)));
      }
    }
    for (uint32_t root = 0; root < 4; ++root) {
      std::vector<uint8_t> buf(3 << 20, 0);
      if (rank == root) {
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 7 + root);
      }
      // Member 2 keeps nothing of root 1's bytes: it passes no buffer.
      const bool keeps = !(rank == 2 && root == 1);
      EXPECT(p, c.Broadcast(keeps ? buf.data() : nullptr, buf.size(), root, nullptr).ok());
      if (keeps) {
        bool same = true;
        for (size_t i = 0; i < buf.size(); ++i) same = same && buf[i] == static_cast<uint8_t>(i * 7 + root);
        EXPECT(p, same);
      }
    }
    uint8_t none = 0;
    EXPECT(p, c.Broadcast(rank == 3 ? &none : nullptr, 0, 3, nullptr).ok());  // empty pieces too
  });
}

TEST_CASE("members calling the collectives in different orders fail, not hang",
          "[collective]") {
  RunMembers(3, absl::Seconds(5), [](uint32_t rank, TcpCollective& c, Problems& p) {
    uint8_t byte = 1;
    if (rank == 1) {
      // The root's send is buffered: it cannot tell yet; its next call fails.
      c.Broadcast(&byte, 1, 1, nullptr).IgnoreError();
    } else {
      EXPECT(p, !c.AllGather("x").ok());
    }
    // Broken for good: later calls fail (rank 0 closed its connections).
    EXPECT(p, !c.AllGather("y").ok());
  });
}

TEST_CASE("a member that goes away fails the others' calls", "[collective]") {
  RunMembers(3, absl::Seconds(20), [](uint32_t rank, TcpCollective& c, Problems& p) {
    if (rank == 2) return;  // leaves: its connection closes with the member
    absl::Status st = c.AllGather("x").status();
    EXPECT(p, absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st));
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
  o.address = absl::StrCat("127.0.0.1:", testing::FreeTcpPort());
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
