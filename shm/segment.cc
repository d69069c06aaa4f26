#include "shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace zcc::shm {

namespace bip = boost::interprocess;

namespace {

// The one place Boost.Interprocess errors become a Status.
absl::Status FromInterprocessError(const bip::interprocess_exception& e,
                                   absl::string_view context) {
  const int native = e.get_native_error();
  if (native != 0) return zcc::ErrnoToStatus(native, context);
  switch (e.get_error_code()) {
    case bip::already_exists_error:
      return absl::AlreadyExistsError(absl::StrCat(context, ": ", e.what()));
    case bip::not_found_error:
      return absl::NotFoundError(absl::StrCat(context, ": ", e.what()));
    case bip::security_error:
      return absl::PermissionDeniedError(absl::StrCat(context, ": ", e.what()));
    case bip::out_of_memory_error:
    case bip::out_of_space_error:
      return absl::ResourceExhaustedError(absl::StrCat(context, ": ", e.what()));
    default:
      return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  }
}

}  // namespace

struct Segment::Impl {
  std::string name;
  bool owner = false;
  bip::shared_memory_object object;
  bip::mapped_region region;

  ~Impl() {
    // Dropping the name while still mapped is fine: the memory lives until the
    // last mapping goes; other processes can no longer open it.
    if (owner) bip::shared_memory_object::remove(name.c_str());
  }
};

Segment::Segment(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Segment::Segment(Segment&&) noexcept = default;
Segment& Segment::operator=(Segment&&) noexcept = default;
Segment::~Segment() = default;

const std::string& Segment::name() const { return impl_->name; }
uint8_t* Segment::base() const { return static_cast<uint8_t*>(impl_->region.get_address()); }
uint64_t Segment::size() const { return impl_->region.get_size(); }

absl::StatusOr<Segment> Segment::Create(const std::string& name, uint64_t bytes,
                                        uid_t owner_uid, uint64_t reserve_bytes) {
  if (bytes < ControlBlockBytes()) {
    return absl::InvalidArgumentError(absl::StrCat("segment of ", bytes, " bytes is too small"));
  }
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  try {
    bip::permissions perm(0600);
    impl->object = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write, perm);
    impl->owner = true;
    const int fd = impl->object.get_mapping_handle().handle;
    // Boost applies the process umask to the mode; make it exactly 0600.
    if (::fchmod(fd, 0600) != 0) return ErrnoToStatus(errno, absl::StrCat("chmod shm ", name));
    if (owner_uid != static_cast<uid_t>(-1) && ::fchown(fd, owner_uid, static_cast<gid_t>(-1)) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("chown shm ", name, " to uid ", owner_uid));
    }
    impl->object.truncate(static_cast<bip::offset_t>(bytes));
    // Reserve the memory now: on a full /dev/shm registration fails here with
    // a clear error instead of the trainer taking SIGBUS on its first copy.
    // What is left for later must at least fit now.
    const uint64_t now = std::min(bytes, reserve_bytes);
    if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(now)); err != 0) {
      return zcc::ErrnoToStatus(err, absl::StrCat("reserve ", now, " bytes of shared memory for ", name));
    }
    if (now < bytes) {
      struct statvfs fs;
      if (::fstatvfs(fd, &fs) == 0 && uint64_t{fs.f_bavail} * fs.f_frsize < bytes - now) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "shared memory for ", name, " needs ", bytes - now, " more bytes; /dev/shm has ",
            uint64_t{fs.f_bavail} * fs.f_frsize, " free"));
      }
    }
    impl->region = bip::mapped_region(impl->object, bip::read_write, 0, bytes);
  } catch (const bip::interprocess_exception& e) {
    return FromInterprocessError(e, absl::StrCat("create shared memory ", name));
  }
  return Segment(std::move(impl));
}

absl::StatusOr<Segment> Segment::Open(const std::string& name, uint64_t expected_bytes) {
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  try {
    impl->object = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
    bip::offset_t size = 0;
    if (!impl->object.get_size(size) || static_cast<uint64_t>(size) != expected_bytes) {
      return absl::DataLossError(absl::StrCat("shared memory ", name, " is ", size,
                                              " bytes; the daemon announced ", expected_bytes));
    }
    impl->region = bip::mapped_region(impl->object, bip::read_write, 0, expected_bytes);
  } catch (const bip::interprocess_exception& e) {
    return FromInterprocessError(e, absl::StrCat("open shared memory ", name));
  }
  return Segment(std::move(impl));
}

absl::Status Segment::Reserve(uint64_t offset, uint64_t bytes) const {
  if (offset > size() || bytes > size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("reserve [", offset, ", +", bytes, ") of a ",
                                                   size(), "-byte segment"));
  }
  const int fd = impl_->object.get_mapping_handle().handle;
  if (const int err = ::posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes));
      err != 0) {
    return zcc::ErrnoToStatus(err, absl::StrCat("reserve ", bytes, " bytes of shared memory for ",
                                                impl_->name));
  }
  return absl::OkStatus();
}

absl::Status Segment::Remove(const std::string& name) {
  // shm_unlink rather than Boost's remove, which reports only true or false.
  if (::shm_unlink(name.c_str()) != 0) {
    return zcc::ErrnoToStatus(errno, absl::StrCat("remove shared memory ", name));
  }
  return absl::OkStatus();
}

std::vector<std::string> Segment::ListWithPrefix(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (struct dirent* e = ::readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) names.emplace_back(e->d_name);
  }
  ::closedir(dir);
  return names;
}

}  // namespace zcc::shm
