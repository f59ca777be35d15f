#include "region.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace mt {
namespace {

std::string ShmName(const std::string& name) { return "/" + name; }

size_t RoundToPages(size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

}  // namespace

std::shared_ptr<Region> Region::Create(const std::string& name, size_t size, bool lock, Failure* failure) {
  const int fd = shm_open(ShmName(name).c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    *failure = {"shm_failed", "shm_open(\"" + ShmName(name) + "\") failed: " + ErrnoText(errno) +
                                  (errno == EEXIST ? "; pick another name or free the old buffer" : "")};
    return nullptr;
  }
  const size_t rounded = RoundToPages(size);
  // Reserve the pages now: a sparse file would map fine and then kill the process with SIGBUS
  // on first touch once /dev/shm is full. tmpfs gives up with EINTR when a signal arrives (a
  // child exiting, say) during a large reservation; what it reserved stays, so asking again
  // finishes the rest.
  int err = 0;
  do {
    err = posix_fallocate(fd, 0, static_cast<off_t>(rounded));
  } while (err == EINTR);
  if (err != 0) {
    close(fd);
    shm_unlink(ShmName(name).c_str());
    *failure = {"shm_failed", "reserving " + std::to_string(rounded) + " bytes for /dev/shm/" + name +
                                  " failed: " + ErrnoText(err) +
                                  (err == ENOSPC ? "; /dev/shm is full: free buffers or remove stale ones" : "")};
    return nullptr;
  }
  return Map(name, fd, rounded, true, lock, failure);
}

std::shared_ptr<Region> Region::Open(const std::string& name, bool lock, Failure* failure) {
  const int fd = shm_open(ShmName(name).c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    *failure = {"shm_failed", "shm_open(\"" + ShmName(name) + "\") failed: " + ErrnoText(errno)};
    return nullptr;
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || info.st_size <= 0) {
    close(fd);
    *failure = {"shm_failed", "/dev/shm/" + name + " is empty or unreadable; it must be created with a size first"};
    return nullptr;
  }
  return Map(name, fd, static_cast<size_t>(info.st_size), false, lock, failure);
}

std::shared_ptr<Region> Region::Map(const std::string& name, int fd, size_t size, bool owner, bool lock,
                                    Failure* failure) {
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    close(fd);
    if (owner) shm_unlink(ShmName(name).c_str());
    *failure = {"shm_failed",
                "mmap of /dev/shm/" + name + " (" + std::to_string(size) + " bytes) failed: " + ErrnoText(err)};
    return nullptr;
  }
  std::shared_ptr<Region> region(new Region(name, fd, static_cast<uint8_t*>(data), size, owner));
  if (lock) {
    if (mlock(data, size) == 0) {
      region->locked_ = true;
    } else {
      region->lockError_ = "mlock: " + ErrnoText(errno) + "; raise RLIMIT_MEMLOCK or grant CAP_IPC_LOCK";
    }
  } else {
    region->lockError_ = "not requested";
  }
  return region;
}

Region::Region(std::string name, int fd, uint8_t* data, size_t size, bool owner)
    : name_(std::move(name)), fd_(fd), data_(data), size_(size), owner_(owner) {}

Region::~Region() { Unmap(); }

void Region::Unmap() {
  std::lock_guard<std::mutex> guard(mutex_);
  if (data_ == nullptr) return;
  munmap(data_, size_);
  close(fd_);
  if (owner_) shm_unlink(ShmName(name_).c_str());
  data_ = nullptr;
}

bool Region::Pin() {
  std::lock_guard<std::mutex> guard(mutex_);
  if (retired_) return false;
  ++pins_;
  return true;
}

void Region::Unpin() {
  std::lock_guard<std::mutex> guard(mutex_);
  --pins_;
}

bool Region::Retire() {
  std::lock_guard<std::mutex> guard(mutex_);
  if (pins_ > 0) return false;
  retired_ = true;
  return true;
}

bool Region::retired() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return retired_;
}

std::unique_ptr<RegionPin> RegionPin::Acquire(std::shared_ptr<Region> region) {
  if (!region->Pin()) return nullptr;
  return std::unique_ptr<RegionPin>(new RegionPin(std::move(region)));
}

}  // namespace mt
