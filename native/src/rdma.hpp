#pragma once
// The RDMA transport's one building block: an ibverbs RC queue pair over one registered range of
// memory, used by the transfer engine's sender and receiver threads (never by JS directly).
// binding.gyp compiles rdma.cpp (and defines MONKEYTREE_HAVE_IBVERBS) only when
// <infiniband/verbs.h> and libibverbs were found at configure time; otherwise rdma_stub.cpp
// provides Probe/Open that always answer `rdma_unavailable`, and the engine uses TCP only.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "errors.hpp"
#include "wire.hpp"

namespace mt {

#ifdef MONKEYTREE_HAVE_IBVERBS
constexpr bool kRdmaCompiled = true;
#else
constexpr bool kRdmaCompiled = false;
#endif

struct RdmaOptions {
  std::string device;  // empty: the first device
  uint8_t port = 1;
  int gidIndex = -1;  // -1: the port's first IPv4-mapped GID (RoCE v2 routes by it), else index 0
};

// What a wait for a completion ended with.
enum class RdmaWait { Completed, PeerReadable, Stopped, Failed };

class RdmaQueuePair {
 public:
  static constexpr uint32_t kSendDepth = 32;  // writes a sender may keep in flight
  static constexpr uint32_t kRecvDepth = 64;  // receives a receiver keeps posted

  // Checks that the device exists and its port is active, without registering anything: a
  // listener asks once, and offers RDMA in its tickets only when this succeeds.
  static bool Probe(const RdmaOptions& options, Failure* failure);
  // Opens the device, registers [data, data + length) and creates an RC queue pair in INIT. Only a
  // receiver (`remoteWrite`) lets the peer write into its range; a sender's range stays local. Fails with
  // `rdma_unavailable` when there is no usable device, and `rdma_failed` when one exists but refuses (the engine
  // reports either as `rdma_unavailable`: nothing has been sent or claimed yet, so TCP can still carry the transfer).
  static std::unique_ptr<RdmaQueuePair> Open(uint8_t* data, uint64_t length, bool remoteWrite,
                                             const RdmaOptions& options, Failure* failure);

  virtual ~RdmaQueuePair() = default;
  virtual wire::RdmaPeer Local() const = 0;
  // Posts `receives` receives for the peer's immediates, then INIT→RTR→RTS against the peer.
  virtual bool Connect(const wire::RdmaPeer& peer, uint32_t receives, Failure* failure) = 0;
  // One signalled RDMA WRITE WITH IMMEDIATE of [offset, +length) of the local range into the
  // peer's range at the same offset.
  virtual bool PostWrite(uint64_t offset, uint32_t length, uint32_t imm, Failure* failure) = 0;
  virtual bool PostReceive(Failure* failure) = 0;
  // Waits for the next completion of the send (sender) or receive (receiver) queue; `imm` is the
  // immediate a receive carried. Returns early, with nothing consumed, when `watchFd` becomes
  // readable (the peer spoke or hung up) or `stop` is set; fails with `timeout` after
  // `idleSeconds` (0 = never) without a completion.
  virtual RdmaWait Await(bool sendQueue, int watchFd, const std::atomic<bool>& stop, double idleSeconds, uint32_t* imm,
                         Failure* failure) = 0;
};

}  // namespace mt
