#pragma once
// JS class StagingBuffer: owns one Region and hands JS a single external ArrayBuffer over it,
// which free() detaches before unmapping so no JS view can outlive the mapping.
#include <napi.h>

#include <memory>

#include "region.hpp"

namespace mt {

class StagingBuffer : public Napi::ObjectWrap<StagingBuffer> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit StagingBuffer(const Napi::CallbackInfo& info);
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() override;

  // The region behind a JS StagingBuffer, or nullptr (with a pending JS exception) when the
  // value is not a live StagingBuffer; `what` names the argument in the message.
  static std::shared_ptr<Region> RegionOf(Napi::Env env, Napi::Value value, const char* what);

 private:
  Napi::Value GetName(const Napi::CallbackInfo& info);
  Napi::Value GetSize(const Napi::CallbackInfo& info);
  Napi::Value GetLocked(const Napi::CallbackInfo& info);
  Napi::Value GetLockError(const Napi::CallbackInfo& info);
  Napi::Value GetFreed(const Napi::CallbackInfo& info);
  Napi::Value GetArrayBuffer(const Napi::CallbackInfo& info);
  Napi::Value Crc32c(const Napi::CallbackInfo& info);
  Napi::Value Word(const Napi::CallbackInfo& info);
  Napi::Value Free(const Napi::CallbackInfo& info);

  bool CheckLive(Napi::Env env);

  std::shared_ptr<Region> region_;
  Napi::Reference<Napi::ArrayBuffer> arrayBuffer_;
};

// createStagingBufferAsync(name, size, lock): creates the region on a worker thread.
Napi::Value CreateStagingBufferAsync(const Napi::CallbackInfo& info);

}  // namespace mt
