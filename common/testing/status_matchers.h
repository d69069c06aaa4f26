// Catch2 helpers for absl::Status: REQUIRE_OK / CHECK_OK print the status
// message on failure; REQUIRE_STATUS_CODE checks the code of a failed call.
#ifndef ZCC_COMMON_TESTING_STATUS_MATCHERS_H_
#define ZCC_COMMON_TESTING_STATUS_MATCHERS_H_

#include <catch2/catch.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zcc::testing {

inline absl::Status ToStatus(const absl::Status& s) { return s; }
template <typename T>
absl::Status ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace zcc::testing

#define REQUIRE_OK(expr)                                              \
  do {                                                                \
    const ::absl::Status zcc_st_ = ::zcc::testing::ToStatus(expr);    \
    INFO("status: " << zcc_st_.ToString());                           \
    REQUIRE(zcc_st_.ok());                                            \
  } while (0)

#define CHECK_OK(expr)                                                \
  do {                                                                \
    const ::absl::Status zcc_st_ = ::zcc::testing::ToStatus(expr);    \
    INFO("status: " << zcc_st_.ToString());                           \
    CHECK(zcc_st_.ok());                                              \
  } while (0)

#define REQUIRE_STATUS_CODE(expr, expected_code)                      \
  do {                                                                \
    const ::absl::Status zcc_st_ = ::zcc::testing::ToStatus(expr);    \
    INFO("status: " << zcc_st_.ToString());                           \
    REQUIRE(zcc_st_.code() == (expected_code));                       \
  } while (0)

#endif  // ZCC_COMMON_TESTING_STATUS_MATCHERS_H_
