// Module entry: builds the per-environment Addon, exports every class and function once.
#include "addon.hpp"

#include "capabilities.hpp"
#include "copy_worker.hpp"
#include "crc32c.hpp"
#include "errors.hpp"
#include "listener.hpp"
#include "outgoing_transfer.hpp"
#include "staging_buffer.hpp"

namespace mt {

void Addon::Track(Closable* handle) {
  std::lock_guard<std::mutex> guard(mutex_);
  live_.insert(handle);
}

void Addon::Untrack(Closable* handle) {
  std::lock_guard<std::mutex> guard(mutex_);
  live_.erase(handle);
}

void Addon::CloseAll() {
  std::set<Closable*> handles;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    handles.swap(live_);
  }
  for (Closable* handle : handles) handle->Close();
}

namespace {

bool ByteView(Napi::Env env, Napi::Value value, const char* what, uint8_t** data, size_t* length) {
  if (!value.IsTypedArray() || value.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    Napi::TypeError::New(env, std::string(what) + " must be a Uint8Array").ThrowAsJavaScriptException();
    return false;
  }
  Napi::Uint8Array array = value.As<Napi::Uint8Array>();
  *data = array.Data();
  *length = array.ByteLength();
  return true;
}

uint32_t Seed(const Napi::CallbackInfo& info, size_t index) {
  return info.Length() > index && info[index].IsNumber() ? info[index].As<Napi::Number>().Uint32Value() : 0;
}

// setErrorClass(TransferError): the class every native failure is thrown as.
Napi::Value SetErrorClass(const Napi::CallbackInfo& info) {
  if (!info[0].IsFunction()) {
    Napi::TypeError::New(info.Env(), "setErrorClass expects a constructor").ThrowAsJavaScriptException();
    return info.Env().Undefined();
  }
  GetAddon(info.Env()).errorClass = Napi::Persistent(info[0].As<Napi::Function>());
  return info.Env().Undefined();
}

// crc32c(bytes, seed = 0)
Napi::Value Crc32cOf(const Napi::CallbackInfo& info) {
  uint8_t* data;
  size_t length;
  if (!ByteView(info.Env(), info[0], "bytes", &data, &length)) return info.Env().Undefined();
  return Napi::Number::New(info.Env(), Crc32c(Seed(info, 1), data, length));
}

// copyWithCrc32c(destination, source, seed = 0): copies source into the start of destination
// and returns the CRC32C of source.
Napi::Value CopyWithCrc32cOf(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint8_t* destination;
  uint8_t* source;
  size_t destinationLength, sourceLength;
  if (!ByteView(env, info[0], "destination", &destination, &destinationLength) ||
      !ByteView(env, info[1], "source", &source, &sourceLength))
    return env.Undefined();
  if (sourceLength > destinationLength) {
    Napi::RangeError::New(env, "destination (" + std::to_string(destinationLength) +
                                   " bytes) is shorter than source (" + std::to_string(sourceLength) + " bytes)")
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (destination < source + sourceLength && source < destination + sourceLength) {
    Napi::RangeError::New(env, "destination and source overlap").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  return Napi::Number::New(env, CopyWithCrc32c(Seed(info, 2), destination, source, sourceLength));
}

}  // namespace

Napi::Object InitAll(Napi::Env env, Napi::Object exports) {
  auto* addon = new Addon();
  env.SetInstanceData<Addon>(addon);
  env.AddCleanupHook([addon]() { addon->CloseAll(); });

  Napi::Function stagingBuffer = StagingBuffer::Init(env);
  addon->stagingBufferClass = Napi::Persistent(stagingBuffer);
  exports.Set("StagingBuffer", stagingBuffer);
  exports.Set("Listener", Listener::Init(env));
  exports.Set("OutgoingTransfer", OutgoingTransfer::Init(env));
  exports.Set("capabilities", Napi::Function::New(env, Capabilities, "capabilities"));
  exports.Set("setErrorClass", Napi::Function::New(env, SetErrorClass, "setErrorClass"));
  exports.Set("crc32c", Napi::Function::New(env, Crc32cOf, "crc32c"));
  exports.Set("copyWithCrc32c", Napi::Function::New(env, CopyWithCrc32cOf, "copyWithCrc32c"));
  exports.Set("createStagingBufferAsync",
              Napi::Function::New(env, CreateStagingBufferAsync, "createStagingBufferAsync"));
  exports.Set("copyWithCrc32cAsync", Napi::Function::New(env, CopyWithCrc32cAsync, "copyWithCrc32cAsync"));
  return exports;
}

}  // namespace mt

static Napi::Object Init(Napi::Env env, Napi::Object exports) { return mt::InitAll(env, exports); }

NODE_API_MODULE(monkeytree_native, Init)
