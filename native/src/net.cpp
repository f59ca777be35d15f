#include "net.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mt {

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

namespace {

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

bool Resolve(const std::string& host, uint16_t port, bool passive, AddrInfoList* list, Failure* failure) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list->head);
  if (rc != 0) {
    *failure = {"connect_failed", "cannot resolve host \"" + host + "\": " + gai_strerror(rc)};
    return false;
  }
  return true;
}

// Tries each resolved address in turn, opening a socket and handing it to `use` (bind, connect);
// returns the first socket `use` accepts, or an invalid one with the last failure's errno.
template <typename Use>
Fd FirstSocket(const AddrInfoList& list, int* lastErrno, Use use) {
  for (addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.valid() && use(fd.get(), *ai)) return fd;
    *lastErrno = errno;
  }
  return Fd();
}

void Tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

timeval ToTimeval(double seconds) {
  const auto whole = static_cast<time_t>(seconds);
  return timeval{whole, static_cast<suseconds_t>((seconds - static_cast<double>(whole)) * 1e6)};
}

Failure Timeout(const char* doing, const char* what) {
  return {"timeout", std::string("no progress ") + doing + " " + what +
                         " within the idle timeout; the peer is stalled or unreachable"};
}

}  // namespace

Fd ListenTcp(const std::string& host, uint16_t* port, Failure* failure) {
  AddrInfoList list;
  if (!Resolve(host, *port, true, &list, failure)) return Fd();
  int lastErrno = 0;
  Fd fd = FirstSocket(list, &lastErrno, [](int s, const addrinfo& ai) {
    const int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    return bind(s, ai.ai_addr, ai.ai_addrlen) == 0 && listen(s, 128) == 0;
  });
  if (!fd.valid()) {
    *failure = {"listen_failed", "cannot listen on " + host + ":" + std::to_string(*port) + ": " +
                                     ErrnoText(lastErrno) + "; choose another host or port"};
    return Fd();
  }
  sockaddr_storage bound{};
  socklen_t boundLength = sizeof bound;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &boundLength);
  *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

Fd ConnectTcp(const std::string& host, uint16_t port, Failure* failure) {
  AddrInfoList list;
  if (!Resolve(host, port, false, &list, failure)) return Fd();
  int lastErrno = 0;
  Fd fd = FirstSocket(list, &lastErrno,
                      [](int s, const addrinfo& ai) { return connect(s, ai.ai_addr, ai.ai_addrlen) == 0; });
  if (!fd.valid()) {
    *failure = {"connect_failed", "cannot connect to " + host + ":" + std::to_string(port) + ": " +
                                      ErrnoText(lastErrno) + "; is the destination listener running?"};
    return Fd();
  }
  Tune(fd.get());
  return fd;
}

bool SendAll(int fd, const void* data, size_t length, bool more, const char* what, Failure* failure) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (length > 0) {
    const ssize_t n = send(fd, p, length, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT) {
        *failure = Timeout("sending", what);
        return false;
      }
      *failure = {"peer_closed", std::string("connection lost while sending ") + what + ": " + ErrnoText(errno)};
      return false;
    }
    p += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t length, const char* what, Failure* failure) {
  auto* p = static_cast<uint8_t*>(data);
  while (length > 0) {
    const ssize_t n = recv(fd, p, length, MSG_WAITALL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT)) {
      *failure = Timeout("receiving", what);
      return false;
    }
    if (n <= 0) {
      *failure = {"peer_closed", std::string("connection lost while receiving ") + what + ": " +
                                     (n == 0 ? std::string("peer closed the connection") : ErrnoText(errno))};
      return false;
    }
    p += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

void SetReceiveTimeout(int fd, double seconds) {
  const timeval timeout = ToTimeval(seconds);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
}

void SetNonBlocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK);
}

int PollTimeout(std::chrono::steady_clock::time_point deadline) {
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

bool WaitReadable(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    pollfd polled{fd, POLLIN, 0};
    const int rc = poll(&polled, 1, PollTimeout(deadline));
    if (rc > 0) return true;
    if (rc == 0 || errno != EINTR) return false;
  }
}

void SetIdleTimeout(int fd, double seconds) {
  const timeval timeout = ToTimeval(seconds);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  // A send timeout counts from each send() call, and every call that queues a few bytes starts
  // it again; on a cut link the kernel keeps retransmitting for many minutes. Bytes the peer has
  // not acknowledged for the idle timeout end the connection instead.
  const unsigned int unacknowledgedMs = static_cast<unsigned int>(std::min(seconds * 1000.0, 4.0e9));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacknowledgedMs, sizeof unacknowledgedMs);
}

bool PeerHasSpoken(int fd) {
  uint8_t byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void Interrupt(int fd) {
  if (fd >= 0) shutdown(fd, SHUT_RDWR);
}

void StopSending(int fd) {
  if (fd >= 0) shutdown(fd, SHUT_WR);
}

}  // namespace mt
