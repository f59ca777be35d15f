#pragma once
#include <napi.h>

namespace mt {

// capabilities(): what this host can do, probed at call time (libraries are dlopen'ed, so a
// host without them still loads the addon).
Napi::Value Capabilities(const Napi::CallbackInfo& info);

}  // namespace mt
