#include "listener.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <system_error>

#include "crc32c.hpp"
#include "errors.hpp"
#include "staging_buffer.hpp"
#include "token.hpp"

namespace mt {
namespace {

// Bytes received (waiting for all of them, which keeps wake-ups few) before they are checksummed,
// still in this core's caches: about its L2, in whole checksum blocks so every piece is summed
// at full speed. Quarter-sized pieces measured slower, with four streams on two cores as well.
constexpr size_t kPiece = 42 * kCrc32cBlock;
// How long a refused sender's remaining bytes are read so the refusal reaches it, in all.
constexpr std::chrono::seconds kDrain{2};

std::string RangeText(uint64_t offset, uint64_t length) {
  return "[" + std::to_string(offset) + ", " + std::to_string(offset + length) + ")";
}

Failure ChecksumMismatch(uint64_t chunkOffset, uint64_t chunkLength, uint64_t grantOffset, uint64_t grantLength,
                         uint32_t expected, uint32_t actual) {
  char text[96];
  std::snprintf(text, sizeof text, ": sender's CRC32C 0x%08x, received bytes' CRC32C 0x%08x", expected, actual);
  return {"checksum_mismatch", "chunk " + RangeText(chunkOffset, chunkLength) + " of the transfer into " +
                                   RangeText(grantOffset, grantLength) + " arrived corrupted" + text +
                                   "; the range holds partial data, retry with a new grant"};
}

// After an error reply mid-transfer, keep reading until the sender hangs up so the reply is not
// lost to a TCP reset; bounded in all, so a sender trickling bytes cannot hold the thread.
void DrainUntilClosed(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + kDrain;
  StopSending(fd);
  static thread_local std::vector<uint8_t> sink(64 * 1024);
  while (WaitReadable(fd, deadline) && recv(fd, sink.data(), sink.size(), MSG_DONTWAIT) > 0) {
  }
}

// Best effort, from the accept thread: the socket does not block, and a reply that does not fit
// its send buffer is dropped rather than waited for. The caller closes the connection.
void Refuse(int fd, const Failure& reason) {
  Failure ignored;
  wire::SendReply(fd, reason, &ignored);
}

}  // namespace

Napi::Function Listener::Init(Napi::Env env) {
  return DefineClass(env, "Listener",
                     {
                         InstanceAccessor<&Listener::GetPort>("port"),
                         InstanceAccessor<&Listener::GetRdmaUnavailable>("rdmaUnavailable"),
                         InstanceMethod<&Listener::GrantRange>("grant"),
                         InstanceMethod<&Listener::Revoke>("revoke"),
                         InstanceMethod<&Listener::JsClose>("close"),
                     });
}

// new Listener(host, port, idleSeconds, helloSeconds, maxConnections,
//              rdma: { device, port, gidIndex, required } | null,
//              onEvent(token, code | null, message | null, bytes, seconds, "tcp" | "rdma"))
// The TS layer has checked every value's range.
Listener::Listener(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Listener>(info), addon_(&GetAddon(info.Env())) {
  Napi::Env env = info.Env();
  if (info.Length() < 7 || !info[0].IsString() || !info[1].IsNumber() || !info[2].IsNumber() || !info[3].IsNumber() ||
      !info[4].IsNumber() || !info[6].IsFunction()) {
    Napi::TypeError::New(env,
                         "Listener(host: string, port: number, idleSeconds: number, helloSeconds: number, "
                         "maxConnections: number, rdma: object | null, onEvent: function)")
        .ThrowAsJavaScriptException();
    return;
  }
  const std::string host = info[0].As<Napi::String>();
  port_ = static_cast<uint16_t>(info[1].As<Napi::Number>().Uint32Value());
  idleSeconds_ = info[2].As<Napi::Number>().DoubleValue();
  helloSeconds_ = info[3].As<Napi::Number>().DoubleValue();
  maxConnections_ = info[4].As<Napi::Number>().Uint32Value();
  if (!ConfigureRdma(env, info[5])) return;
  Failure failure;
  listenFd_ = ListenTcp(host, &port_, &failure);
  if (!listenFd_.valid()) {
    ThrowTransferError(env, failure.code, failure.message);
    return;
  }
  SetNonBlocking(listenFd_.get(), true);
  events_ = Napi::ThreadSafeFunction::New(env, info[6].As<Napi::Function>(), "monkeytree.listener", 0, 1);
  try {
    acceptThread_ = std::thread(&Listener::AcceptLoop, this);
  } catch (const std::system_error& error) {
    events_.Release();
    ThrowTransferError(env, "io", std::string("cannot start the accept thread: ") + error.what());
    return;
  }
  closed_ = false;
  addon_->Track(this);
}

Listener::~Listener() {
  addon_->Untrack(this);
  Close();
}

void Listener::Close() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (closed_) return;
    closed_ = true;
    Interrupt(listenFd_.get());
    std::vector<std::shared_ptr<Grant>> outstanding;
    for (auto& entry : grants_) outstanding.push_back(entry.second);
    for (auto& grant : outstanding) FinishLocked(grant, {"listener_closed", "the listener was closed"}, -1);
  }
  if (acceptThread_.joinable()) acceptThread_.join();
  // No lock while joining: the serving threads take it on their way out.
  for (Connection& connection : connections_) {
    if (connection.thread.joinable()) connection.thread.join();
  }
  connections_.clear();
  events_.Release();
}

