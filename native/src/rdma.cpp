// RDMA WRITE over one ibverbs RC queue pair; compiled only with MONKEYTREE_HAVE_IBVERBS.
//
// Each side opens an endpoint over the range of a staging buffer it exposes (registered for
// local and remote write), hands its `local` description (QP number, PSN, LID, GID, MTU,
// address, rkey, length) to the other side by any channel, and calls connect() with the other
// side's. The source then calls write(): RDMA WRITEs of a range of its registered memory into
// the peer's range, the last one carrying a 32-bit immediate; the destination's nextWrite()
// resolves with that immediate once every byte of the write is in place. The CPU of the
// destination never touches the payload. Completions are awaited on a thread per operation
// (one write and one nextWrite at a time per endpoint), never on the JS thread.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "addon.hpp"
#include "errors.hpp"
#include "rdma.hpp"
#include "region.hpp"
#include "staging_buffer.hpp"

namespace mt {
namespace {

// unique_ptr owners for verbs objects; each destroy function is called once, in reverse order
// of creation because the endpoint declares its members in creation order.
template <typename T, int (*Destroy)(T*)>
struct Destroyer {
  void operator()(T* handle) const {
    if (handle != nullptr) Destroy(handle);
  }
};
template <typename T, int (*Destroy)(T*)>
using Owned = std::unique_ptr<T, Destroyer<T, Destroy>>;

using DeviceContext = Owned<ibv_context, ibv_close_device>;
using ProtectionDomain = Owned<ibv_pd, ibv_dealloc_pd>;
using MemoryRegion = Owned<ibv_mr, ibv_dereg_mr>;
using CompletionChannel = Owned<ibv_comp_channel, ibv_destroy_comp_channel>;
using CompletionQueue = Owned<ibv_cq, ibv_destroy_cq>;
using QueuePair = Owned<ibv_qp, ibv_destroy_qp>;

struct DeviceListFree {
  void operator()(ibv_device** list) const { ibv_free_device_list(list); }
};
using DeviceList = std::unique_ptr<ibv_device*, DeviceListFree>;

constexpr uint32_t kMaxSendWr = 64;    // work requests one write() may chain
constexpr uint32_t kRecvDepth = 16;    // receives kept posted for the writes' immediates
constexpr uint64_t kMaxPiece = 1ull << 30;
constexpr int kPollMillis = 100;       // how often a waiting thread looks at close() and the clock

std::string Hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string Hex(const uint8_t* bytes, size_t count) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  for (size_t i = 0; i < count; ++i) {
    text += digits[bytes[i] >> 4];
    text += digits[bytes[i] & 0xf];
  }
  return text;
}

int Nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Lowercase hex of exactly `count` bytes.
bool FromHex(const std::string& text, uint8_t* bytes, size_t count) {
  if (text.size() != 2 * count) return false;
  for (size_t i = 0; i < count; ++i) {
    const int high = Nibble(text[2 * i]), low = Nibble(text[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    bytes[i] = static_cast<uint8_t>(high << 4 | low);
  }
  return true;
}

struct Peer {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  ibv_gid gid{};
  ibv_mtu mtu = IBV_MTU_1024;
  uint64_t address = 0;
  uint32_t rkey = 0;
  uint64_t length = 0;
};

class RdmaEndpoint : public Napi::ObjectWrap<RdmaEndpoint>, public Closable {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit RdmaEndpoint(const Napi::CallbackInfo& info);
  RdmaEndpoint(const RdmaEndpoint&) = delete;
  RdmaEndpoint& operator=(const RdmaEndpoint&) = delete;
  ~RdmaEndpoint() override;
  void Close() override;

 private:
  struct Outcome {
    Failure failure;
    double bytes = 0;
    uint32_t imm = 0;
  };
  struct Operation {
    const char* name;
    std::thread thread;
    std::unique_ptr<Napi::Promise::Deferred> deferred;
    std::chrono::steady_clock::time_point started;
    bool busy = false;
  };
  struct Done {
    RdmaEndpoint* endpoint;
    Operation* operation;
    Outcome outcome;
  };

  Napi::Value GetLocal(const Napi::CallbackInfo& info);
  Napi::Value Connect(const Napi::CallbackInfo& info);
  Napi::Value Write(const Napi::CallbackInfo& info);
  Napi::Value NextWrite(const Napi::CallbackInfo& info);
  Napi::Value CloseMethod(const Napi::CallbackInfo& info);

  bool Open(Napi::Env env, const Napi::CallbackInfo& info);
  bool ToRtrAndRts(const Peer& peer, Failure* failure);
  bool PostReceive(Failure* failure);
  bool Usable(Napi::Env env, const char* what);
  Napi::Value Begin(Napi::Env env, Operation& operation, std::function<Outcome()> work);
  void Settle(Napi::Env env, Operation& operation, const Outcome& outcome);
  bool Await(ibv_cq* cq, ibv_comp_channel* channel, ibv_wc* wc, Failure* failure);

  Addon* addon_;
  std::unique_ptr<RegionPin> pin_;
  uint64_t offset_ = 0;
  uint64_t length_ = 0;
  std::string deviceName_;
  uint8_t port_ = 1;
  int gidIndex_ = 0;
  double idleSeconds_ = 30;
  ibv_port_attr portAttr_{};
  ibv_gid gid_{};
  uint32_t psn_ = 0;
  Peer peer_;
  bool connected_ = false;
  bool closed_ = false;
  std::string broken_;  // why the queue pair can no longer be used, once it cannot
  std::atomic<bool> closing_{false};

  // In creation order, so that they are destroyed in reverse.
  DeviceContext context_;
  ProtectionDomain pd_;
  MemoryRegion mr_;
  CompletionChannel sendChannel_;
  CompletionChannel recvChannel_;
  CompletionQueue sendCq_;
  CompletionQueue recvCq_;
  QueuePair qp_;

  Operation write_{"write()", {}, {}, {}, false};
  Operation receive_{"nextWrite()", {}, {}, {}, false};
};

Napi::Function RdmaEndpoint::Init(Napi::Env env) {
  return DefineClass(env, "RdmaEndpoint",
                     {
                         InstanceAccessor<&RdmaEndpoint::GetLocal>("local"),
                         InstanceMethod<&RdmaEndpoint::Connect>("connect"),
                         InstanceMethod<&RdmaEndpoint::Write>("write"),
                         InstanceMethod<&RdmaEndpoint::NextWrite>("nextWrite"),
                         InstanceMethod<&RdmaEndpoint::CloseMethod>("close"),
                     });
}

// new RdmaEndpoint(buffer, offset, length, device ("" = first), port, gidIndex, idleSeconds)
RdmaEndpoint::RdmaEndpoint(const Napi::CallbackInfo& info)
    : Napi::ObjectWrap<RdmaEndpoint>(info), addon_(&GetAddon(info.Env())) {
  Napi::Env env = info.Env();
  if (!Open(env, info)) {
    Close();
    return;
  }
  addon_->Track(this);
}

bool RdmaEndpoint::Open(Napi::Env env, const Napi::CallbackInfo& info) {
  if (info.Length() < 7 || !info[1].IsNumber() || !info[2].IsNumber() || !info[3].IsString() ||
      !info[4].IsNumber() || !info[5].IsNumber() || !info[6].IsNumber()) {
    Napi::TypeError::New(env,
                         "RdmaEndpoint(buffer, offset, length, device: string, port, gidIndex, idleSeconds: number)")
        .ThrowAsJavaScriptException();
    return false;
  }
  std::shared_ptr<Region> region = StagingBuffer::RegionOf(env, info[0], "buffer");
  if (!region) return false;
  offset_ = static_cast<uint64_t>(info[1].As<Napi::Number>().DoubleValue());
  length_ = static_cast<uint64_t>(info[2].As<Napi::Number>().DoubleValue());
  deviceName_ = info[3].As<Napi::String>();
  port_ = static_cast<uint8_t>(info[4].As<Napi::Number>().Uint32Value());
  gidIndex_ = info[5].As<Napi::Number>().Int32Value();
  idleSeconds_ = info[6].As<Napi::Number>().DoubleValue();
  if (length_ == 0 || offset_ + length_ > region->size()) {
    ThrowTransferError(env, "out_of_range", "range is outside buffer \"" + region->name() + "\"");
    return false;
  }

  int count = 0;
  errno = 0;
  DeviceList list(ibv_get_device_list(&count));
  const int listError = errno;
  if (!list || count == 0) {
    const std::string why = list ? "ibv_get_device_list returned an empty list"
                                 : "ibv_get_device_list: " + ErrnoText(listError);
    ThrowTransferError(env, "rdma_unavailable", "no RDMA device on this host (" + why + "); use TCP");
    return false;
  }
  ibv_device* device = nullptr;
  std::string names;
  for (int i = 0; i < count; ++i) {
    const std::string name = ibv_get_device_name(list.get()[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (device == nullptr && (deviceName_.empty() || deviceName_ == name)) device = list.get()[i];
  }
  if (device == nullptr) {
    ThrowTransferError(env, "rdma_unavailable", "no RDMA device named \"" + deviceName_ + "\" (have: " + names + ")");
    return false;
  }
  deviceName_ = ibv_get_device_name(device);
  const std::string where = deviceName_ + " port " + std::to_string(port_);

  context_.reset(ibv_open_device(device));
  if (!context_) {
    const int err = errno;
    ThrowTransferError(env, "rdma_unavailable", "ibv_open_device(" + deviceName_ + "): " + ErrnoText(err));
    return false;
  }
  if (const int rc = ibv_query_port(context_.get(), port_, &portAttr_); rc != 0) {
    ThrowTransferError(env, "rdma_unavailable", "ibv_query_port(" + where + "): " + ErrnoText(rc));
    return false;
  }
  if (portAttr_.state != IBV_PORT_ACTIVE) {
    ThrowTransferError(env, "rdma_unavailable",
                       where + " is not active (" + ibv_port_state_str(portAttr_.state) + ")");
    return false;
  }
  if (ibv_query_gid(context_.get(), port_, gidIndex_, &gid_) != 0) {
    ThrowTransferError(env, "rdma_unavailable", where + " has no GID at index " + std::to_string(gidIndex_));
    return false;
  }

  // From here on the device exists and answered; failures are errors, not absence.
  pin_ = RegionPin::Acquire(region);
  if (!pin_) {
    ThrowTransferError(env, "buffer_freed", "staging buffer \"" + region->name() + "\" was freed");
    return false;
  }
  pd_.reset(ibv_alloc_pd(context_.get()));
  if (!pd_) {
    const int err = errno;
    ThrowTransferError(env, "rdma_failed", "ibv_alloc_pd(" + deviceName_ + "): " + ErrnoText(err));
    return false;
  }
  mr_.reset(ibv_reg_mr(pd_.get(), region->data() + offset_, length_, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  if (!mr_) {
    const int err = errno;
    ThrowTransferError(env, "rdma_failed",
                       "ibv_reg_mr of " + std::to_string(length_) + " bytes: " + ErrnoText(err) +
                           " (registration pins the pages: check `ulimit -l`)");
    return false;
  }
  sendChannel_.reset(ibv_create_comp_channel(context_.get()));
  recvChannel_.reset(ibv_create_comp_channel(context_.get()));
  if (!sendChannel_ || !recvChannel_) {
    const int err = errno;
    ThrowTransferError(env, "rdma_failed", "ibv_create_comp_channel: " + ErrnoText(err));
    return false;
  }
  // Waiting threads poll() these with a timeout and must never block in ibv_get_cq_event.
  for (ibv_comp_channel* channel : {sendChannel_.get(), recvChannel_.get()})
    fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
  sendCq_.reset(ibv_create_cq(context_.get(), kMaxSendWr, nullptr, sendChannel_.get(), 0));
  recvCq_.reset(ibv_create_cq(context_.get(), kRecvDepth, nullptr, recvChannel_.get(), 0));
  if (!sendCq_ || !recvCq_) {
    const int err = errno;
    ThrowTransferError(env, "rdma_failed", "ibv_create_cq: " + ErrnoText(err));
    return false;
  }
  ibv_qp_init_attr init{};
  init.send_cq = sendCq_.get();
  init.recv_cq = recvCq_.get();
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = kMaxSendWr;
  init.cap.max_recv_wr = kRecvDepth;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  qp_.reset(ibv_create_qp(pd_.get(), &init));
  if (!qp_) {
    const int err = errno;
    ThrowTransferError(env, "rdma_failed", "ibv_create_qp(RC): " + ErrnoText(err));
    return false;
  }
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = port_;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  const int initMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  if (const int rc = ibv_modify_qp(qp_.get(), &attr, initMask); rc != 0) {
    ThrowTransferError(env, "rdma_failed", "queue pair RESET→INIT: " + ErrnoText(rc));
    return false;
  }
  std::random_device entropy;
  psn_ = entropy() & 0xffffff;
  return true;
}

RdmaEndpoint::~RdmaEndpoint() {
  addon_->Untrack(this);
  Close();
}

// Idempotent and never calls into JS (it also runs from the environment cleanup hook): waiting
// threads notice `closing_` within kPollMillis; their promises reject with `cancelled` later.
void RdmaEndpoint::Close() {
  if (closed_) return;
  closed_ = true;
  closing_ = true;
  for (Operation* operation : {&write_, &receive_})
    if (operation->thread.joinable()) operation->thread.join();
  connected_ = false;
  qp_.reset();
  recvCq_.reset();
  sendCq_.reset();
  recvChannel_.reset();
  sendChannel_.reset();
  mr_.reset();
  pd_.reset();
  context_.reset();
  pin_.reset();
}

Napi::Value RdmaEndpoint::CloseMethod(const Napi::CallbackInfo& info) {
  addon_->Untrack(this);
  Close();
  return info.Env().Undefined();
}

bool RdmaEndpoint::Usable(Napi::Env env, const char* what) {
  if (closed_) {
    ThrowTransferError(env, "rdma_failed", std::string(what) + ": the RDMA endpoint is closed");
    return false;
  }
  if (!broken_.empty()) {
    ThrowTransferError(env, "rdma_failed",
                       std::string(what) + ": the queue pair failed earlier (" + broken_ + "); open a new endpoint");
    return false;
  }
  return true;
}

// { device, port, qpn, psn, lid, gid, mtu, address, rkey, length }: what the peer's connect() needs.
Napi::Value RdmaEndpoint::GetLocal(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!Usable(env, "local")) return env.Undefined();
  Napi::Object local = Napi::Object::New(env);
  local.Set("device", Napi::String::New(env, deviceName_));
  local.Set("port", Napi::Number::New(env, port_));
  local.Set("qpn", Napi::Number::New(env, qp_->qp_num));
  local.Set("psn", Napi::Number::New(env, psn_));
  local.Set("lid", Napi::Number::New(env, portAttr_.lid));
  local.Set("gid", Napi::String::New(env, Hex(gid_.raw, sizeof gid_.raw)));
  local.Set("mtu", Napi::Number::New(env, static_cast<int>(portAttr_.active_mtu)));
  local.Set("address", Napi::String::New(env, Hex(reinterpret_cast<uintptr_t>(mr_->addr))));
  local.Set("rkey", Napi::Number::New(env, mr_->rkey));
  local.Set("length", Napi::Number::New(env, static_cast<double>(length_)));
  return local;
}

// connect(peer.local): RESET→INIT happened in open(); this posts the receives for immediates and
// moves the queue pair INIT→RTR (ready to receive)→RTS (ready to send).
Napi::Value RdmaEndpoint::Connect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!Usable(env, "connect()")) return env.Undefined();
  if (connected_) {
    Napi::Error::New(env, "connect(): this endpoint is already connected").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (!info[0].IsObject()) {
    Napi::TypeError::New(env, "connect(peer) expects the peer endpoint's `local` object").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::Object object = info[0].As<Napi::Object>();
  auto number = [&](const char* key) {
    Napi::Value value = object.Get(key);
    return value.IsNumber() ? value.As<Napi::Number>().DoubleValue() : -1.0;
  };
  auto string = [&](const char* key) {
    Napi::Value value = object.Get(key);
    return value.IsString() ? value.As<Napi::String>().Utf8Value() : std::string();
  };
  Peer peer;
  uint8_t address[8];
  const double qpn = number("qpn"), psn = number("psn"), lid = number("lid"), mtu = number("mtu"),
               rkey = number("rkey"), length = number("length");
  if (qpn < 0 || qpn > 0xffffff || psn < 0 || psn > 0xffffff || lid < 0 || lid > 0xffff || mtu < IBV_MTU_256 ||
      mtu > IBV_MTU_4096 || rkey < 0 || rkey > 0xffffffffu || length <= 0 ||
      !FromHex(string("gid"), peer.gid.raw, sizeof peer.gid.raw) || !FromHex(string("address"), address, 8)) {
    Napi::TypeError::New(env, "connect(peer): peer must be the other endpoint's `local` object")
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  peer.qpn = static_cast<uint32_t>(qpn);
  peer.psn = static_cast<uint32_t>(psn);
  peer.lid = static_cast<uint16_t>(lid);
  peer.mtu = static_cast<ibv_mtu>(static_cast<int>(mtu));
  peer.rkey = static_cast<uint32_t>(rkey);
  peer.length = static_cast<uint64_t>(length);
  for (int i = 0; i < 8; ++i) peer.address = (peer.address << 8) | address[i];
  Failure failure;
  for (uint32_t i = 0; i < kRecvDepth && !failure.failed(); ++i) PostReceive(&failure);
  if (!failure.failed()) ToRtrAndRts(peer, &failure);
  if (failure.failed()) {
    broken_ = failure.message;
    ThrowTransferError(env, failure.code, failure.message);
    return env.Undefined();
  }
  peer_ = peer;
  connected_ = true;
  return env.Undefined();
}

bool RdmaEndpoint::ToRtrAndRts(const Peer& peer, Failure* failure) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = std::min(peer.mtu, portAttr_.active_mtu);
  attr.dest_qp_num = peer.qpn;
  attr.rq_psn = peer.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.dlid = peer.lid;
  attr.ah_attr.sl = 0;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = port_;
  // RoCE (and InfiniBand across subnets) addresses the peer by GID through a global route header.
  if (portAttr_.link_layer == IBV_LINK_LAYER_ETHERNET || peer.lid == 0) {
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = peer.gid;
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(gidIndex_);
    attr.ah_attr.grh.hop_limit = 64;
  }
  int rc = ibv_modify_qp(qp_.get(), &attr,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) {
    *failure = {"rdma_failed", "queue pair INIT→RTR: " + ErrnoText(rc)};
    return false;
  }
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = 14;    // 4.096 µs × 2^14 ≈ 67 ms per try
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;   // retry forever while the peer has no receive posted
  attr.sq_psn = psn_;
  attr.max_rd_atomic = 1;
  rc = ibv_modify_qp(qp_.get(), &attr,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) {
    *failure = {"rdma_failed", "queue pair RTR→RTS: " + ErrnoText(rc)};
    return false;
  }
  return true;
}

// A receive without buffers: an RDMA WRITE WITH IMMEDIATE consumes one and leaves the payload
// where the write put it.
bool RdmaEndpoint::PostReceive(Failure* failure) {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  if (const int rc = ibv_post_recv(qp_.get(), &wr, &bad); rc != 0) {
    *failure = {"rdma_failed", "ibv_post_recv: " + ErrnoText(rc)};
    return false;
  }
  return true;
}

// write(offset, length, remoteOffset, imm) → Promise<{ bytes, seconds }>: [offset, +length) of
// the local range into [remoteOffset, +length) of the peer's, the last piece carrying `imm`.
Napi::Value RdmaEndpoint::Write(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!Usable(env, "write()")) return env.Undefined();
  if (!connected_) {
    Napi::Error::New(env, "write(): connect() this endpoint to its peer first").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (write_.busy) {
    Napi::Error::New(env, "write(): the previous write() is still in flight; await it first")
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (info.Length() < 4 || !info[0].IsNumber() || !info[1].IsNumber() || !info[2].IsNumber() || !info[3].IsNumber()) {
    Napi::TypeError::New(env, "write(offset, length, remoteOffset, imm: number)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  const uint64_t offset = static_cast<uint64_t>(info[0].As<Napi::Number>().DoubleValue());
  const uint64_t length = static_cast<uint64_t>(info[1].As<Napi::Number>().DoubleValue());
  const uint64_t remoteOffset = static_cast<uint64_t>(info[2].As<Napi::Number>().DoubleValue());
  const uint32_t imm = info[3].As<Napi::Number>().Uint32Value();
  if (length == 0 || offset + length > length_ || remoteOffset + length > peer_.length) {
    ThrowTransferError(env, "out_of_range",
                       "write of " + std::to_string(length) + " bytes from " + std::to_string(offset) + " to " +
                           std::to_string(remoteOffset) + " exceeds the local (" + std::to_string(length_) +
                           ") or remote (" + std::to_string(peer_.length) + ") registered range");
    return env.Undefined();
  }
  const uint64_t piece = portAttr_.max_msg_sz > 0 ? std::min<uint64_t>(kMaxPiece, portAttr_.max_msg_sz) : kMaxPiece;
  const uint64_t pieces = (length + piece - 1) / piece;
  if (pieces > kMaxSendWr) {
    Napi::RangeError::New(env, "write(): at most " + std::to_string(piece * kMaxSendWr) + " bytes per call")
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  // Only the last work request is signalled: on an RC queue pair its completion means every
  // earlier one completed too, and the peer sees the immediate only after all the bytes.
  std::vector<ibv_sge> sges(pieces);
  std::vector<ibv_send_wr> wrs(pieces);
  const uint64_t base = reinterpret_cast<uintptr_t>(mr_->addr);
  for (uint64_t i = 0; i < pieces; ++i) {
    const bool last = i + 1 == pieces;
    sges[i].addr = base + offset + i * piece;
    sges[i].length = static_cast<uint32_t>(std::min(piece, length - i * piece));
    sges[i].lkey = mr_->lkey;
    wrs[i].wr_id = i;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wrs[i].send_flags = last ? IBV_SEND_SIGNALED : 0;
    if (last) wrs[i].imm_data = htonl(imm);
    wrs[i].wr.rdma.remote_addr = peer_.address + remoteOffset + i * piece;
    wrs[i].wr.rdma.rkey = peer_.rkey;
    wrs[i].next = last ? nullptr : &wrs[i + 1];
  }
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_.get(), wrs.data(), &bad); rc != 0) {
    // Part of the chain may be on the queue without its signalled end: the queue pair is spent.
    broken_ = "ibv_post_send: " + ErrnoText(rc);
    ThrowTransferError(env, "rdma_failed", broken_);
    return env.Undefined();
  }
  return Begin(env, write_, [this, length]() {
    Outcome outcome;
    ibv_wc wc{};
    if (Await(sendCq_.get(), sendChannel_.get(), &wc, &outcome.failure)) outcome.bytes = static_cast<double>(length);
    return outcome;
  });
}

// nextWrite() → Promise<{ imm }>: the next write the peer completed into this endpoint's range
// (writes that complete before anyone asks wait in the completion queue, up to kRecvDepth).
Napi::Value RdmaEndpoint::NextWrite(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!Usable(env, "nextWrite()")) return env.Undefined();
  if (!connected_) {
    Napi::Error::New(env, "nextWrite(): connect() this endpoint to its peer first").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (receive_.busy) {
    Napi::Error::New(env, "nextWrite(): the previous nextWrite() is still waiting; await it first")
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  return Begin(env, receive_, [this]() {
    Outcome outcome;
    ibv_wc wc{};
    if (!Await(recvCq_.get(), recvChannel_.get(), &wc, &outcome.failure)) return outcome;
    if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || (wc.wc_flags & IBV_WC_WITH_IMM) == 0) {
      outcome.failure = {"protocol", "the peer sent a message instead of an RDMA WRITE WITH IMMEDIATE"};
      return outcome;
    }
    outcome.imm = ntohl(wc.imm_data);
    PostReceive(&outcome.failure);  // keep the receive queue full
    return outcome;
  });
}

// Runs `work` on its own thread and returns a promise that settles, on the JS thread, with its
// outcome. The JS object is kept alive until then.
Napi::Value RdmaEndpoint::Begin(Napi::Env env, Operation& operation, std::function<Outcome()> work) {
  operation.deferred = std::make_unique<Napi::Promise::Deferred>(env);
  Napi::Promise promise = operation.deferred->Promise();
  Napi::ThreadSafeFunction done = Napi::ThreadSafeFunction::New(
      env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}), "monkeytree.rdma", 0, 1);
  operation.busy = true;
  operation.started = std::chrono::steady_clock::now();
  Ref();
  try {
    operation.thread = std::thread([this, &operation, done, work]() mutable {
      auto* finished = new Done{this, &operation, work()};
      if (done.BlockingCall(finished, [](Napi::Env jsEnv, Napi::Function, Done* event) {
            std::unique_ptr<Done> owned(event);
            if (jsEnv != nullptr) event->endpoint->Settle(jsEnv, *event->operation, event->outcome);
          }) != napi_ok) {
        delete finished;
      }
      done.Release();
    });
  } catch (const std::system_error& error) {
    done.Release();
    Settle(env, operation, {{"io", std::string("cannot start a completion thread: ") + error.what()}, 0, 0});
  }
  return promise;
}

void RdmaEndpoint::Settle(Napi::Env env, Operation& operation, const Outcome& outcome) {
  if (operation.thread.joinable()) operation.thread.join();
  operation.busy = false;
  std::unique_ptr<Napi::Promise::Deferred> deferred = std::move(operation.deferred);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - operation.started).count();
  if (outcome.failure.failed()) {
    // After a failed completion the queue pair is in the error state; it cannot be reused.
    if (broken_.empty() && outcome.failure.code != "cancelled") broken_ = outcome.failure.message;
    deferred->Reject(MakeTransferError(env, outcome.failure.code, std::string(operation.name) + ": " +
                                                                      outcome.failure.message));
  } else {
    Napi::Object result = Napi::Object::New(env);
    if (&operation == &receive_) {
      result.Set("imm", Napi::Number::New(env, outcome.imm));
    } else {
      result.Set("bytes", Napi::Number::New(env, outcome.bytes));
      result.Set("seconds", Napi::Number::New(env, seconds));
    }
    deferred->Resolve(result);
  }
  Unref();
}

// Waits, on a worker thread, for one completion: armed notification, then a poll of the queue
// (which closes the race with a completion that arrived before arming), then a bounded wait on
// the channel's descriptor so that close() and the idle timeout are noticed.
bool RdmaEndpoint::Await(ibv_cq* cq, ibv_comp_channel* channel, ibv_wc* wc, Failure* failure) {
  const auto started = std::chrono::steady_clock::now();
  for (;;) {
    if (ibv_req_notify_cq(cq, 0) != 0) {
      *failure = {"rdma_failed", "ibv_req_notify_cq failed"};
      return false;
    }
    const int polled = ibv_poll_cq(cq, 1, wc);
    if (polled < 0) {
      *failure = {"rdma_failed", "ibv_poll_cq failed"};
      return false;
    }
    if (polled == 1) {
      if (wc->status == IBV_WC_SUCCESS) return true;
      *failure = {"rdma_failed", std::string("work completion failed: ") + ibv_wc_status_str(wc->status) +
                                     " (vendor error " + std::to_string(wc->vendor_err) + ")"};
      return false;
    }
    if (closing_) {
      *failure = {"cancelled", "the RDMA endpoint was closed"};
      return false;
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (idleSeconds_ > 0 && waited > idleSeconds_) {
      *failure = {"timeout", "no RDMA completion within " + std::to_string(idleSeconds_) + " s"};
      return false;
    }
    pollfd ready{channel->fd, POLLIN, 0};
    if (poll(&ready, 1, kPollMillis) > 0) {
      ibv_cq* eventCq = nullptr;
      void* eventContext = nullptr;
      // Acknowledged at once: ibv_destroy_cq waits for every event to be acknowledged.
      if (ibv_get_cq_event(channel, &eventCq, &eventContext) == 0) ibv_ack_cq_events(eventCq, 1);
    }
  }
}

}  // namespace

Napi::Function InitRdmaEndpoint(Napi::Env env) { return RdmaEndpoint::Init(env); }

}  // namespace mt
