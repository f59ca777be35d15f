#include "staging_buffer.hpp"

#include <cstdint>

#include "addon.hpp"
#include "crc32c.hpp"
#include "errors.hpp"

namespace mt {

Napi::Function StagingBuffer::Init(Napi::Env env) {
  return DefineClass(env, "StagingBuffer",
                     {
                         InstanceAccessor<&StagingBuffer::GetName>("name"),
                         InstanceAccessor<&StagingBuffer::GetSize>("size"),
                         InstanceAccessor<&StagingBuffer::GetLocked>("locked"),
                         InstanceAccessor<&StagingBuffer::GetLockError>("lockError"),
                         InstanceAccessor<&StagingBuffer::GetFreed>("freed"),
                         InstanceMethod<&StagingBuffer::GetArrayBuffer>("arrayBuffer"),
                         InstanceMethod<&StagingBuffer::Crc32c>("crc32c"),
                         InstanceMethod<&StagingBuffer::Word>("word"),
                         InstanceMethod<&StagingBuffer::Free>("free"),
                     });
}

// new StagingBuffer(name, size, create, lock); size is ignored when create is false. Or
// new StagingBuffer(external), adopting a region CreateStagingBufferAsync made off the JS thread.
StagingBuffer::StagingBuffer(const Napi::CallbackInfo& info) : Napi::ObjectWrap<StagingBuffer>(info) {
  Napi::Env env = info.Env();
  if (info.Length() == 1 && info[0].IsExternal()) {
    region_ = *info[0].As<Napi::External<std::shared_ptr<Region>>>().Data();
    return;
  }
  if (info.Length() < 4 || !info[0].IsString() || !info[1].IsNumber() || !info[2].IsBoolean() || !info[3].IsBoolean()) {
    Napi::TypeError::New(env, "StagingBuffer(name: string, size: number, create: boolean, lock: boolean)")
        .ThrowAsJavaScriptException();
    return;
  }
  const std::string name = info[0].As<Napi::String>();
  const double size = info[1].As<Napi::Number>().DoubleValue();
  const bool create = info[2].As<Napi::Boolean>();
  const bool lock = info[3].As<Napi::Boolean>();
  Failure failure;
  region_ =
      create ? Region::Create(name, static_cast<size_t>(size), lock, &failure) : Region::Open(name, lock, &failure);
  if (!region_) ThrowTransferError(env, failure.code, failure.message);
}

namespace {

// Allocates a region on a worker thread: creating one zero-fills and maps all of its pages,
// which for gigabytes takes seconds the JS thread must not wait.
class CreateWorker : public Napi::AsyncWorker {
 public:
  CreateWorker(Napi::Env env, std::string name, size_t size, bool lock)
      : Napi::AsyncWorker(env, "monkeytree.createStagingBuffer"),
        deferred_(Napi::Promise::Deferred::New(env)),
        name_(std::move(name)),
        size_(size),
        lock_(lock) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override { region_ = Region::Create(name_, size_, lock_, &failure_); }

  void OnOK() override {
    Napi::Env env = Env();
    if (!region_) {
      deferred_.Reject(MakeTransferError(env, failure_.code, failure_.message));
      return;
    }
    auto external = Napi::External<std::shared_ptr<Region>>::New(env, &region_);
    deferred_.Resolve(GetAddon(env).stagingBufferClass.New({external}));
  }

