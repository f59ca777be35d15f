#pragma once
// JS class OutgoingTransfer: the source side of the transfer engine. Writes a range of a local
// staging buffer into a range a remote Listener granted: over several parallel TCP streams that
// pull chunks from a shared counter, sending straight from the staging memory, or as RDMA WRITEs
// on one queue pair whose handshake rides one TCP connection. It starts in the constructor,
// reports progress and one final outcome through onEvent, and can be cancelled.
#include <napi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "addon.hpp"
#include "rdma.hpp"
#include "region.hpp"
#include "wire.hpp"

namespace mt {

class OutgoingTransfer : public Napi::ObjectWrap<OutgoingTransfer>, public Closable {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit OutgoingTransfer(const Napi::CallbackInfo& info);
  OutgoingTransfer(const OutgoingTransfer&) = delete;
  OutgoingTransfer& operator=(const OutgoingTransfer&) = delete;
  ~OutgoingTransfer() override;
  void Close() override;

 private:
  struct Options {
    std::string host;
    uint16_t port = 0;
    wire::Token token{};
    uint64_t offset = 0;
    uint64_t length = 0;
    uint32_t streams = 1;
    uint32_t chunkSize = 0;
    int64_t corruptChunk = -1;
    uint64_t progressEvery = 0;
    double idleSeconds = 0;
    wire::Transport transport = wire::Transport::Tcp;
    RdmaOptions rdma;
  };
  struct Event;

  Napi::Value Cancel(const Napi::CallbackInfo& info);
  bool ParseOptions(const Napi::CallbackInfo& info, Options* options);

  void RunStream(uint32_t index);
  bool SendRdma(int fd, RdmaQueuePair& queuePair, Failure* failure, bool* fromReceiver);
  bool SendChunks(int fd, Failure* failure);
  bool SendChunk(int fd, uint64_t index, Failure* failure);
  void ReportProgress(uint64_t bytes);
  void StreamFinished(uint32_t index, const Failure& failure, bool fromReceiver);
  void Settle(Napi::Env env, Napi::Function callback);
  void StopThreads();

  Addon* addon_;
  Options options_;
  std::unique_ptr<RegionPin> pin_;
  Napi::ThreadSafeFunction events_;
  std::vector<std::thread> threads_;
  std::chrono::steady_clock::time_point started_;
  std::atomic<uint64_t> nextChunk_{0};
  std::atomic<bool> cancelled_{false};

  std::mutex mutex_;
  uint64_t bytesSent_ = 0;
  uint64_t bytesReported_ = 0;
  std::vector<int> fds_;
  uint32_t running_ = 0;
  Failure receiverFailure_;
  Failure localFailure_;
  bool settled_ = true;  // until the constructor has started the streams
};

}  // namespace mt
