#pragma once
// Page-aligned host memory backed by a named POSIX shared-memory file (/dev/shm/<name>), so
// another process on the host (the Python hook) can mmap the same bytes without a copy.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "errors.hpp"

namespace mt {

class Region {
 public:
  // Creates /dev/shm/<name> (which must not exist) of `size` bytes rounded up to whole pages.
  static std::shared_ptr<Region> Create(const std::string& name, size_t size, bool lock, Failure* failure);
  // Maps an existing /dev/shm/<name>; the file is left in place when this region is released.
  static std::shared_ptr<Region> Open(const std::string& name, bool lock, Failure* failure);

  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool locked() const { return locked_; }
  const std::string& lockError() const { return lockError_; }

  // A pin keeps the region from being retired while a grant or transfer uses it.
  bool Pin();
  void Unpin();
  // Marks the region unusable; refuses (returns false) while pinned. After a successful
  // Retire, once nothing in JS can reach the bytes any more, Unmap releases them.
  bool Retire();
  bool retired() const;
  void Unmap();

 private:
  Region(std::string name, int fd, uint8_t* data, size_t size, bool owner);
  static std::shared_ptr<Region> Map(const std::string& name, int fd, size_t size, bool owner, bool lock,
                                     Failure* failure);

  std::string name_;
  int fd_;
  uint8_t* data_;
  size_t size_;
  bool owner_;
  bool locked_ = false;
  std::string lockError_;
  mutable std::mutex mutex_;
  int pins_ = 0;
  bool retired_ = false;
};

// Keeps a region pinned (and mapped) for as long as it lives.
class RegionPin {
 public:
  // nullptr when the region was already retired.
  static std::unique_ptr<RegionPin> Acquire(std::shared_ptr<Region> region);
  RegionPin(const RegionPin&) = delete;
  RegionPin& operator=(const RegionPin&) = delete;
  ~RegionPin() { region_->Unpin(); }
  Region& region() const { return *region_; }

 private:
  explicit RegionPin(std::shared_ptr<Region> region) : region_(std::move(region)) {}
  std::shared_ptr<Region> region_;
};

}  // namespace mt
