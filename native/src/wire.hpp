#pragma once
// The TCP transfer protocol, little-endian on the wire. Per stream:
//   sender   -> Hello
//   receiver -> Reply (empty code = accepted)
//   sender   -> { ChunkHeader, payload[length], u32 crc32c(payload) }*  then ChunkHeader{kind = End}
//   receiver -> Reply (empty code = every chunk of this stream verified)
// RDMA (Hello.transport = Rdma, one stream; the bytes bypass this connection):
//   sender   -> Hello, RdmaPeer (its queue pair over the source range)
//   receiver -> Reply, then on success RdmaPeer (its queue pair over the granted range)
//   sender   -> per chunk, in order, one RDMA WRITE WITH IMMEDIATE whose immediate is the
//               chunk's CRC32C; the receiver verifies each chunk once its write has landed
//   receiver -> Reply (empty code = every chunk verified)
// The connection stays open throughout, so either side notices the other's death at once.
// The receiver may send an error Reply at any time and stop reading; senders peek for it
// between chunks. The checksum trails its payload so both sides can compute it piece by piece
// while the bytes are in cache; the receiver fails the chunk before counting it as arrived.
// Until its token has been checked a peer is a stranger: the receiver reads only the fixed-size
// Hello (and for RDMA the RdmaPeer), all of it within the hello timeout counted from accepting
// the connection, and closes the connection right after refusing it (the refusal Reply is all
// the sender reads; it has sent nothing more, so closing does not reset the connection).
#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "errors.hpp"
#include "net.hpp"

