#pragma once
// CRC32C (Castagnoli), the checksum of every transfer chunk and checkpoint item.
#include <cstddef>
#include <cstdint>

namespace mt {

// Standard CRC32C of `data` continuing from a previous result (`crc` = 0 to start):
// crc32c("123456789") == 0xE3069283, and Crc32c(Crc32c(0, a), b) == Crc32c(0, a ++ b).
uint32_t Crc32c(uint32_t crc, const void* data, size_t length);

// Crc32c runs at full speed over whole multiples of this many bytes; a shorter remainder takes
// a serial path about three times slower, so code that checksums a buffer piece by piece sizes
// its pieces in whole blocks.
constexpr size_t kCrc32cBlock = 3 * 8192;

// Copies src to dst (non-overlapping) and returns Crc32c(crc, src), reading each block once
// from memory while it is still in cache.
uint32_t CopyWithCrc32c(uint32_t crc, void* dst, const void* src, size_t length);

// "sse4.2" or "table": which implementation this CPU uses.
const char* Crc32cImplementation();

}  // namespace mt
