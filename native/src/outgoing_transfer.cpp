#include "outgoing_transfer.hpp"

#include <algorithm>
#include <system_error>

#include "crc32c.hpp"
#include "errors.hpp"
#include "net.hpp"
#include "staging_buffer.hpp"
#include "token.hpp"

namespace mt {
namespace {

// Each piece is checksummed right before send() copies it, so the source is read from memory
// once, by the checksum, whose three sequential streams prefetch well, and the kernel's copy
// finds it in this core's caches (checksumming after the send leaves the kernel the cold read,
// which measured slower). About the size of L2, in whole checksum blocks so every piece is
// summed at full speed; quarter-sized pieces cost more in system calls than they saved.
constexpr size_t kPiece = 42 * kCrc32cBlock;

// After a send fails, the receiver has usually said why; wait briefly for that reply.
bool ReadReasonAfterFailure(int fd, Failure* reply) {
  SetReceiveTimeout(fd, 2);
  Failure ignored;
  return wire::RecvReply(fd, reply, &ignored) && reply->failed();
}

}  // namespace

struct OutgoingTransfer::Event {
  OutgoingTransfer* transfer;
  bool done;
  uint64_t bytes;
};

Napi::Function OutgoingTransfer::Init(Napi::Env env) {
  return DefineClass(env, "OutgoingTransfer", {InstanceMethod<&OutgoingTransfer::Cancel>("cancel")});
}

// new OutgoingTransfer(buffer, {offset, length, host, port, token, streams, chunkSize,
//   corruptChunk, progressEvery, idleSeconds, transport: "tcp" | "rdma", rdmaDevice, rdmaPort,
//   gidIndex}, onEvent)
// onEvent("progress", bytesSent) | onEvent("done", code | null, message | null, bytes, seconds)
OutgoingTransfer::OutgoingTransfer(const Napi::CallbackInfo& info)
    : Napi::ObjectWrap<OutgoingTransfer>(info), addon_(&GetAddon(info.Env())) {
  Napi::Env env = info.Env();
  std::shared_ptr<Region> region = StagingBuffer::RegionOf(env, info[0], "buffer");
  if (!region || !ParseOptions(info, &options_)) return;
  if (options_.offset + options_.length > region->size()) {
    ThrowTransferError(env, "out_of_range",
                       "source range [" + std::to_string(options_.offset) + ", " +
                           std::to_string(options_.offset + options_.length) + ") is outside buffer \"" +
                           region->name() + "\" of " + std::to_string(region->size()) + " bytes");
    return;
  }
  pin_ = RegionPin::Acquire(region);
  if (!pin_) {
    ThrowTransferError(env, "buffer_freed", "staging buffer \"" + region->name() + "\" was freed");
    return;
  }
  events_ = Napi::ThreadSafeFunction::New(env, info[2].As<Napi::Function>(), "monkeytree.send", 0, 1);
  started_ = std::chrono::steady_clock::now();
  fds_.assign(options_.streams, -1);
  settled_ = false;
  // Every stream reports exactly once, started or not, so the count is set before any runs.
  running_ = options_.streams;
  Failure startFailure;
  uint32_t started = 0;
  for (; started < options_.streams; ++started) {
    try {
      threads_.emplace_back(&OutgoingTransfer::RunStream, this, started);
    } catch (const std::system_error& error) {
      startFailure = {"io", std::string("cannot start a stream thread: ") + error.what()};
      break;
    }
  }
  for (uint32_t i = started; i < options_.streams; ++i) StreamFinished(i, startFailure, false);
  Ref();  // the JS object must outlive its threads even if the caller drops it
  addon_->Track(this);
}

bool OutgoingTransfer::ParseOptions(const Napi::CallbackInfo& info, Options* options) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || !info[1].IsObject() || !info[2].IsFunction()) {
    Napi::TypeError::New(env, "OutgoingTransfer(buffer, options: object, onEvent: function)")
        .ThrowAsJavaScriptException();
    return false;
  }
  Napi::Object object = info[1].As<Napi::Object>();
  auto number = [&](const char* key) { return object.Get(key).As<Napi::Number>().DoubleValue(); };
  options->host = object.Get("host").As<Napi::String>();
  options->port = static_cast<uint16_t>(number("port"));
  options->offset = static_cast<uint64_t>(number("offset"));
  options->length = static_cast<uint64_t>(number("length"));
  options->streams = static_cast<uint32_t>(number("streams"));
  options->chunkSize = static_cast<uint32_t>(number("chunkSize"));
  options->corruptChunk = static_cast<int64_t>(number("corruptChunk"));
  options->progressEvery = static_cast<uint64_t>(number("progressEvery"));
  options->idleSeconds = number("idleSeconds");
  if (object.Get("transport").As<Napi::String>().Utf8Value() == "rdma") {
    options->transport = wire::Transport::Rdma;
    options->streams = 1;
    options->rdma.device = object.Get("rdmaDevice").As<Napi::String>();
    options->rdma.port = static_cast<uint8_t>(number("rdmaPort"));
    options->rdma.gidIndex = static_cast<int>(number("gidIndex"));
  }
  if (!TokenFromHex(object.Get("token").As<Napi::String>(), &options->token)) {
    Napi::TypeError::New(env, "token must be a 32-character hex string from the destination's grant()")
        .ThrowAsJavaScriptException();
    return false;
  }
  if (options->streams == 0 || options->streams > wire::kMaxStreams || options->chunkSize < wire::kMinChunk ||
      options->chunkSize > wire::kMaxChunk || options->length == 0) {
    Napi::RangeError::New(env, "streams, chunkSize or length out of range").ThrowAsJavaScriptException();
    return false;
  }
  return true;
}