namespace mt::wire {

constexpr uint32_t kMagic = 0x3158544Du;  // "MTX1"
constexpr uint16_t kVersion = 1;
constexpr size_t kTokenBytes = 16;
constexpr uint32_t kMaxStreams = 64;
constexpr uint32_t kMinChunk = 4096;
constexpr uint32_t kMaxChunk = 1u << 30;
constexpr uint32_t kMaxReplyText = 4096;

using Token = std::array<uint8_t, kTokenBytes>;

enum class FrameKind : uint32_t { Chunk = 1, End = 2 };
enum class Transport : uint16_t { Tcp = 0, Rdma = 1 };

struct Hello {
  uint16_t streamIndex = 0;
  uint16_t streamCount = 0;
  Transport transport = Transport::Tcp;
  uint32_t chunkSize = 0;
  uint64_t length = 0;
  Token token{};
  static constexpr size_t kBytes = 48;
};

struct ChunkHeader {
  FrameKind kind = FrameKind::Chunk;
  uint32_t length = 0;
  uint64_t offset = 0;
  static constexpr size_t kBytes = 16;
};

inline void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline bool SendHello(int fd, const Hello& hello, Failure* failure) {
  std::array<uint8_t, Hello::kBytes> bytes{};
  PutU32(&bytes[0], kMagic);
  PutU16(&bytes[4], kVersion);
  PutU16(&bytes[6], hello.streamIndex);
  PutU16(&bytes[8], hello.streamCount);
  PutU16(&bytes[10], static_cast<uint16_t>(hello.transport));
  PutU32(&bytes[12], hello.chunkSize);
  PutU64(&bytes[16], hello.length);
  std::memcpy(&bytes[24], hello.token.data(), kTokenBytes);
  return SendAll(fd, bytes.data(), bytes.size(), false, "hello", failure);
}

// Decodes the Hello in `bytes` (Hello::kBytes of them).
inline bool ParseHello(const uint8_t* bytes, Hello* hello, Failure* failure) {
  if (GetU32(&bytes[0]) != kMagic || GetU16(&bytes[4]) != kVersion) {
    *failure = {"protocol", "peer is not a MonkeyTree transfer sender of protocol version " + std::to_string(kVersion)};
    return false;
  }
  hello->streamIndex = GetU16(&bytes[6]);
  hello->streamCount = GetU16(&bytes[8]);
  const uint16_t transport = GetU16(&bytes[10]);
  if (transport > static_cast<uint16_t>(Transport::Rdma)) {
    *failure = {"protocol", "the sender asked for unknown transport " + std::to_string(transport)};
    return false;
  }
  hello->transport = static_cast<Transport>(transport);
  hello->chunkSize = GetU32(&bytes[12]);
  hello->length = GetU64(&bytes[16]);
  std::memcpy(hello->token.data(), &bytes[24], kTokenBytes);
  return true;
}

inline bool SendChunkHeader(int fd, const ChunkHeader& header, Failure* failure) {
  std::array<uint8_t, ChunkHeader::kBytes> bytes{};
  PutU32(&bytes[0], static_cast<uint32_t>(header.kind));
  PutU32(&bytes[4], header.length);
  PutU64(&bytes[8], header.offset);
  return SendAll(fd, bytes.data(), bytes.size(), header.kind == FrameKind::Chunk, "chunk header", failure);
}

inline bool RecvChunkHeader(int fd, ChunkHeader* header, Failure* failure) {
  std::array<uint8_t, ChunkHeader::kBytes> bytes{};
  if (!RecvAll(fd, bytes.data(), bytes.size(), "chunk header", failure)) return false;
  header->kind = static_cast<FrameKind>(GetU32(&bytes[0]));
  header->length = GetU32(&bytes[4]);
  header->offset = GetU64(&bytes[8]);
  return true;
}

// A reply carries a Failure; an empty code means success.
inline bool SendReply(int fd, const Failure& reply, Failure* failure) {
  const std::string code = reply.code.substr(0, kMaxReplyText);
  const std::string message = reply.message.substr(0, kMaxReplyText);
  std::string bytes(8, '\0');
  PutU32(reinterpret_cast<uint8_t*>(&bytes[0]), static_cast<uint32_t>(code.size()));
  PutU32(reinterpret_cast<uint8_t*>(&bytes[4]), static_cast<uint32_t>(message.size()));
  bytes += code;
  bytes += message;
  return SendAll(fd, bytes.data(), bytes.size(), false, "reply", failure);
}

inline bool RecvReply(int fd, Failure* reply, Failure* failure) {
  std::array<uint8_t, 8> sizes{};
  if (!RecvAll(fd, sizes.data(), sizes.size(), "reply", failure)) return false;
  const uint32_t codeLength = GetU32(&sizes[0]);
  const uint32_t messageLength = GetU32(&sizes[4]);
  if (codeLength > kMaxReplyText || messageLength > kMaxReplyText) {
    *failure = {"protocol", "malformed reply from the receiver"};
    return false;
  }
  std::string text(codeLength + messageLength, '\0');
  if (!RecvAll(fd, text.data(), text.size(), "reply", failure)) return false;
  reply->code = text.substr(0, codeLength);
  reply->message = text.substr(codeLength);
  return true;
}

// One side's RC queue pair and registered range: what the other side needs to reach it.
struct RdmaPeer {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  uint8_t mtu = 0;  // ibv_mtu
  std::array<uint8_t, 16> gid{};
  uint64_t address = 0;
  uint32_t rkey = 0;
  uint64_t length = 0;
  static constexpr size_t kBytes = 48;
};

inline bool SendRdmaPeer(int fd, const RdmaPeer& peer, Failure* failure) {
  std::array<uint8_t, RdmaPeer::kBytes> bytes{};
  PutU32(&bytes[0], peer.qpn);
  PutU32(&bytes[4], peer.psn);
  PutU16(&bytes[8], peer.lid);
  bytes[10] = peer.mtu;
  std::memcpy(&bytes[12], peer.gid.data(), peer.gid.size());
  PutU64(&bytes[28], peer.address);
  PutU32(&bytes[36], peer.rkey);
  PutU64(&bytes[40], peer.length);
  return SendAll(fd, bytes.data(), bytes.size(), false, "RDMA queue pair description", failure);
}

// Decodes the RdmaPeer in `bytes` (RdmaPeer::kBytes of them).
inline void ParseRdmaPeer(const uint8_t* bytes, RdmaPeer* peer) {
  peer->qpn = GetU32(&bytes[0]);
  peer->psn = GetU32(&bytes[4]);
  peer->lid = GetU16(&bytes[8]);
  peer->mtu = bytes[10];
  std::memcpy(peer->gid.data(), &bytes[12], peer->gid.size());
  peer->address = GetU64(&bytes[28]);
  peer->rkey = GetU32(&bytes[36]);
  peer->length = GetU64(&bytes[40]);
}

inline bool RecvRdmaPeer(int fd, RdmaPeer* peer, Failure* failure) {
  std::array<uint8_t, RdmaPeer::kBytes> bytes{};
  if (!RecvAll(fd, bytes.data(), bytes.size(), "RDMA queue pair description", failure)) return false;
  ParseRdmaPeer(bytes.data(), peer);
  return true;
}

}  // namespace mt::wire
