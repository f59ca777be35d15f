#include "token.hpp"

#include <sys/random.h>

#include <cerrno>

namespace mt {

bool NewToken(wire::Token* token, Failure* failure) {
  size_t filled = 0;
  while (filled < token->size()) {
    const ssize_t n = getrandom(token->data() + filled, token->size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *failure = {"io", "getrandom failed: " + ErrnoText(errno)};
      return false;
    }
    filled += static_cast<size_t>(n);
  }
  return true;
}

std::string TokenToHex(const wire::Token& token) {
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t byte : token) {
    hex += kDigits[byte >> 4];
    hex += kDigits[byte & 0xF];
  }
  return hex;
}

bool TokenFromHex(const std::string& hex, wire::Token* token) {
  if (hex.size() != 2 * token->size()) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < token->size(); ++i) {
    const int high = nibble(hex[2 * i]);
    const int low = nibble(hex[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    (*token)[i] = static_cast<uint8_t>(high << 4 | low);
  }
  return true;
}

}  // namespace mt