OutgoingTransfer::~OutgoingTransfer() {
  addon_->Untrack(this);
  Close();
}

void OutgoingTransfer::Close() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (settled_) return;
    settled_ = true;
  }
  StopThreads();
  pin_.reset();
  events_.Release();
}

void OutgoingTransfer::StopThreads() {
  cancelled_ = true;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    for (int fd : fds_) Interrupt(fd);
  }
  for (std::thread& thread : threads_)
    if (thread.joinable()) thread.join();
}

Napi::Value OutgoingTransfer::Cancel(const Napi::CallbackInfo& info) {
  cancelled_ = true;
  std::lock_guard<std::mutex> guard(mutex_);
  for (int fd : fds_) Interrupt(fd);
  return info.Env().Undefined();
}

void OutgoingTransfer::RunStream(uint32_t index) {
  Failure failure;
  // RDMA registers the source range before connecting: a host without a usable device fails
  // here, before the grant is touched, so the caller can still send the same ticket over TCP.
  std::unique_ptr<RdmaQueuePair> queuePair;
  if (options_.transport == wire::Transport::Rdma) {
    queuePair =
        RdmaQueuePair::Open(pin_->region().data() + options_.offset, options_.length, false, options_.rdma, &failure);
    if (!queuePair) {
      failure.code = "rdma_unavailable";  // whatever refused, nothing was sent
      StreamFinished(index, failure, false);
      return;
    }
  }
  Fd fd = ConnectTcp(options_.host, options_.port, &failure);
  if (!fd.valid()) {
    StreamFinished(index, failure, false);
    return;
  }
  SetIdleTimeout(fd.get(), options_.idleSeconds);
  {
    std::lock_guard<std::mutex> guard(mutex_);
    fds_[index] = fd.get();
    if (cancelled_) Interrupt(fd.get());
  }
  Failure reply;
  bool fromReceiver = false;
  if (queuePair) {
    SendRdma(fd.get(), *queuePair, &failure, &fromReceiver);
  } else {
    wire::Hello hello;
    hello.streamIndex = static_cast<uint16_t>(index);
    hello.streamCount = static_cast<uint16_t>(options_.streams);
    hello.chunkSize = options_.chunkSize;
    hello.length = options_.length;
    hello.token = options_.token;
    if (wire::SendHello(fd.get(), hello, &failure) && wire::RecvReply(fd.get(), &reply, &failure)) {
      if (reply.failed()) {
        failure = reply;
        fromReceiver = true;
      } else if (SendChunks(fd.get(), &failure) &&
                 wire::SendChunkHeader(fd.get(), {wire::FrameKind::End, 0, 0}, &failure) &&
                 wire::RecvReply(fd.get(), &reply, &failure) && reply.failed()) {
        failure = reply;
        fromReceiver = true;
      }
    }
  }
  // A stalled receiver will not explain itself; anyone else may have said why it stopped us.
  if (failure.failed() && !fromReceiver && !cancelled_ && failure.code != "timeout" &&
      ReadReasonAfterFailure(fd.get(), &reply)) {
    failure = reply;
    fromReceiver = true;
  }
  // The adapter must be done with the source range before the transfer lets go of the buffer.
  queuePair.reset();
  {
    std::lock_guard<std::mutex> guard(mutex_);
    fds_[index] = -1;
  }
  StreamFinished(index, failure, fromReceiver);
}

