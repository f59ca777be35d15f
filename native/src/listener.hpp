#pragma once
// JS class Listener: the destination side of the transfer engine. It owns a listening socket,
// grants single-use tokens authorising a write into a range of one staging buffer, receives
// chunks straight into that range (over TCP streams, or as RDMA WRITEs when it offers RDMA and
// the sender asks for it), verifies each chunk's CRC32C, and reports every grant's outcome to
// JS exactly once, after its last stream thread (and queue pair) has let go of the buffer.
// Strangers cost little: one accept thread reads every connection's hello without blocking,
// within an absolute deadline, and only a connection naming an outstanding grant gets a thread;
// connections of both kinds together are capped.
#include <napi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "addon.hpp"
#include "net.hpp"
#include "rdma.hpp"
#include "region.hpp"
#include "wire.hpp"

namespace mt {

class Listener : public Napi::ObjectWrap<Listener>, public Closable {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit Listener(const Napi::CallbackInfo& info);
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  ~Listener() override;
  void Close() override;

 private:
  struct Grant {
    wire::Token token{};
    std::unique_ptr<RegionPin> pin;
    uint64_t offset = 0;
    uint64_t length = 0;
    bool active = false;
    bool rdma = false;
    uint32_t streamCount = 0;
    uint32_t chunkSize = 0;
    uint64_t chunkCount = 0;
    std::vector<bool> streamsJoined;
    uint32_t streamsEnded = 0;
    std::vector<uint8_t> chunkClaimed;
    uint64_t chunksVerified = 0;
    std::set<int> fds;
    int threadsInside = 0;
    bool finished = false;
    Failure outcome;
    std::chrono::steady_clock::time_point started;
  };

  using Clock = std::chrono::steady_clock;

  // A connection that has not yet said which grant it is for: the hello (and for RDMA the
  // sender's queue pair) is all it may send, by its deadline.
  struct Handshake {
    Fd fd;
    Clock::time_point deadline;
    std::array<uint8_t, wire::Hello::kBytes + wire::RdmaPeer::kBytes> bytes{};
    size_t received = 0;
    wire::Hello hello;
  };

  // A connection naming an outstanding grant, served by its own thread.
  struct Connection {
    Fd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  struct Event {
    std::string token;
    Failure failure;
    double bytes = 0;
    double seconds = 0;
    bool rdma = false;
  };

  Napi::Value GetPort(const Napi::CallbackInfo& info);
  Napi::Value GetRdmaUnavailable(const Napi::CallbackInfo& info);
  bool ConfigureRdma(Napi::Env env, Napi::Value options);
  Napi::Value GrantRange(const Napi::CallbackInfo& info);
  Napi::Value Revoke(const Napi::CallbackInfo& info);
  Napi::Value JsClose(const Napi::CallbackInfo& info);

  void AcceptLoop();
  void AcceptWaiting();
  bool Advance(Handshake& handshake);
  void StartServing(Fd fd, const wire::Hello& hello, const wire::RdmaPeer& peer);
  void Serve(Connection* connection, wire::Hello hello, wire::RdmaPeer peer);
  Failure UnknownTokenLocked(const wire::Token& token) const;
  std::shared_ptr<Grant> Join(int fd, const wire::Hello& hello, Failure* failure);
  bool ReceiveChunk(int fd, Grant& grant, const wire::ChunkHeader& header, Failure* failure);
  bool AcceptRdma(const wire::Hello& hello, Failure* failure);
  std::unique_ptr<RdmaQueuePair> OpenRdma(const wire::Hello& hello, const wire::RdmaPeer& peer, Failure* failure);
  bool ConnectRdma(int fd, RdmaQueuePair& queuePair, const wire::RdmaPeer& peer, Failure* failure);
  bool ReceiveRdma(int fd, const Grant& grant, RdmaQueuePair& queuePair, Failure* failure);
  void EndStream(const std::shared_ptr<Grant>& grant, int fd);
  // Records the outcome once and wakes the grant's other streams (all but exceptFd).
  void FinishLocked(const std::shared_ptr<Grant>& grant, const Failure& outcome, int exceptFd);
  void Leave(const std::shared_ptr<Grant>& grant, int fd);
  void EmitLocked(Grant& grant);
  void ReapLocked();

  Addon* addon_;
  Napi::ThreadSafeFunction events_;
  Fd listenFd_;
  uint16_t port_ = 0;
  double idleSeconds_ = 0;
  double helloSeconds_ = 0;
  size_t maxConnections_ = 0;
  RdmaOptions rdma_;
  std::string rdmaUnavailable_;  // why this listener does not offer RDMA; empty when it does
  std::thread acceptThread_;
  std::mutex mutex_;
  bool closed_ = true;  // until the constructor has started everything Close() stops
  std::map<wire::Token, std::shared_ptr<Grant>> grants_;
  std::set<wire::Token> consumed_;
  std::list<Connection> connections_;
  std::list<Handshake> handshakes_;  // the accept thread's alone, oldest first
};

}  // namespace mt
