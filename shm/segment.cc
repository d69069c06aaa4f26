#include "shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "shm/truncation_guard.h"

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

// Reserves [0, min(bytes, reserve_bytes)) of the object behind `fd`: on a
// full /dev/shm this fails with a clear error instead of a SIGBUS at the
// first touch. What is left for later must at least fit now.
absl::Status ReserveFront(int fd, const std::string& name, uint64_t bytes, uint64_t reserve_bytes) {
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
  return absl::OkStatus();
}

std::string ShmPath(const std::string& name) { return absl::StrCat("/dev/shm/", name); }

}  // namespace

// The object through Boost (its naming and permissions), the mapping by hand:
// mapped_region cannot change size in place, which Resize needs to keep the
// page tables the pool populated.
struct Segment::Impl {
  std::string name;
  bool owner = false;
  bip::shared_memory_object object;
  void* addr = nullptr;
  uint64_t size = 0;
  int guard = -1;  // shm/truncation_guard.h (-1: not guarded)

  int fd() const { return object.get_mapping_handle().handle; }

  absl::Status Map(uint64_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd(), 0);
    if (p == MAP_FAILED) return zcc::ErrnoToStatus(errno, absl::StrCat("map shared memory ", name));
    addr = p;
    size = bytes;
    guard = internal::GuardMapping(addr, size);
    return absl::OkStatus();
  }

  ~Impl() {
    internal::UnguardMapping(guard);
    if (addr != nullptr) ::munmap(addr, size);
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
uint8_t* Segment::base() const { return static_cast<uint8_t*>(impl_->addr); }
uint64_t Segment::size() const { return impl_->size; }
bool Segment::cut() const {
  if (internal::GuardedMappingCut(impl_->guard)) return true;
  // Cut, though nothing here has touched the missing pages yet (a retained
  // segment no one reads until a restore).
  struct stat st;
  return ::fstat(impl_->fd(), &st) == 0 && static_cast<uint64_t>(st.st_size) < impl_->size;
}

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
    ZCC_RETURN_IF_ERROR(ReserveFront(fd, name, bytes, reserve_bytes));
    ZCC_RETURN_IF_ERROR(impl->Map(bytes));
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
    ZCC_RETURN_IF_ERROR(impl->Map(expected_bytes));
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
  if (const int err = ::posix_fallocate(impl_->fd(), static_cast<off_t>(offset), static_cast<off_t>(bytes));
      err != 0) {
    return zcc::ErrnoToStatus(err, absl::StrCat("reserve ", bytes, " bytes of shared memory for ",
                                                impl_->name));
  }
  return absl::OkStatus();
}

absl::Status Segment::Populate(uint64_t offset, uint64_t bytes) const {
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, Linux 5.14
  if (offset > size() || bytes > size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("populate [", offset, ", +", bytes, ") of a ",
                                                   size(), "-byte segment"));
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = offset / page * page;
  const uint64_t last = offset + bytes;
  if (last <= first) return absl::OkStatus();
  // In pieces: the process's memory map is held while a piece is faulted in,
  // and its other threads' mappings (a thread's stack, a new segment) wait
  // for it, and so, behind them, do their direct reads.
  constexpr uint64_t kPiece = uint64_t{32} << 20;
  for (uint64_t at = first; at < last; at += kPiece) {
    if (::madvise(base() + at, std::min(kPiece, last - at), kPopulateWrite) != 0) {
      if (errno == EINVAL) return absl::UnimplementedError("MADV_POPULATE_WRITE needs Linux 5.14");
      return zcc::ErrnoToStatus(errno, absl::StrCat("populate shared memory ", impl_->name));
    }
  }
  return absl::OkStatus();
}

absl::Status Segment::Rename(const std::string& new_name, uid_t owner_uid) {
  if (!impl_->owner) return absl::FailedPreconditionError("only the creator renames a segment");
  if (::renameat2(AT_FDCWD, ShmPath(impl_->name).c_str(), AT_FDCWD, ShmPath(new_name).c_str(),
                  RENAME_NOREPLACE) != 0) {
    return zcc::ErrnoToStatus(errno, absl::StrCat("rename shared memory ", impl_->name, " to ",
                                                  new_name));
  }
  impl_->name = new_name;
  if (owner_uid != static_cast<uid_t>(-1) &&
      ::fchown(impl_->fd(), owner_uid, static_cast<gid_t>(-1)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("chown shm ", new_name, " to uid ", owner_uid));
  }
  return absl::OkStatus();
}

absl::Status Segment::Resize(uint64_t bytes, uint64_t reserve_bytes) {
  if (!impl_->owner) return absl::FailedPreconditionError("only the creator resizes a segment");
  if (bytes < ControlBlockBytes()) {
    return absl::InvalidArgumentError(absl::StrCat("segment of ", bytes, " bytes is too small"));
  }
  if (bytes != impl_->size) {
    // Shrinking: unmap the tail before the object loses it.
    if (bytes < impl_->size) {
      // (The guard first: the tail may be mapped by others once unmapped.)
      internal::ShrinkGuardedMapping(impl_->guard, bytes);
      void* p = ::mremap(impl_->addr, impl_->size, bytes, 0);
      if (p == MAP_FAILED) {
        internal::UnguardMapping(impl_->guard);
        impl_->guard = internal::GuardMapping(impl_->addr, impl_->size);
        return zcc::ErrnoToStatus(errno, absl::StrCat("remap ", impl_->name));
      }
      impl_->size = bytes;
    }
    if (::ftruncate(impl_->fd(), static_cast<off_t>(bytes)) != 0) {
      return zcc::ErrnoToStatus(errno, absl::StrCat("resize shared memory ", impl_->name));
    }
    if (bytes > impl_->size) {
      // Unguarded while it may move (a segment being resized is not yet a
      // trainer's: the pool resizes before it hands the name out).
      internal::UnguardMapping(impl_->guard);
      void* p = ::mremap(impl_->addr, impl_->size, bytes, MREMAP_MAYMOVE);
      if (p != MAP_FAILED) {
        impl_->addr = p;
        impl_->size = bytes;
      }
      impl_->guard = internal::GuardMapping(impl_->addr, impl_->size);
      if (p == MAP_FAILED) return zcc::ErrnoToStatus(errno, absl::StrCat("remap ", impl_->name));
    }
  }
  return ReserveFront(impl_->fd(), impl_->name, bytes, reserve_bytes);
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
