#pragma once
// Grant tokens: 16 random bytes, written as 32 lowercase hex characters in JS.
#include <string>

#include "wire.hpp"

namespace mt {

bool NewToken(wire::Token* token, Failure* failure);
std::string TokenToHex(const wire::Token& token);
bool TokenFromHex(const std::string& hex, wire::Token* token);

}  // namespace mt
