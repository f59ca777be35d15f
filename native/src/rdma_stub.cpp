// Built instead of rdma.cpp when <infiniband/verbs.h> was absent at configure time.
#include "errors.hpp"
#include "rdma.hpp"
#include "staging_buffer.hpp"

namespace mt {
namespace {

// Checks the buffer argument first, like the real constructor, so a freed buffer is reported
// the same way by both builds.
Napi::Value Unavailable(const Napi::CallbackInfo& info) {
  if (!StagingBuffer::RegionOf(info.Env(), info[0], "buffer")) return info.Env().Undefined();
  ThrowTransferError(info.Env(), "rdma_unavailable",
                     "this build of the native addon has no RDMA transport: <infiniband/verbs.h> was not found "
                     "when it was built (install libibverbs-dev, then rebuild with `npm install`); use TCP");
  return info.Env().Undefined();
}

}  // namespace

Napi::Function InitRdmaEndpoint(Napi::Env env) { return Napi::Function::New(env, Unavailable, "RdmaEndpoint"); }

}  // namespace mt