// Offers RDMA only when the device answers now; `required` turns its absence into an error.
bool Listener::ConfigureRdma(Napi::Env env, Napi::Value options) {
  if (!options.IsObject()) {
    rdmaUnavailable_ = "RDMA is turned off for this listener";
    return true;
  }
  Napi::Object object = options.As<Napi::Object>();
  rdma_.device = object.Get("device").As<Napi::String>();
  rdma_.port = static_cast<uint8_t>(object.Get("port").As<Napi::Number>().Uint32Value());
  rdma_.gidIndex = object.Get("gidIndex").As<Napi::Number>().Int32Value();
  Failure failure;
  if (RdmaQueuePair::Probe(rdma_, &failure)) return true;
  if (object.Get("required").ToBoolean()) {
    ThrowTransferError(env, failure.code, failure.message + "; open the listener without `rdma` to use TCP");
    return false;
  }
  rdmaUnavailable_ = failure.message;
  return true;
}

Napi::Value Listener::GetPort(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), port_); }

Napi::Value Listener::GetRdmaUnavailable(const Napi::CallbackInfo& info) {
  return rdmaUnavailable_.empty() ? info.Env().Null() : Napi::String::New(info.Env(), rdmaUnavailable_);
}

// grant(buffer, offset, length) -> token
Napi::Value Listener::GrantRange(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<Region> region = StagingBuffer::RegionOf(env, info[0], "buffer");
  if (!region) return env.Undefined();
  const double offset = info[1].As<Napi::Number>().DoubleValue();
  const double length = info[2].As<Napi::Number>().DoubleValue();
  if (offset < 0 || length <= 0 || offset + length > static_cast<double>(region->size())) {
    ThrowTransferError(env, "out_of_range",
                       "grant range " + RangeText(static_cast<uint64_t>(offset), static_cast<uint64_t>(length)) +
                           " is outside buffer \"" + region->name() + "\" of " + std::to_string(region->size()) +
                           " bytes");
    return env.Undefined();
  }
  auto grant = std::make_shared<Grant>();
  Failure failure;
  if (!NewToken(&grant->token, &failure)) {
    ThrowTransferError(env, failure.code, failure.message);
    return env.Undefined();
  }
  grant->pin = RegionPin::Acquire(region);
  if (!grant->pin) {
    ThrowTransferError(env, "buffer_freed", "staging buffer \"" + region->name() + "\" was freed");
    return env.Undefined();
  }
  grant->offset = static_cast<uint64_t>(offset);
  grant->length = static_cast<uint64_t>(length);
  std::lock_guard<std::mutex> guard(mutex_);
  if (closed_) {
    ThrowTransferError(env, "listener_closed", "the listener was closed; create a new one to grant transfers");
    return env.Undefined();
  }
  grants_[grant->token] = grant;
  return Napi::String::New(env, TokenToHex(grant->token));
}

