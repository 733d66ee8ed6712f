#include "shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "common/errors.h"

namespace stubhost {
namespace {

// Closes a descriptor on every path out of create/open.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string human_bytes(uint64_t n) {
  char buf[64];
  if (n >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / double(1ull << 30));
  } else if (n >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(n) / double(1ull << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(n));
  }
  return buf;
}

}  // namespace

std::string shm_space_report() {
  struct statvfs st{};
  if (::statvfs("/dev/shm", &st) != 0) return "size of /dev/shm unknown";
  const uint64_t total = uint64_t(st.f_blocks) * st.f_frsize;
  const uint64_t avail = uint64_t(st.f_bavail) * st.f_frsize;
  return human_bytes(avail) + " free of " + human_bytes(total) + " in /dev/shm";
}

std::string random_shm_name(const std::string& prefix) {
  uint64_t r = 0;
  size_t got = 0;
  while (got < sizeof r) {
    ssize_t n = ::getrandom(reinterpret_cast<uint8_t*>(&r) + got, sizeof r - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SystemError("getrandom", errno);
    }
    got += static_cast<size_t>(n);
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "_%d_%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(r));
  return "/" + prefix + buf;
}

ShmSegment::ShmSegment(std::string name, uint8_t* data, uint64_t size)
    : name_(std::move(name)), data_(data), size_(size) {}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

ShmSegment::~ShmSegment() { release(); }

void ShmSegment::release() noexcept {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

ShmSegment ShmSegment::create(const std::string& name, uint64_t size) {
  if (size == 0) throw CoreError("cannot create an empty shared-memory segment");
  FdGuard fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (fd.get() < 0) throw SystemError("shm_open(" + name + ", O_CREAT|O_EXCL)", errno);
  // From here on the name exists: remove it again if anything below fails.
  struct Unlinker {
    const std::string& n;
    bool armed = true;
    ~Unlinker() {
      if (armed) ::shm_unlink(n.c_str());
    }
  } unlinker{name};

  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    const int err = errno;
    throw SystemError("ftruncate of a shared-memory segment to " + human_bytes(size), err);
  }
  // tmpfs gives pages lazily; without reserving them a full /dev/shm surfaces as SIGBUS on first
  // touch, in whichever process touches first. posix_fallocate turns that into ENOSPC here.
  const int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size));
  if (rc == ENOSPC || rc == EFBIG) {
    throw ShmSpaceError("not enough shared memory: asked for " + human_bytes(size) + ", " +
                        shm_space_report());
  }
  if (rc == EOPNOTSUPP || rc == EINVAL) {
    // No fallocate on this filesystem: at least refuse what cannot fit now.
    struct statvfs st{};
    if (::statvfs("/dev/shm", &st) == 0 && uint64_t(st.f_bavail) * st.f_frsize < size) {
      throw ShmSpaceError("not enough shared memory: asked for " + human_bytes(size) + ", " + shm_space_report());
    }
  } else if (rc != 0) {
    throw SystemError("posix_fallocate", rc);
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) throw SystemError("mmap of " + human_bytes(size), errno);
  unlinker.armed = false;
  return ShmSegment(name, static_cast<uint8_t*>(p), size);
}

ShmSegment ShmSegment::open(const std::string& name) {
  FdGuard fd(::shm_open(name.c_str(), O_RDWR, 0));
  if (fd.get() < 0) throw SystemError("shm_open(" + name + ")", errno);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) throw SystemError("fstat", errno);
  if (st.st_size <= 0) throw CoreError("shared-memory segment " + name + " is empty");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) throw SystemError("mmap of " + human_bytes(size), errno);
  return ShmSegment(name, static_cast<uint8_t*>(p), size);
}

int ShmSegment::unlink_quiet(const std::string& name) noexcept {
  return ::shm_unlink(name.c_str()) == 0 ? 0 : errno;
}

bool ShmSegment::unlink(const std::string& name) {
  if (::shm_unlink(name.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  throw SystemError("shm_unlink(" + name + ")", errno);
}

}  // namespace stubhost
