#pragma once
// Blocking TCP helpers for the transfer threads. Every call reports failures as a Failure
// (code + actionable message) instead of errno, so threads can hand them to JS unchanged.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "errors.hpp"

namespace mt {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

// Bound, listening socket on host:port (port 0 picks one); returns the bound port in *port.
Fd ListenTcp(const std::string& host, uint16_t* port, Failure* failure);
Fd ConnectTcp(const std::string& host, uint16_t port, Failure* failure);

// Send/receive exactly `length` bytes. On failure `failure` names `what` (e.g. "chunk payload");
// a wait longer than the socket's timeout (SetIdleTimeout) fails with code "timeout".
bool SendAll(int fd, const void* data, size_t length, bool more, const char* what, Failure* failure);
bool RecvAll(int fd, void* data, size_t length, const char* what, Failure* failure);

// Bounds how long one blocking receive waits (0 = forever).
void SetReceiveTimeout(int fd, double seconds);
void SetNonBlocking(int fd, bool on);
// Waits until fd is readable (or closed by the peer); false once `deadline` has passed.
bool WaitReadable(int fd, std::chrono::steady_clock::time_point deadline);
// Milliseconds until `deadline` for poll(), rounded up so a wake-up never comes early; 0 once past.
int PollTimeout(std::chrono::steady_clock::time_point deadline);
// Bounds how long one blocking send or receive waits without progress (0 = forever).
void SetIdleTimeout(int fd, double seconds);

// True when the peer has sent something (or closed) that has not been read yet.
bool PeerHasSpoken(int fd);

// Wakes any thread blocked on fd without closing it (the owning thread closes).
void Interrupt(int fd);
// Ends our direction only: a blocked send wakes, but a reply already on its way can still be read.
void StopSending(int fd);

}  // namespace mt