// revoke(token) -> whether the token was still outstanding
Napi::Value Listener::Revoke(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  wire::Token token{};
  if (!info[0].IsString() || !TokenFromHex(info[0].As<Napi::String>(), &token)) {
    Napi::TypeError::New(env, "token must be a 32-character hex string from grant()").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  std::lock_guard<std::mutex> guard(mutex_);
  auto found = grants_.find(token);
  if (found == grants_.end()) return Napi::Boolean::New(env, false);
  FinishLocked(found->second, {"revoked", "the destination revoked this grant"}, -1);
  return Napi::Boolean::New(env, true);
}

Napi::Value Listener::JsClose(const Napi::CallbackInfo& info) {
  Close();
  return info.Env().Undefined();
}

// Serves the listening socket and every handshake from one thread: a stranger costs a
// descriptor and a few bytes here, never a thread of its own.
void Listener::AcceptLoop() {
  std::vector<pollfd> polled;
  std::vector<std::list<Handshake>::iterator> shaking;
  for (;;) {
    // Every handshake gets the same time, so the ones past their deadline are the oldest.
    const Clock::time_point now = Clock::now();
    while (!handshakes_.empty() && handshakes_.front().deadline <= now) handshakes_.pop_front();
    polled.assign({pollfd{listenFd_.get(), POLLIN, 0}});
    shaking.clear();
    for (auto it = handshakes_.begin(); it != handshakes_.end(); ++it) {
      polled.push_back({it->fd.get(), POLLIN, 0});
      shaking.push_back(it);
    }
    const int timeout = handshakes_.empty() ? -1 : PollTimeout(handshakes_.front().deadline);
    // Close() shuts the listening socket down, which wakes this poll.
    if (poll(polled.data(), polled.size(), timeout) < 0 && errno != EINTR) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // out of memory: back off
    }
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (closed_) break;
    }
    for (size_t i = 0; i < shaking.size(); ++i) {
      if (polled[i + 1].revents != 0 && !Advance(*shaking[i])) handshakes_.erase(shaking[i]);
    }
    if (polled[0].revents != 0) AcceptWaiting();
  }
  handshakes_.clear();
}

// Accepts every connection waiting. At the cap, the oldest connection still owing its hello
// gives way: it had the longest to introduce itself, while a sender writes its hello as soon
// as it has connected, so strangers holding connections open cannot keep a sender out. Only
// when every connection is serving a grant is the new one closed at once.
void Listener::AcceptWaiting() {
  for (;;) {
    Fd fd(accept4(listenFd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      // Out of descriptors: back off instead of spinning until serving threads free some.
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    size_t serving = 0;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      ReapLocked();
      serving = connections_.size();
    }
    if (serving + handshakes_.size() >= maxConnections_) {
      if (handshakes_.empty()) continue;
      handshakes_.pop_front();
    }
    Handshake& handshake = handshakes_.emplace_back();
    handshake.fd = std::move(fd);
    handshake.deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(helloSeconds_));
  }
}

// Reads what has arrived of a handshake; false once the connection is done with here: gone,
// refused (and closed at once by the caller), or handed to a thread of its own.
bool Listener::Advance(Handshake& handshake) {
  const size_t wanted = handshake.received < wire::Hello::kBytes ? wire::Hello::kBytes : handshake.bytes.size();
  uint8_t* next = handshake.bytes.data() + handshake.received;
  const ssize_t n = recv(handshake.fd.get(), next, wanted - handshake.received, 0);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  if (n == 0) return false;
  handshake.received += static_cast<size_t>(n);
  Failure failure;
  if (handshake.received < wire::Hello::kBytes) return true;
  if (handshake.received == wire::Hello::kBytes) {
    if (!wire::ParseHello(handshake.bytes.data(), &handshake.hello, &failure)) {
      Refuse(handshake.fd.get(), failure);
      return false;
    }
    if (handshake.hello.transport == wire::Transport::Rdma) return true;  // its queue pair follows
  } else if (handshake.received < handshake.bytes.size()) {
    return true;
  }
  wire::RdmaPeer peer;
  if (handshake.hello.transport == wire::Transport::Rdma) {
    wire::ParseRdmaPeer(handshake.bytes.data() + wire::Hello::kBytes, &peer);
  }
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (grants_.count(handshake.hello.token) == 0) failure = UnknownTokenLocked(handshake.hello.token);
  }
  if (failure.failed()) {
    Refuse(handshake.fd.get(), failure);
    return false;
  }
  StartServing(std::move(handshake.fd), handshake.hello, peer);
  return false;
}

void Listener::StartServing(Fd fd, const wire::Hello& hello, const wire::RdmaPeer& peer) {
  SetNonBlocking(fd.get(), false);
  std::lock_guard<std::mutex> guard(mutex_);
  Connection& connection = connections_.emplace_back();
  connection.fd = std::move(fd);
  try {
    connection.thread = std::thread(&Listener::Serve, this, &connection, hello, peer);
  } catch (const std::system_error&) {
    connections_.pop_back();  // closes the connection: the sender sees it go
  }
}

