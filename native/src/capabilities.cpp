#include "capabilities.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "crc32c.hpp"
#include "errors.hpp"
#include "rdma.hpp"

namespace mt {
namespace {

struct Library {
  void* handle = nullptr;
  explicit Library(const char* name) : handle(dlopen(name, RTLD_NOW | RTLD_LOCAL)) {}
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  ~Library() {
    if (handle != nullptr) dlclose(handle);
  }
  template <typename Fn>
  Fn Symbol(const char* name) const {
    return reinterpret_cast<Fn>(dlsym(handle, name));
  }
};

std::string DlError() {
  const char* text = dlerror();
  return text != nullptr ? text : "unknown dlopen error";
}

struct Probe {
  std::vector<std::string> devices;
  std::string reason;
};

// The device list only needs three stable libibverbs entry points, declared here with opaque
// pointers so the probe works without the verbs headers.
Probe ProbeRdma() {
  Probe probe;
  Library verbs("libibverbs.so.1");
  if (verbs.handle == nullptr) {
    probe.reason = "libibverbs.so.1 not loadable: " + DlError();
    return probe;
  }
  using GetList = void** (*)(int*);
  using FreeList = void (*)(void**);
  using GetName = const char* (*)(void*);
  auto getList = verbs.Symbol<GetList>("ibv_get_device_list");
  auto freeList = verbs.Symbol<FreeList>("ibv_free_device_list");
  auto getName = verbs.Symbol<GetName>("ibv_get_device_name");
  if (getList == nullptr || freeList == nullptr || getName == nullptr) {
    probe.reason = "libibverbs.so.1 lacks ibv_get_device_list/ibv_get_device_name";
    return probe;
  }
  int count = 0;
  errno = 0;
  void** list = getList(&count);
  if (list == nullptr) {
    // What libibverbs answers on a host without RDMA hardware (ENOSYS: no uverbs devices).
    probe.reason = "no RDMA devices (ibv_get_device_list: " + ErrnoText(errno) + ")";
    return probe;
  }
  for (int i = 0; i < count; ++i) probe.devices.emplace_back(getName(list[i]));
  freeList(list);
  if (probe.devices.empty()) probe.reason = "no RDMA devices (ibv_get_device_list returned an empty list)";
  return probe;
}

Probe ProbeCuda() {
  Probe probe;
  Library cuda("libcuda.so.1");
  if (cuda.handle == nullptr) {
    probe.reason = "libcuda.so.1 not loadable: " + DlError();
    return probe;
  }
  using Init = int (*)(unsigned);
  using DeviceCount = int (*)(int*);
  auto init = cuda.Symbol<Init>("cuInit");
  auto deviceCount = cuda.Symbol<DeviceCount>("cuDeviceGetCount");
  int count = 0;
  if (init == nullptr || deviceCount == nullptr) {
    probe.reason = "libcuda.so.1 lacks cuInit/cuDeviceGetCount";
  } else if (const int rc = init(0); rc != 0) {
    probe.reason = "cuInit failed with CUresult " + std::to_string(rc);
  } else if (const int rc2 = deviceCount(&count); rc2 != 0 || count == 0) {
    probe.reason = "cuDeviceGetCount found no devices";
  } else {
    for (int i = 0; i < count; ++i) probe.devices.push_back("cuda:" + std::to_string(i));
  }
  return probe;
}

bool PathExists(const char* path) {
  struct stat info {};
  return stat(path, &info) == 0;
}

Napi::Object Describe(Napi::Env env, const Probe& probe) {
  Napi::Object object = Napi::Object::New(env);
  object.Set("present", Napi::Boolean::New(env, !probe.devices.empty()));
  Napi::Array devices = Napi::Array::New(env, probe.devices.size());
  for (uint32_t i = 0; i < probe.devices.size(); ++i) devices.Set(i, Napi::String::New(env, probe.devices[i]));
  object.Set("devices", devices);
  object.Set("reason", probe.reason.empty() ? env.Null() : Napi::String::New(env, probe.reason));
  return object;
}

}  // namespace

Napi::Value Capabilities(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object result = Napi::Object::New(env);

  Napi::Object tcp = Napi::Object::New(env);
  tcp.Set("present", Napi::Boolean::New(env, true));
  result.Set("tcp", tcp);

  const Probe rdmaProbe = ProbeRdma();
  Napi::Object rdma = Describe(env, rdmaProbe);
  // compiled: whether this build has the RDMA WRITE transport (verbs headers found at build
  // time); available: whether it can be used now. Devices are reported either way, so an
  // operator can see what the host offers; the reason says why RDMA is not available.
  rdma.Set("compiled", Napi::Boolean::New(env, kRdmaCompiled));
  rdma.Set("available", Napi::Boolean::New(env, kRdmaCompiled && !rdmaProbe.devices.empty()));
  if (!kRdmaCompiled && !rdmaProbe.devices.empty())
    rdma.Set("reason", Napi::String::New(env,
                                         "this build has no RDMA transport: <infiniband/verbs.h> was absent "
                                         "when the addon was built (install libibverbs-dev and rebuild)"));
  result.Set("rdma", rdma);

  const Probe cudaProbe = ProbeCuda();
  result.Set("cuda", Describe(env, cudaProbe));

  Probe gpudirectProbe;
  if (cudaProbe.devices.empty()) {
    gpudirectProbe.reason = "needs CUDA: " + cudaProbe.reason;
  } else if (rdmaProbe.devices.empty()) {
    gpudirectProbe.reason = "needs an RDMA device: " + rdmaProbe.reason;
  } else if (!PathExists("/sys/module/nvidia_peermem") && !PathExists("/sys/module/nv_peer_mem")) {
    gpudirectProbe.reason = "kernel module nvidia_peermem is not loaded";
  } else {
    gpudirectProbe.devices = cudaProbe.devices;
  }
  result.Set("gpudirect", Describe(env, gpudirectProbe));

  result.Set("crc32c", Napi::String::New(env, Crc32cImplementation()));
  return result;
}

}  // namespace mt
