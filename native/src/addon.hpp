#pragma once
// Per-environment addon state, passed as instance data instead of globals so that
// worker threads each get their own copy and every live handle is closed at teardown.
#include <napi.h>

#include <mutex>
#include <set>

namespace mt {

// Anything that owns threads or sockets; Close() must be idempotent and must not call into JS,
// because it also runs from the environment cleanup hook.
class Closable {
 public:
  virtual ~Closable() = default;
  virtual void Close() = 0;
};

struct Addon {
  Napi::FunctionReference errorClass;
  Napi::FunctionReference stagingBufferClass;

  void Track(Closable* handle);
  void Untrack(Closable* handle);
  void CloseAll();

 private:
  std::mutex mutex_;
  std::set<Closable*> live_;
};

inline Addon& GetAddon(Napi::Env env) { return *env.GetInstanceData<Addon>(); }

}  // namespace mt