void Listener::ReapLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->done.load()) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void Listener::Serve(Connection* connection, wire::Hello hello, wire::RdmaPeer peer) {
  const int fd = connection->fd.get();
  Failure failure;
  std::shared_ptr<Grant> grant;
  std::unique_ptr<RdmaQueuePair> queuePair;
  const bool rdma = hello.transport == wire::Transport::Rdma;
  if (rdma && AcceptRdma(hello, &failure)) queuePair = OpenRdma(hello, peer, &failure);
  if (!failure.failed()) grant = Join(fd, hello, &failure);
  SetIdleTimeout(fd, idleSeconds_);
  Failure ignored;
  if (!grant) {
    // The sender has sent nothing since its hello, so closing at once loses no reply.
    wire::SendReply(fd, failure, &ignored);
  } else {
    if (rdma) {
      // Join accepts exactly the grants OpenRdma registered; anything else is a broken invariant.
      if (!queuePair) failure = {"protocol", "no queue pair was registered for this grant"};
      if (queuePair && ConnectRdma(fd, *queuePair, peer, &failure) && ReceiveRdma(fd, *grant, *queuePair, &failure)) {
        std::lock_guard<std::mutex> guard(mutex_);
        FinishLocked(grant, {}, -1);
      }
      // Destroyed before the outcome is reported: after this the adapter cannot write into the
      // range any more, whatever the sender still has in flight.
      queuePair.reset();
    } else if (wire::SendReply(fd, {}, &failure)) {
      for (;;) {
        wire::ChunkHeader header;
        if (!wire::RecvChunkHeader(fd, &header, &failure)) break;
        if (header.kind == wire::FrameKind::End) {
          EndStream(grant, fd);
          std::lock_guard<std::mutex> guard(mutex_);
          failure = grant->outcome;
          break;
        }
        if (!ReceiveChunk(fd, *grant, header, &failure)) break;
      }
    }
    std::unique_lock<std::mutex> guard(mutex_);
    // A stream that ended cleanly, or whose grant another stream (or a revoke) already settled,
    // only reports; otherwise this stream's failure settles the grant.
    const bool settledElsewhere = !failure.failed() || grant->finished;
    if (!settledElsewhere) FinishLocked(grant, failure, fd);
    const Failure reply = grant->outcome;
    guard.unlock();
    // A dead or stalled sender reads nothing, so it gets no reply.
    const bool senderGone = failure.code == "peer_closed" || failure.code == "timeout";
    if (!senderGone || settledElsewhere) {
      wire::SendReply(fd, reply, &ignored);
      if (reply.failed()) DrainUntilClosed(fd);
    }
    Leave(grant, fd);
  }
  connection->fd.reset();
  connection->done.store(true);
}

// The sender's queue pair, which followed its hello, has been read even when RDMA is refused, so
// the refusal is the next thing on the connection.
bool Listener::AcceptRdma(const wire::Hello& hello, Failure* failure) {
  if (!rdmaUnavailable_.empty()) {
    *failure = {"rdma_unavailable", "the destination does not offer RDMA (" + rdmaUnavailable_ + "); send over TCP"};
    return false;
  }
  if (hello.streamCount != 1) {
    *failure = {"protocol", "an RDMA transfer has exactly one connection"};
    return false;
  }
  return true;
}

// Registers the range of the grant the hello names, before the grant is claimed: a host that
// turns out to have no usable device answers rdma_unavailable with the grant untouched, and the
// sender can still use it over TCP. Without such a grant, Join says what is wrong with the hello.
std::unique_ptr<RdmaQueuePair> Listener::OpenRdma(const wire::Hello& hello, const wire::RdmaPeer& peer,
                                                  Failure* failure) {
  uint8_t* range = nullptr;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto found = grants_.find(hello.token);
    if (found == grants_.end() || found->second->active || found->second->length != hello.length) return nullptr;
    // Copied under the lock, while the grant's pin keeps it mapped. Should the grant be revoked
    // and the buffer freed meanwhile, registering fails or Join does; nothing is written.
    range = found->second->pin->region().data() + found->second->offset;
  }
  if (peer.length != hello.length) {
    *failure = {"protocol", "the sender registered " + std::to_string(peer.length) + " bytes to send " +
                                std::to_string(hello.length)};
    return nullptr;
  }
  std::unique_ptr<RdmaQueuePair> queuePair = RdmaQueuePair::Open(range, hello.length, true, rdma_, failure);
  if (!queuePair) failure->code = "rdma_unavailable";  // whatever refused, the grant is untouched
  return queuePair;
}

