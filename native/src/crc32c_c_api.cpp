// A C entry point to the CRC32C code for processes that are not Node: the Python hook loads
// this library with ctypes to checksum checkpoints at memory speed instead of ~150 MB/s.
#include "crc32c.hpp"

extern "C" {

__attribute__((visibility("default"))) uint32_t monkeytree_crc32c(const void* data, size_t length, uint32_t crc) {
  return mt::Crc32c(crc, data, length);
}

__attribute__((visibility("default"))) uint32_t monkeytree_copy_crc32c(void* dst, const void* src, size_t length, uint32_t crc) {
  return mt::CopyWithCrc32c(crc, dst, src, length);
}

}
