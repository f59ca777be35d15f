#include "errors.hpp"

#include <cerrno>
#include <cstring>

#include "addon.hpp"

namespace mt {

Napi::Value MakeTransferError(Napi::Env env, const std::string& code, const std::string& message) {
  Addon& addon = GetAddon(env);
  if (addon.errorClass.IsEmpty()) {
    Napi::Error fallback = Napi::Error::New(env, message);
    fallback.Set("code", Napi::String::New(env, code));
    return fallback.Value();
  }
  return addon.errorClass.New({Napi::String::New(env, message), Napi::String::New(env, code)});
}

void ThrowTransferError(Napi::Env env, const std::string& code, const std::string& message) {
  Napi::Value error = MakeTransferError(env, code, message);
  if (!env.IsExceptionPending()) napi_throw(env, error);
}

std::string ErrnoText(int err) {
  const char* name = strerrorname_np(err);
  std::string text = name != nullptr ? name : ("errno " + std::to_string(err));
  return text + " (" + std::strerror(err) + ")";
}

}  // namespace mt