// One connection carries the handshake and the outcome; the bytes go as one signalled WRITE WITH
// IMMEDIATE per chunk, the immediate being the chunk's CRC32C, at most kSendDepth in flight. Each
// chunk is checksummed right before it is posted, while the adapter is still sending earlier ones.
bool OutgoingTransfer::SendRdma(int fd, RdmaQueuePair& queuePair, Failure* failure, bool* fromReceiver) {
  wire::Hello hello;
  hello.streamCount = 1;
  hello.transport = wire::Transport::Rdma;
  hello.chunkSize = options_.chunkSize;
  hello.length = options_.length;
  hello.token = options_.token;
  Failure reply;
  wire::RdmaPeer peer;
  if (!wire::SendHello(fd, hello, failure) || !wire::SendRdmaPeer(fd, queuePair.Local(), failure) ||
      !wire::RecvReply(fd, &reply, failure))
    return false;
  if (reply.failed()) {
    *failure = reply;
    *fromReceiver = true;
    return false;
  }
  if (!wire::RecvRdmaPeer(fd, &peer, failure) || !queuePair.Connect(peer, 0, failure)) return false;
  const uint8_t* source = pin_->region().data() + options_.offset;
  const uint64_t chunkCount = (options_.length + options_.chunkSize - 1) / options_.chunkSize;
  auto chunkLength = [&](uint64_t index) {
    return static_cast<uint32_t>(std::min<uint64_t>(options_.chunkSize, options_.length - index * options_.chunkSize));
  };
  for (uint64_t posted = 0, completed = 0; completed < chunkCount;) {
    for (; posted < chunkCount && posted - completed < RdmaQueuePair::kSendDepth; ++posted) {
      const uint64_t offset = posted * options_.chunkSize;
      uint32_t crc = Crc32c(0, source + offset, chunkLength(posted));
      // Bytes in flight cannot be altered here without touching the source, so the test-only
      // fault injection flips a bit of the chunk's checksum instead: the receiver sees the same.
      if (static_cast<int64_t>(posted) == options_.corruptChunk) crc ^= 1u;
      if (!queuePair.PostWrite(offset, chunkLength(posted), crc, failure)) return false;
    }
    switch (queuePair.Await(true, fd, cancelled_, options_.idleSeconds, nullptr, failure)) {
      case RdmaWait::Completed:
        ReportProgress(chunkLength(completed++));
        break;
      case RdmaWait::PeerReadable:
        // The receiver only speaks early to refuse; a hang-up reads as a failed reply.
        if (cancelled_ || !wire::RecvReply(fd, &reply, failure)) break;
        *failure = reply.failed() ? reply : Failure{"protocol", "the receiver answered before the last chunk"};
        *fromReceiver = reply.failed();
        return false;
      case RdmaWait::Stopped:
        break;
      case RdmaWait::Failed:
        return false;
    }
    if (cancelled_) {
      *failure = {"cancelled", "the transfer was cancelled"};
      return false;
    }
    if (failure->failed()) return false;
  }
  if (!wire::RecvReply(fd, &reply, failure)) return false;
  if (reply.failed()) {
    *failure = reply;
    *fromReceiver = true;
    return false;
  }
  return true;
}

bool OutgoingTransfer::SendChunks(int fd, Failure* failure) {
  const uint64_t chunkCount = (options_.length + options_.chunkSize - 1) / options_.chunkSize;
  for (;;) {
    if (cancelled_) {
      *failure = {"cancelled", "the transfer was cancelled"};
      return false;
    }
    const uint64_t index = nextChunk_.fetch_add(1);
    if (index >= chunkCount) return true;
    if (!SendChunk(fd, index, failure)) return false;
    if (PeerHasSpoken(fd)) {
      *failure = {"peer_closed", "connection lost: the receiver stopped reading mid-transfer"};
      return false;
    }
  }
}