  void OnError(const Napi::Error& error) override { deferred_.Reject(error.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  std::string name_;
  size_t size_;
  bool lock_;
  std::shared_ptr<Region> region_;
  Failure failure_;
};

}  // namespace

// createStagingBufferAsync(name, size, lock): a promise of a new StagingBuffer.
Napi::Value CreateStagingBufferAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || !info[0].IsString() || !info[1].IsNumber() || !info[2].IsBoolean()) {
    Napi::TypeError::New(env, "createStagingBufferAsync(name: string, size: number, lock: boolean)")
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  auto* worker =
      new CreateWorker(env, info[0].As<Napi::String>(), static_cast<size_t>(info[1].As<Napi::Number>().DoubleValue()),
                       info[2].As<Napi::Boolean>());
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

StagingBuffer::~StagingBuffer() {
  // A still-reachable ArrayBuffer holds its own reference to the region (see GetArrayBuffer),
  // so dropping ours here never unmaps memory that JS can still see.
  region_.reset();
}

std::shared_ptr<Region> StagingBuffer::RegionOf(Napi::Env env, Napi::Value value, const char* what) {
  Addon& addon = GetAddon(env);
  if (!value.IsObject() || !value.As<Napi::Object>().InstanceOf(addon.stagingBufferClass.Value())) {
    Napi::TypeError::New(env, std::string(what) + " must be a StagingBuffer").ThrowAsJavaScriptException();
    return nullptr;
  }
  StagingBuffer* buffer = StagingBuffer::Unwrap(value.As<Napi::Object>());
  if (!buffer->CheckLive(env)) return nullptr;
  return buffer->region_;
}

bool StagingBuffer::CheckLive(Napi::Env env) {
  if (region_ && !region_->retired()) return true;
  ThrowTransferError(env, "buffer_freed",
                     "staging buffer" + (region_ ? " \"" + region_->name() + "\"" : std::string()) +
                         " was freed; allocate a new one with StagingBuffer.create()");
  return false;
}

Napi::Value StagingBuffer::GetName(const Napi::CallbackInfo& info) {
  return region_ ? Napi::String::New(info.Env(), region_->name()) : info.Env().Undefined();
}

Napi::Value StagingBuffer::GetSize(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), region_ ? static_cast<double>(region_->size()) : 0);
}

Napi::Value StagingBuffer::GetLocked(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), region_ && region_->locked());
}

Napi::Value StagingBuffer::GetLockError(const Napi::CallbackInfo& info) {
  if (!region_ || region_->locked()) return info.Env().Null();
  return Napi::String::New(info.Env(), region_->lockError());
}

Napi::Value StagingBuffer::GetFreed(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), !region_ || region_->retired());
}

Napi::Value StagingBuffer::GetArrayBuffer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!CheckLive(env)) return env.Undefined();
  if (!arrayBuffer_.IsEmpty() && !arrayBuffer_.Value().IsEmpty()) return arrayBuffer_.Value();
  auto* keepAlive = new std::shared_ptr<Region>(region_);
  Napi::ArrayBuffer buffer = Napi::ArrayBuffer::New(
      env, region_->data(), region_->size(), [](Napi::Env, void*, std::shared_ptr<Region>* region) { delete region; },
      keepAlive);
  arrayBuffer_ = Napi::Reference<Napi::ArrayBuffer>::New(buffer, 0);
  return buffer;
}

// crc32c(offset, length): CRC32C of a range, for verifying what arrived.
Napi::Value StagingBuffer::Crc32c(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!CheckLive(env)) return env.Undefined();
  const double offset = info[0].As<Napi::Number>().DoubleValue();
  const double length = info[1].As<Napi::Number>().DoubleValue();
  if (offset < 0 || length < 0 || offset + length > static_cast<double>(region_->size())) {
    Napi::RangeError::New(env, "crc32c range is outside the buffer").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  const uint32_t crc = mt::Crc32c(0, region_->data() + static_cast<size_t>(offset), static_cast<size_t>(length));
  return Napi::Number::New(env, crc);
}

// word(index[, value]): the index-th 64-bit word, read (or written, then read) sequentially
// consistently, as another process's atomics on the same mapping see it (a launcher's control block).
Napi::Value StagingBuffer::Word(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!CheckLive(env)) return env.Undefined();
  const double index = info[0].As<Napi::Number>().DoubleValue();
  if (index < 0 || index != static_cast<double>(static_cast<size_t>(index)) ||
      (index + 1) * 8 > static_cast<double>(region_->size())) {
    Napi::RangeError::New(env, "word index is outside the buffer").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  auto* word = reinterpret_cast<int64_t*>(region_->data()) + static_cast<size_t>(index);
  if (info.Length() > 1)
    __atomic_store_n(word, static_cast<int64_t>(info[1].As<Napi::Number>().DoubleValue()), __ATOMIC_SEQ_CST);
  return Napi::Number::New(env, static_cast<double>(__atomic_load_n(word, __ATOMIC_SEQ_CST)));
}

Napi::Value StagingBuffer::Free(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!region_ || region_->retired()) return env.Undefined();
  if (!region_->Retire()) {
    ThrowTransferError(env, "buffer_busy",
                       "staging buffer \"" + region_->name() +
                           "\" is in use by a grant or a transfer; await or revoke it before free()");
    return env.Undefined();
  }
  if (!arrayBuffer_.IsEmpty() && !arrayBuffer_.Value().IsEmpty()) arrayBuffer_.Value().Detach();
  arrayBuffer_.Reset();
  region_->Unmap();
  return env.Undefined();
}

}  // namespace mt
