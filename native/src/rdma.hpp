#pragma once
// JS class RdmaEndpoint: one RC queue pair over one registered range of a staging buffer, for
// one-sided RDMA WRITE. binding.gyp compiles rdma.cpp (and defines MONKEYTREE_HAVE_IBVERBS) only
// when <infiniband/verbs.h> and libibverbs were found at configure time; otherwise rdma_stub.cpp
// provides a class whose constructor always throws `rdma_unavailable`.
#include <napi.h>

namespace mt {

#ifdef MONKEYTREE_HAVE_IBVERBS
constexpr bool kRdmaCompiled = true;
#else
constexpr bool kRdmaCompiled = false;
#endif

Napi::Function InitRdmaEndpoint(Napi::Env env);

}  // namespace mt