bool OutgoingTransfer::SendChunk(int fd, uint64_t index, Failure* failure) {
  const uint64_t chunkOffset = index * options_.chunkSize;
  const uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(options_.chunkSize, options_.length - chunkOffset));
  if (!wire::SendChunkHeader(fd, {wire::FrameKind::Chunk, length, chunkOffset}, failure)) return false;
  const uint8_t* source = pin_->region().data() + options_.offset + chunkOffset;
  // Test-only fault injection flips a bit in the middle of the chunk, so the receiver must
  // catch damage that lands after its first pieces already checked out.
  const bool corrupt = static_cast<int64_t>(index) == options_.corruptChunk;
  const size_t corruptAt = length / 2;
  uint32_t crc = 0;
  for (size_t done = 0; done < length;) {
    const size_t n = std::min<size_t>(kPiece, length - done);
    crc = Crc32c(crc, source + done, n);
    if (corrupt && corruptAt >= done && corruptAt < done + n) {
      // The checksum covers the true bytes, the wire carries a copy with one flipped bit, and
      // the source buffer is left untouched.
      std::vector<uint8_t> corrupted(source + done, source + done + n);
      corrupted[corruptAt - done] ^= 0x01;
      if (!SendAll(fd, corrupted.data(), n, true, "chunk payload", failure)) return false;
    } else if (!SendAll(fd, source + done, n, true, "chunk payload", failure)) {
      return false;
    }
    done += n;
  }
  uint8_t trailer[4];
  wire::PutU32(trailer, crc);
  if (!SendAll(fd, trailer, sizeof trailer, false, "chunk checksum", failure)) return false;
  ReportProgress(length);
  return true;
}

void OutgoingTransfer::ReportProgress(uint64_t bytes) {
  // Under the lock so that reports reach JS in increasing order.
  std::lock_guard<std::mutex> guard(mutex_);
  const uint64_t sent = bytesSent_ += bytes;
  if (options_.progressEvery == 0 || sent - bytesReported_ < options_.progressEvery) return;
  bytesReported_ = sent;
  auto* event = new Event{this, false, sent};
  if (events_.NonBlockingCall(event, [](Napi::Env env, Napi::Function callback, Event* event) {
        std::unique_ptr<Event> owned(event);
        if (env == nullptr) return;
        callback.Call({Napi::String::New(env, "progress"), Napi::Number::New(env, static_cast<double>(event->bytes))});
      }) != napi_ok) {
    delete event;
  }
}

void OutgoingTransfer::StreamFinished(uint32_t index, const Failure& failure, bool fromReceiver) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (failure.failed()) {
    Failure& slot = fromReceiver ? receiverFailure_ : localFailure_;
    // A stream that connects after the receiver has already failed the transfer only hears
    // "token_used"; another stream carries the cause.
    if (!slot.failed() || (slot.code == "token_used" && failure.code != "token_used")) slot = failure;
    // One stream failing fails the transfer: stop the others sending, but let them still read
    // the receiver's reply, which may carry the real cause.
    for (uint32_t i = 0; i < fds_.size(); ++i)
      if (i != index) StopSending(fds_[i]);
    nextChunk_.store(UINT64_MAX / 2);
  }
  if (--running_ > 0) return;
  auto* event = new Event{this, true, bytesSent_};
  if (events_.NonBlockingCall(event, [](Napi::Env env, Napi::Function callback, Event* event) {
        std::unique_ptr<Event> owned(event);
        if (env == nullptr) return;
        event->transfer->Settle(env, callback);
      }) != napi_ok) {
    delete event;
  }
}

// On the JS thread, after the last stream reported: release everything, then tell JS.
void OutgoingTransfer::Settle(Napi::Env env, Napi::Function callback) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (settled_) return;
    settled_ = true;
  }
  for (std::thread& thread : threads_)
    if (thread.joinable()) thread.join();
  pin_.reset();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  Failure outcome = cancelled_                  ? Failure{"cancelled", "the transfer was cancelled by the sender"}
                    : receiverFailure_.failed() ? receiverFailure_
                                                : localFailure_;
  if (cancelled_ && !receiverFailure_.failed() && !localFailure_.failed()) outcome = {};
  events_.Release();
  addon_->Untrack(this);
  Unref();
  callback.Call({Napi::String::New(env, "done"), outcome.failed() ? Napi::String::New(env, outcome.code) : env.Null(),
                 outcome.failed() ? Napi::String::New(env, outcome.message) : env.Null(),
                 Napi::Number::New(env, static_cast<double>(options_.length)), Napi::Number::New(env, seconds)});
}

}  // namespace mt