// Connects the queue pair to the sender's and tells the sender how to reach it. Receives are
// posted before the reply, so no write can arrive unexpected.
bool Listener::ConnectRdma(int fd, RdmaQueuePair& queuePair, const wire::RdmaPeer& peer, Failure* failure) {
  return queuePair.Connect(peer, RdmaQueuePair::kRecvDepth, failure) && wire::SendReply(fd, {}, failure) &&
         wire::SendRdmaPeer(fd, queuePair.Local(), failure);
}

// Chunk i arrives as the i-th write with immediate (RC delivers in order), carrying the chunk's
// CRC32C; each is verified as soon as it has landed. The connection is watched meanwhile: the
// sender never speaks on it, so anything readable means it hung up or the grant was settled.
bool Listener::ReceiveRdma(int fd, const Grant& grant, RdmaQueuePair& queuePair, Failure* failure) {
  const std::atomic<bool> never{false};
  const uint8_t* range = grant.pin->region().data() + grant.offset;
  for (uint64_t index = 0; index < grant.chunkCount; ++index) {
    uint32_t expected = 0;
    const RdmaWait wait = queuePair.Await(false, fd, never, idleSeconds_, &expected, failure);
    if (wait == RdmaWait::PeerReadable) *failure = {"peer_closed", "connection lost: the sender hung up mid-transfer"};
    if (wait != RdmaWait::Completed) return false;
    const uint64_t offset = index * grant.chunkSize;
    const uint64_t length = std::min<uint64_t>(grant.chunkSize, grant.length - offset);
    const uint32_t actual = Crc32c(0, range + offset, length);
    if (actual != expected) {
      *failure = ChecksumMismatch(offset, length, grant.offset, grant.length, expected, actual);
      return false;
    }
    if (!queuePair.PostReceive(failure)) return false;
  }
  return true;
}

Failure Listener::UnknownTokenLocked(const wire::Token& token) const {
  return consumed_.count(token) != 0 ? Failure{"token_used",
                                               "this token was already used by a finished or revoked transfer; "
                                               "ask the destination for a new grant"}
                                     : Failure{"bad_token",
                                               "the destination knows no grant with this token; "
                                               "use the token returned by its grant()"};
}

std::shared_ptr<Listener::Grant> Listener::Join(int fd, const wire::Hello& hello, Failure* failure) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto found = grants_.find(hello.token);
  if (found == grants_.end()) {
    *failure = UnknownTokenLocked(hello.token);
    return nullptr;
  }
  Grant& grant = *found->second;
  if (hello.length != grant.length) {
    *failure = {"out_of_range", "the sender wants to write " + std::to_string(hello.length) +
                                    " bytes but the grant covers " + std::to_string(grant.length) +
                                    " bytes; send exactly the granted length"};
    return nullptr;
  }
  if (hello.chunkSize < wire::kMinChunk || hello.chunkSize > wire::kMaxChunk || hello.streamCount == 0 ||
      hello.streamCount > wire::kMaxStreams || hello.streamIndex >= hello.streamCount) {
    *failure = {"protocol", "invalid stream parameters in hello"};
    return nullptr;
  }
  if (!grant.active) {
    grant.active = true;
    grant.rdma = hello.transport == wire::Transport::Rdma;
    grant.streamCount = hello.streamCount;
    grant.chunkSize = hello.chunkSize;
    grant.chunkCount = (grant.length + hello.chunkSize - 1) / hello.chunkSize;
    grant.streamsJoined.assign(hello.streamCount, false);
    grant.chunkClaimed.assign(grant.chunkCount, 0);
    grant.started = std::chrono::steady_clock::now();
  } else if (hello.streamCount != grant.streamCount || hello.chunkSize != grant.chunkSize ||
             grant.streamsJoined[hello.streamIndex]) {
    *failure = {"token_used", "this token is already in use by another transfer"};
    return nullptr;
  }
  grant.streamsJoined[hello.streamIndex] = true;
  grant.fds.insert(fd);
  ++grant.threadsInside;
  return found->second;
}

