// Built instead of rdma.cpp when <infiniband/verbs.h> was absent at configure time: the engine
// then offers and uses TCP only.
#include "rdma.hpp"

namespace mt {
namespace {

Failure NotCompiled() {
  return {"rdma_unavailable",
          "this build of the native addon has no RDMA transport: <infiniband/verbs.h> was not found when it was "
          "built (install libibverbs-dev, then rebuild with `npm install`)"};
}

}  // namespace

bool RdmaQueuePair::Probe(const RdmaOptions&, Failure* failure) {
  *failure = NotCompiled();
  return false;
}

std::unique_ptr<RdmaQueuePair> RdmaQueuePair::Open(uint8_t*, uint64_t, bool, const RdmaOptions&, Failure* failure) {
  *failure = NotCompiled();
  return nullptr;
}

}  // namespace mt
