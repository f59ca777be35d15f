#include "copy_worker.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "crc32c.hpp"
#include "errors.hpp"
#include "region.hpp"
#include "staging_buffer.hpp"

namespace mt {
namespace {

struct CopyJob {
  uint8_t* destination;
  const uint8_t* source;
  size_t length;
};

// Owns everything the worker thread touches for as long as it runs: raw pointers into the
// ArrayBuffers (taken on the JS thread, where reading them is allowed), references that keep
// those ArrayBuffers from being collected while only this copy still uses them, and pins that
// make StagingBuffer.free() refuse with buffer_busy instead of unmapping memory being written.
// Node deletes the worker on the JS thread after OnOK/OnError, which releases all of it.
class CopyWorker : public Napi::AsyncWorker {
 public:
  CopyWorker(Napi::Env env, std::vector<CopyJob> jobs, std::vector<Napi::Reference<Napi::Value>> keepAlive,
             std::vector<std::unique_ptr<RegionPin>> pins)
      : Napi::AsyncWorker(env, "monkeytree.copyWithCrc32c"),
        deferred_(Napi::Promise::Deferred::New(env)),
        jobs_(std::move(jobs)),
        keepAlive_(std::move(keepAlive)),
        pins_(std::move(pins)),
        crcs_(jobs_.size(), 0) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  // For a worker that could not be queued: settles its promise so that no caller waits forever
  // and the deferred handle is released.
  void Reject(const Napi::Value& error) { deferred_.Reject(error); }

 protected:
  // Worker thread: no JS, only the copies. CRC32C of nothing is 0, and a zero-length view may
  // have a null data pointer, which memcpy must not be given.
  void Execute() override {
    for (size_t i = 0; i < jobs_.size(); ++i) {
      const CopyJob& job = jobs_[i];
      crcs_[i] = job.length == 0 ? 0 : CopyWithCrc32c(0, job.destination, job.source, job.length);
    }
  }

  void OnOK() override {
    Napi::Env env = Env();
    Napi::Uint32Array result = Napi::Uint32Array::New(env, crcs_.size());
    for (size_t i = 0; i < crcs_.size(); ++i) result[i] = crcs_[i];
    deferred_.Resolve(result);
  }

  // Execute never calls SetError today; kept so any future failure still settles the promise.
  void OnError(const Napi::Error& error) override { deferred_.Reject(error.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  std::vector<CopyJob> jobs_;
  std::vector<Napi::Reference<Napi::Value>> keepAlive_;
  std::vector<std::unique_ptr<RegionPin>> pins_;
  std::vector<uint32_t> crcs_;
};

void ThrowType(Napi::Env env, const std::string& message) {
  Napi::TypeError::New(env, "copyWithCrc32cAsync: " + message).ThrowAsJavaScriptException();
}

// One side of pairs[index]: a Uint8Array over a live (not detached) buffer. On success also
// returns its ArrayBuffer, which the caller references for the duration of the copy.
bool ViewOf(Napi::Env env, Napi::Value value, const std::string& where, Napi::Uint8Array* view, Napi::Value* buffer) {
  if (!value.IsTypedArray() || value.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    ThrowType(env, where + " must be a Uint8Array");
    return false;
  }
  *view = value.As<Napi::Uint8Array>();
  Napi::ArrayBuffer arrayBuffer = view->ArrayBuffer();
  if (env.IsExceptionPending()) return false;
  // A detached view reads as zero bytes, which would silently copy nothing: a freed staging
  // buffer or a transferred ArrayBuffer is a caller bug worth naming.
  if (arrayBuffer.IsDetached()) {
    ThrowType(env, where + " is a view of a detached ArrayBuffer (a freed staging buffer or a transferred buffer)");
    return false;
  }
  *buffer = arrayBuffer;
  return true;
}

}  // namespace

Napi::Value CopyWithCrc32cAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray()) {
    ThrowType(env, "pairs must be an array of [destination, source] Uint8Array pairs");
    return env.Undefined();
  }
  Napi::Array pairs = info[0].As<Napi::Array>();
  const uint32_t count = pairs.Length();
  std::vector<CopyJob> jobs;
  std::vector<Napi::Reference<Napi::Value>> keepAlive;
  jobs.reserve(count);
  keepAlive.reserve(2 * static_cast<size_t>(count));
  // Every pair is checked before anything is queued, so a bad argument leaves nothing half-copied.
  for (uint32_t i = 0; i < count; ++i) {
    const std::string where = "pairs[" + std::to_string(i) + "]";
    Napi::Value pair = pairs.Get(i);
    if (env.IsExceptionPending()) return env.Undefined();
    if (!pair.IsArray() || pair.As<Napi::Array>().Length() != 2) {
      ThrowType(env, where + " must be a [destination, source] array");
      return env.Undefined();
    }
    Napi::Array sides = pair.As<Napi::Array>();
    Napi::Uint8Array destination, source;
    Napi::Value destinationBuffer, sourceBuffer;
    if (!ViewOf(env, sides.Get(0u), where + "[0] (destination)", &destination, &destinationBuffer) ||
        !ViewOf(env, sides.Get(1u), where + "[1] (source)", &source, &sourceBuffer))
      return env.Undefined();
    const size_t length = source.ByteLength();
    if (destination.ByteLength() != length) {
      ThrowType(env, where + ": destination holds " + std::to_string(destination.ByteLength()) +
                         " bytes but source holds " + std::to_string(length) + "; they must be the same length");
      return env.Undefined();
    }
    uint8_t* to = destination.Data();
    const uint8_t* from = source.Data();
    if (length > 0 && to < from + length && from < to + length) {
      Napi::RangeError::New(env, "copyWithCrc32cAsync: " + where + ": destination and source overlap")
          .ThrowAsJavaScriptException();
      return env.Undefined();
    }
    jobs.push_back({to, from, length});
    keepAlive.push_back(Napi::Persistent(destinationBuffer));
    keepAlive.push_back(Napi::Persistent(sourceBuffer));
  }

  std::vector<std::unique_ptr<RegionPin>> pins;
  if (info.Length() > 1 && !info[1].IsUndefined()) {
    if (!info[1].IsArray()) {
      ThrowType(env, "pin must be an array of StagingBuffers");
      return env.Undefined();
    }
    Napi::Array pin = info[1].As<Napi::Array>();
    for (uint32_t i = 0; i < pin.Length(); ++i) {
      const std::string what = "copyWithCrc32cAsync: pin[" + std::to_string(i) + "]";
      std::shared_ptr<Region> region = StagingBuffer::RegionOf(env, pin.Get(i), what.c_str());
      if (!region) return env.Undefined();
      std::unique_ptr<RegionPin> held = RegionPin::Acquire(region);
      if (!held) {
        ThrowTransferError(env, "buffer_freed", "staging buffer \"" + region->name() + "\" was freed");
        return env.Undefined();
      }
      pins.push_back(std::move(held));
    }
  }

  auto worker = std::make_unique<CopyWorker>(env, std::move(jobs), std::move(keepAlive), std::move(pins));
  if (env.IsExceptionPending()) {
    // napi_create_async_work failed and left the base half-built (its destructor would delete a
    // work handle that was never created): leak it rather than risk that; this does not happen
    // short of running out of memory.
    worker.release();
    return env.Undefined();
  }
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  if (env.IsExceptionPending()) {
    // Not queued, so Node will never run or delete it: reject here and let unique_ptr free it.
    worker->Reject(env.GetAndClearPendingException().Value());
    return promise;
  }
  worker.release();  // owned by Node from here; deleted after OnOK/OnError
  return promise;
}

}  // namespace mt
