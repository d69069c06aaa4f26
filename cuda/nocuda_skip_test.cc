// Stands in for the tests that need nvcc (the fake CUDA runtime's and the
// CUDA copier's over it) in builds with --config=nocuda.
#include <catch2/catch.hpp>

TEST_CASE("skipped: built with --config=nocuda, no CUDA code to test here") {
  WARN("skipped: built with --config=nocuda; the CUDA copier and the fake CUDA runtime "
       "are not compiled in");
  SUCCEED();
}
