// RdmaQueuePair over ibverbs; compiled only with MONKEYTREE_HAVE_IBVERBS.
//
// Every verbs object is owned by a unique_ptr whose deleter destroys it, declared in creation
// order so that destruction runs in reverse: the queue pair goes before the memory
// registration, so once an object is destroyed the adapter can no longer touch the range.
// Completions are awaited on the transfer threads (through a completion channel polled with a
// timeout), never on the JS thread.
#include "rdma.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>

namespace mt {
namespace {

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

constexpr uint32_t kSendDepth = RdmaQueuePair::kSendDepth;
constexpr uint32_t kRecvDepth = RdmaQueuePair::kRecvDepth;
constexpr int kPollMillis = 100;  // how often a waiting thread looks at `stop` and the clock

// The opened device and port, shared by Probe and Open.
struct Device {
  DeviceContext context;
  ibv_port_attr portAttr{};
  ibv_gid gid{};
  int gidIndex = 0;
  std::string name;
};

bool IsIpv4Mapped(const ibv_gid& gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, prefix, sizeof prefix) == 0;
}

bool OpenDevice(const RdmaOptions& options, Device* device, Failure* failure) {
  int count = 0;
  errno = 0;
  DeviceList list(ibv_get_device_list(&count));
  const int listError = errno;
  if (!list || count == 0) {
    const std::string why =
        list ? "ibv_get_device_list returned an empty list" : "ibv_get_device_list: " + ErrnoText(listError);
    *failure = {"rdma_unavailable", "no RDMA device on this host (" + why + ")"};
    return false;
  }
  ibv_device* chosen = nullptr;
  std::string names;
  for (int i = 0; i < count; ++i) {
    const std::string name = ibv_get_device_name(list.get()[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (chosen == nullptr && (options.device.empty() || options.device == name)) chosen = list.get()[i];
  }
  if (chosen == nullptr) {
    *failure = {"rdma_unavailable", "no RDMA device named \"" + options.device + "\" (have: " + names + ")"};
    return false;
  }
  device->name = ibv_get_device_name(chosen);
  const std::string where = device->name + " port " + std::to_string(options.port);
  device->context.reset(ibv_open_device(chosen));
  if (!device->context) {
    const int err = errno;
    *failure = {"rdma_unavailable", "ibv_open_device(" + device->name + "): " + ErrnoText(err)};
    return false;
  }
  if (const int rc = ibv_query_port(device->context.get(), options.port, &device->portAttr); rc != 0) {
    *failure = {"rdma_unavailable", "ibv_query_port(" + where + "): " + ErrnoText(rc)};
    return false;
  }
  if (device->portAttr.state != IBV_PORT_ACTIVE) {
    *failure = {"rdma_unavailable", where + " is not active (" + ibv_port_state_str(device->portAttr.state) + ")"};
    return false;
  }
  device->gidIndex = options.gidIndex < 0 ? 0 : options.gidIndex;
  if (options.gidIndex < 0 && device->portAttr.link_layer == IBV_LINK_LAYER_ETHERNET) {
    ibv_gid gid{};
    for (int i = 0; i < device->portAttr.gid_tbl_len; ++i) {
      if (ibv_query_gid(device->context.get(), options.port, i, &gid) == 0 && IsIpv4Mapped(gid)) {
        device->gidIndex = i;
        break;
      }
    }
  }
  if (ibv_query_gid(device->context.get(), options.port, device->gidIndex, &device->gid) != 0) {
    *failure = {"rdma_unavailable", where + " has no GID at index " + std::to_string(device->gidIndex)};
    return false;
  }
  return true;
}

class VerbsQueuePair final : public RdmaQueuePair {
 public:
  VerbsQueuePair(Device device, uint8_t port) : device_(std::move(device)), port_(port) {}

  bool Create(uint8_t* data, uint64_t length, bool remoteWrite, Failure* failure) {
    ibv_context* context = device_.context.get();
    pd_.reset(ibv_alloc_pd(context));
    if (!pd_) return Fail("rdma_failed", "ibv_alloc_pd(" + device_.name + ")", errno, failure);
    const int access = remoteWrite ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0;
    mr_.reset(ibv_reg_mr(pd_.get(), data, length, access));
    if (!mr_) {
      return Fail("rdma_failed", "ibv_reg_mr of " + std::to_string(length) + " bytes", errno, failure,
                  " (registration pins the pages: check `ulimit -l`)");
    }
    sendChannel_.reset(ibv_create_comp_channel(context));
    recvChannel_.reset(ibv_create_comp_channel(context));
    if (!sendChannel_ || !recvChannel_) return Fail("rdma_failed", "ibv_create_comp_channel", errno, failure);
    // Waiting threads poll() these with a timeout and must never block in ibv_get_cq_event.
    for (ibv_comp_channel* channel : {sendChannel_.get(), recvChannel_.get()})
      fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
    sendCq_.reset(ibv_create_cq(context, kSendDepth, nullptr, sendChannel_.get(), 0));
    recvCq_.reset(ibv_create_cq(context, kRecvDepth, nullptr, recvChannel_.get(), 0));
    if (!sendCq_ || !recvCq_) return Fail("rdma_failed", "ibv_create_cq", errno, failure);
    ibv_qp_init_attr init{};
    init.send_cq = sendCq_.get();
    init.recv_cq = recvCq_.get();
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = kSendDepth;
    init.cap.max_recv_wr = kRecvDepth;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    qp_.reset(ibv_create_qp(pd_.get(), &init));
    if (!qp_) return Fail("rdma_failed", "ibv_create_qp(RC)", errno, failure);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = port_;
    attr.qp_access_flags = remoteWrite ? IBV_ACCESS_REMOTE_WRITE : 0;
    if (const int rc =
            ibv_modify_qp(qp_.get(), &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return Fail("rdma_failed", "queue pair RESET→INIT", rc, failure);
    std::random_device entropy;
    psn_ = entropy() & 0xffffff;
    length_ = length;
    return true;
  }

  wire::RdmaPeer Local() const override {
    wire::RdmaPeer local;
    local.qpn = qp_->qp_num;
    local.psn = psn_;
    local.lid = device_.portAttr.lid;
    local.mtu = static_cast<uint8_t>(device_.portAttr.active_mtu);
    std::memcpy(local.gid.data(), device_.gid.raw, local.gid.size());
    local.address = reinterpret_cast<uintptr_t>(mr_->addr);
    local.rkey = mr_->rkey;
    local.length = length_;
    return local;
  }

  bool Connect(const wire::RdmaPeer& peer, uint32_t receives, Failure* failure) override {
    if (peer.mtu < IBV_MTU_256 || peer.mtu > IBV_MTU_4096 || peer.qpn > 0xffffff || peer.psn > 0xffffff) {
      *failure = {"protocol", "the peer described an invalid RDMA queue pair"};
      return false;
    }
    for (uint32_t i = 0; i < std::min(receives, kRecvDepth); ++i)
      if (!PostReceive(failure)) return false;
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = std::min(static_cast<ibv_mtu>(peer.mtu), device_.portAttr.active_mtu);
    attr.dest_qp_num = peer.qpn;
    attr.rq_psn = peer.psn;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.dlid = peer.lid;
    attr.ah_attr.port_num = port_;
    // RoCE (and InfiniBand across subnets) addresses the peer by GID through a global route header.
    if (device_.portAttr.link_layer == IBV_LINK_LAYER_ETHERNET || peer.lid == 0) {
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, peer.gid.data(), peer.gid.size());
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_.gidIndex);
      attr.ah_attr.grh.hop_limit = 64;
    }
    if (const int rc = ibv_modify_qp(qp_.get(), &attr,
                                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      return Fail("rdma_failed", "queue pair INIT→RTR", rc, failure);
    attr = {};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = 14;  // 4.096 µs × 2^14 ≈ 67 ms per try
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;  // a receiver that has fallen behind (no receive posted) is waited for
    attr.sq_psn = psn_;
    attr.max_rd_atomic = 1;
    if (const int rc = ibv_modify_qp(qp_.get(), &attr,
                                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
      return Fail("rdma_failed", "queue pair RTR→RTS", rc, failure);
    peer_ = peer;
    return true;
  }

  bool PostWrite(uint64_t offset, uint32_t length, uint32_t imm, Failure* failure) override {
    if (offset + length > length_ || offset + length > peer_.length) {
      *failure = {"out_of_range", "RDMA write past the registered range"};
      return false;
    }
    ibv_sge sge{reinterpret_cast<uintptr_t>(mr_->addr) + offset, length, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = peer_.address + offset;
    wr.wr.rdma.rkey = peer_.rkey;
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(qp_.get(), &wr, &bad)) return Fail("rdma_failed", "ibv_post_send", rc, failure);
    return true;
  }

  // A receive without buffers: an RDMA WRITE WITH IMMEDIATE consumes one and leaves the payload
  // where the write put it.
  bool PostReceive(Failure* failure) override {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(qp_.get(), &wr, &bad)) return Fail("rdma_failed", "ibv_post_recv", rc, failure);
    return true;
  }

  // Armed notification, then a poll of the queue (which closes the race with a completion that
  // arrived before arming), then a bounded wait on the channel and the watched descriptor.
  RdmaWait Await(bool sendQueue, int watchFd, const std::atomic<bool>& stop, double idleSeconds, uint32_t* imm,
                 Failure* failure) override {
    ibv_cq* cq = sendQueue ? sendCq_.get() : recvCq_.get();
    ibv_comp_channel* channel = sendQueue ? sendChannel_.get() : recvChannel_.get();
    const auto started = std::chrono::steady_clock::now();
    for (;;) {
      if (ibv_req_notify_cq(cq, 0) != 0) {
        *failure = {"rdma_failed", "ibv_req_notify_cq failed"};
        return RdmaWait::Failed;
      }
      ibv_wc wc{};
      const int polled = ibv_poll_cq(cq, 1, &wc);
      if (polled < 0) {
        *failure = {"rdma_failed", "ibv_poll_cq failed"};
        return RdmaWait::Failed;
      }
      if (polled == 1) {
        if (wc.status != IBV_WC_SUCCESS) {
          *failure = {"rdma_failed", std::string("RDMA work completion failed: ") + ibv_wc_status_str(wc.status) +
                                         " (vendor error " + std::to_string(wc.vendor_err) + ")"};
          return RdmaWait::Failed;
        }
        if (!sendQueue && (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || (wc.wc_flags & IBV_WC_WITH_IMM) == 0)) {
          *failure = {"protocol", "the peer sent a message instead of an RDMA WRITE WITH IMMEDIATE"};
          return RdmaWait::Failed;
        }
        if (imm != nullptr) *imm = ntohl(wc.imm_data);
        return RdmaWait::Completed;
      }
      if (stop) return RdmaWait::Stopped;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (idleSeconds > 0 && waited > idleSeconds) {
        *failure = {"timeout", "no RDMA completion within the idle timeout; the peer is stalled or unreachable"};
        return RdmaWait::Failed;
      }
      pollfd ready[2] = {{channel->fd, POLLIN, 0}, {watchFd, POLLIN, 0}};
      if (poll(ready, watchFd >= 0 ? 2 : 1, kPollMillis) <= 0) continue;
      if (ready[0].revents != 0) {
        ibv_cq* eventCq = nullptr;
        void* eventContext = nullptr;
        // Acknowledged at once: ibv_destroy_cq waits for every event to be acknowledged.
        if (ibv_get_cq_event(channel, &eventCq, &eventContext) == 0) ibv_ack_cq_events(eventCq, 1);
      }
      if (watchFd >= 0 && ready[1].revents != 0) return RdmaWait::PeerReadable;
    }
  }

 private:
  static bool Fail(const char* code, const std::string& what, int err, Failure* failure, const std::string& hint = "") {
    *failure = {code, what + ": " + ErrnoText(err) + hint};
    return false;
  }

  Device device_;
  uint8_t port_;
  uint32_t psn_ = 0;
  uint64_t length_ = 0;
  wire::RdmaPeer peer_;
  // In creation order, so that they are destroyed in reverse (the device context, in device_,
  // outlives them all).
  ProtectionDomain pd_;
  MemoryRegion mr_;
  CompletionChannel sendChannel_;
  CompletionChannel recvChannel_;
  CompletionQueue sendCq_;
  CompletionQueue recvCq_;
  QueuePair qp_;
};

}  // namespace

bool RdmaQueuePair::Probe(const RdmaOptions& options, Failure* failure) {
  Device device;
  return OpenDevice(options, &device, failure);
}

std::unique_ptr<RdmaQueuePair> RdmaQueuePair::Open(uint8_t* data, uint64_t length, bool remoteWrite,
                                                   const RdmaOptions& options, Failure* failure) {
  Device device;
  if (!OpenDevice(options, &device, failure)) return nullptr;
  auto queuePair = std::make_unique<VerbsQueuePair>(std::move(device), options.port);
  if (!queuePair->Create(data, length, remoteWrite, failure)) return nullptr;
  return queuePair;
}

}  // namespace mt