bool Listener::ReceiveChunk(int fd, Grant& grant, const wire::ChunkHeader& header, Failure* failure) {
  const uint64_t index = header.offset / grant.chunkSize;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    const uint64_t expected =
        index < grant.chunkCount ? std::min<uint64_t>(grant.chunkSize, grant.length - header.offset) : 0;
    if (header.kind != wire::FrameKind::Chunk || header.offset % grant.chunkSize != 0 || index >= grant.chunkCount ||
        header.length != expected || grant.chunkClaimed[index] != 0) {
      *failure = {"protocol", "unexpected chunk " + RangeText(header.offset, header.length) + " from the sender"};
      return false;
    }
    grant.chunkClaimed[index] = 1;
  }
  uint8_t* destination = grant.pin->region().data() + grant.offset + header.offset;
  // Each piece is checksummed as soon as it has landed, while the kernel's copy has left it in
  // cache, so verifying costs no second pass over the chunk from memory.
  uint32_t crc = 0;
  for (size_t done = 0; done < header.length;) {
    const size_t n = std::min<size_t>(kPiece, header.length - done);
    if (!RecvAll(fd, destination + done, n, "chunk payload", failure)) {
      failure->message += " (chunk " + RangeText(header.offset, header.length) + ")";
      return false;
    }
    crc = Crc32c(crc, destination + done, n);
    done += n;
  }
  uint8_t trailer[4];
  if (!RecvAll(fd, trailer, sizeof trailer, "chunk checksum", failure)) return false;
  const uint32_t expected = wire::GetU32(trailer);
  std::lock_guard<std::mutex> guard(mutex_);
  if (crc != expected) {
    *failure = ChecksumMismatch(header.offset, header.length, grant.offset, grant.length, expected, crc);
    return false;
  }
  ++grant.chunksVerified;
  return true;
}

// `fd` is the stream that ended: it is left open, because its reply says how the grant ended.
void Listener::EndStream(const std::shared_ptr<Grant>& grant, int fd) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (grant->finished || ++grant->streamsEnded < grant->streamCount) return;
  if (grant->chunksVerified == grant->chunkCount) {
    FinishLocked(grant, {}, -1);
  } else {
    FinishLocked(grant,
                 {"incomplete", "every stream ended but only " + std::to_string(grant->chunksVerified) + " of " +
                                    std::to_string(grant->chunkCount) + " chunks arrived"},
                 fd);
  }
}

void Listener::FinishLocked(const std::shared_ptr<Grant>& grant, const Failure& outcome, int exceptFd) {
  const std::shared_ptr<Grant> keep = grant;  // the map entry erased below may be the last owner
  if (keep->finished) return;
  keep->finished = true;
  keep->outcome = outcome;
  if (outcome.failed()) {
    for (int fd : keep->fds)
      if (fd != exceptFd) Interrupt(fd);
  }
  grants_.erase(keep->token);
  consumed_.insert(keep->token);
  if (keep->threadsInside == 0) EmitLocked(*keep);
}

void Listener::Leave(const std::shared_ptr<Grant>& grant, int fd) {
  std::lock_guard<std::mutex> guard(mutex_);
  grant->fds.erase(fd);
  if (--grant->threadsInside == 0 && grant->finished) EmitLocked(*grant);
}

// Runs once per grant, when it is finished and no thread touches its range any more.
void Listener::EmitLocked(Grant& grant) {
  grant.pin.reset();
  auto* event = new Event();
  event->token = TokenToHex(grant.token);
  event->failure = grant.outcome;
  event->bytes = grant.outcome.failed() ? 0 : static_cast<double>(grant.length);
  event->rdma = grant.rdma;
  if (grant.active)
    event->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - grant.started).count();
  const napi_status status = events_.NonBlockingCall(event, [](Napi::Env env, Napi::Function callback, Event* event) {
    std::unique_ptr<Event> owned(event);
    if (env == nullptr) return;
    callback.Call({Napi::String::New(env, event->token),
                   event->failure.failed() ? Napi::String::New(env, event->failure.code) : env.Null(),
                   event->failure.failed() ? Napi::String::New(env, event->failure.message) : env.Null(),
                   Napi::Number::New(env, event->bytes), Napi::Number::New(env, event->seconds),
                   Napi::String::New(env, event->rdma ? "rdma" : "tcp")});
  });
  if (status != napi_ok) delete event;
}

}  // namespace mt
