// Store URI parsing: scheme://authority[/path][?name=value&...].
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cachegen/status.h"

namespace cachegen::store {

struct StoreUri {
  std::string text;       // the URI as given
  std::string scheme;     // lowercase: "file", "mem", "redis", "redis-cluster"
  std::string userinfo;   // before '@' in the authority (e.g. a Redis password), may be empty
  std::string authority;  // host part after "//" and any userinfo, up to the path or query
  std::string path;       // from the '/' after the authority, up to the query
  std::map<std::string, std::string> params;

  // Each typed getter removes the parameter; `CheckNoneLeft` then rejects any
  // the backend did not ask for (so a typo is an error, not a silent default).
  // Sizes take an optional K, M, G or T suffix (powers of 1024).
  Result<uint64_t> TakeSize(const std::string& name, uint64_t default_value) {
    return TakeNumber(name, default_value, true);
  }
  Result<uint64_t> TakeUInt(const std::string& name, uint64_t default_value) {
    return TakeNumber(name, default_value, false);
  }
  Status CheckNoneLeft() const;
  // The URI without the userinfo (for ChunkStore::uri()).
  std::string Redacted() const;

 private:
  Result<uint64_t> TakeNumber(const std::string& name, uint64_t default_value, bool allow_suffix);
};

Result<StoreUri> ParseStoreUri(const std::string& uri);

struct HostPort {
  std::string host;
  uint16_t port = 0;
};
// "h1:p1,h2:p2" (a missing port is `default_port`; IPv6 as "[::1]:6379").
Result<std::vector<HostPort>> ParseHostList(const std::string& authority, uint16_t default_port);

}  // namespace cachegen::store
