#pragma once
// Native code never defines error classes: JS hands its TransferError class over once and
// C++ only instantiates it, so every failure reaches JS with the same shape (message + code).
#include <napi.h>

#include <string>

namespace mt {

Napi::Value MakeTransferError(Napi::Env env, const std::string& code, const std::string& message);

// Throws as a pending JS exception; callers return right after.
void ThrowTransferError(Napi::Env env, const std::string& code, const std::string& message);

// "ENOSYS (Function not implemented)"
std::string ErrnoText(int err);

// A failure carried across threads until it can be turned into a JS error.
struct Failure {
  std::string code;
  std::string message;
  bool failed() const { return !code.empty(); }
};

}  // namespace mt
