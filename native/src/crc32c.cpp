#include "crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mt {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli polynomial, bit-reflected

struct ByteTable {
  std::array<uint32_t, 256> entries{};
  ByteTable() {
    for (uint32_t byte = 0; byte < 256; ++byte) {
      uint32_t value = byte;
      for (int bit = 0; bit < 8; ++bit) value = (value >> 1) ^ (kPolynomial & (0u - (value & 1u)));
      entries[byte] = value;
    }
  }
};

const ByteTable kByteTable;

// Raw register update (no pre/post inversion), shared by both implementations.
uint32_t UpdateTable(uint32_t state, const uint8_t* data, size_t length) {
  for (size_t i = 0; i < length; ++i) state = kByteTable.entries[(state ^ data[i]) & 0xFFu] ^ (state >> 8);
  return state;
}

#if defined(__x86_64__)

// The crc32 instruction has a 3-cycle latency but issues every cycle, so three independent
// lanes over adjacent blocks run about three times faster than one dependency chain; the
// lanes are then merged by "shifting" a state over kLane zero bytes, which is linear in the
// state and therefore a 4x256 table lookup.
constexpr size_t kLane = kCrc32cBlock / 3;

__attribute__((target("sse4.2"))) uint32_t UpdateSerial(uint32_t state, const uint8_t* data, size_t length) {
  uint64_t wide = state;
  while (length >= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    wide = _mm_crc32_u64(wide, word);
    data += 8;
    length -= 8;
  }
  state = static_cast<uint32_t>(wide);
  while (length > 0) {
    state = _mm_crc32_u8(state, *data++);
    --length;
  }
  return state;
}

struct LaneShift {
  std::array<std::array<uint32_t, 256>, 4> table{};
  LaneShift() {
    static const std::array<uint8_t, kLane> zeros{};
    std::array<uint32_t, 32> basis{};
    for (int bit = 0; bit < 32; ++bit) basis[bit] = UpdateTable(1u << bit, zeros.data(), kLane);
    for (int slice = 0; slice < 4; ++slice) {
      for (uint32_t byte = 0; byte < 256; ++byte) {
        uint32_t shifted = 0;
        for (int bit = 0; bit < 8; ++bit)
          if ((byte >> bit) & 1u) shifted ^= basis[slice * 8 + bit];
        table[slice][byte] = shifted;
      }
    }
  }
  uint32_t Apply(uint32_t state) const {
    return table[0][state & 0xFFu] ^ table[1][(state >> 8) & 0xFFu] ^ table[2][(state >> 16) & 0xFFu] ^
           table[3][state >> 24];
  }
};

const LaneShift kLaneShift;

// (Streaming stores were tried for large copies; they stall badly on some cores whenever
// source and destination differ in alignment, so copies go through the cache.)
template <bool kCopy>
__attribute__((target("sse4.2"))) inline uint64_t Step(uint64_t lane, uint8_t* dst, const uint8_t* src, size_t at) {
  const __m128i block = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at));
  if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + at), block);
  lane = _mm_crc32_u64(lane, static_cast<uint64_t>(_mm_cvtsi128_si64(block)));
  return _mm_crc32_u64(lane, static_cast<uint64_t>(_mm_extract_epi64(block, 1)));
}

// Checksums whole three-lane blocks of src and, with kCopy, copies them to dst as they are
// read, so a copy costs no second pass over memory (dst is ignored without kCopy). Returns how
// many bytes it consumed.
template <bool kCopy>
__attribute__((target("sse4.2"))) size_t UpdateLanes(uint32_t* state, uint8_t* dst, const uint8_t* src, size_t length) {
  size_t done = 0;
  for (; length - done >= 3 * kLane; done += 3 * kLane) {
    uint64_t a = *state, b = 0, c = 0;
    for (size_t i = done; i < done + kLane; i += 16) {
      a = Step<kCopy>(a, dst, src, i);
      b = Step<kCopy>(b, dst, src, i + kLane);
      c = Step<kCopy>(c, dst, src, i + 2 * kLane);
    }
    *state = kLaneShift.Apply(kLaneShift.Apply(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
             static_cast<uint32_t>(c);
  }
  return done;
}

__attribute__((target("sse4.2"))) uint32_t UpdateHardware(uint32_t state, const uint8_t* data, size_t length) {
  const size_t done = UpdateLanes<false>(&state, nullptr, data, length);
  return UpdateSerial(state, data + done, length - done);
}

__attribute__((target("sse4.2"))) uint32_t CopyUpdateHardware(uint32_t state, uint8_t* dst, const uint8_t* src,
                                                              size_t length) {
  const size_t done = UpdateLanes<true>(&state, dst, src, length);
  std::memcpy(dst + done, src + done, length - done);
  return UpdateSerial(state, src + done, length - done);
}

const bool kHasSse42 = __builtin_cpu_supports("sse4.2");

#endif

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t length) {
  const auto* in = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (kHasSse42) return ~UpdateHardware(~crc, in, length);
#endif
  return ~UpdateTable(~crc, in, length);
}

uint32_t CopyWithCrc32c(uint32_t crc, void* dst, const void* src, size_t length) {
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
#if defined(__x86_64__)
  if (kHasSse42) return ~CopyUpdateHardware(~crc, out, in, length);
#endif
  std::memcpy(out, in, length);
  return ~UpdateTable(~crc, out, length);
}

const char* Crc32cImplementation() {
#if defined(__x86_64__)
  if (kHasSse42) return "sse4.2";
#endif
  return "table";
}

}  // namespace mt
