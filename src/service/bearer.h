// Bearer-token authentication shared by the chunk service and llama-serve.
#pragma once

#include <string_view>

namespace cachegen {

// Whether an Authorization header value is "Bearer <token>". The token is
// compared in time that does not depend on where it differs, so that a
// client cannot find it a byte at a time by timing answers.
inline bool BearerTokenMatches(std::string_view authorization, std::string_view token) {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() != kBearer.size() + token.size() || !authorization.starts_with(kBearer)) return false;
  const std::string_view given = authorization.substr(kBearer.size());
  unsigned char differ = 0;
  for (size_t i = 0; i < token.size(); ++i) differ |= static_cast<unsigned char>(given[i] ^ token[i]);
  return differ == 0;
}

}  // namespace cachegen
