#include "store/uri.h"

#include <algorithm>
#include <cctype>
#include <limits>

namespace cachegen::store {
namespace {

Result<uint64_t> ParseNumber(const std::string& name, const std::string& value, bool allow_suffix) {
  const auto bad = [&] {
    return Status::InvalidArgument("store URI parameter " + name + "='" + value + "': want a non-negative integer" +
                                   (allow_suffix ? " with an optional K/M/G/T suffix" : ""));
  };
  size_t digits = 0;
  while (digits < value.size() && std::isdigit(static_cast<unsigned char>(value[digits]))) ++digits;
  if (digits == 0 || digits > 19) return bad();
  uint64_t v = std::stoull(value.substr(0, digits));
  const std::string suffix = value.substr(digits);
  int shift = 0;
  if (!suffix.empty()) {
    if (!allow_suffix || suffix.size() != 1) return bad();
    switch (std::toupper(static_cast<unsigned char>(suffix[0]))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: return bad();
    }
  }
  if (shift && v > (std::numeric_limits<uint64_t>::max() >> shift)) return bad();
  return v << shift;
}

}  // namespace

Result<uint64_t> StoreUri::TakeNumber(const std::string& name, uint64_t default_value, bool allow_suffix) {
  const auto it = params.find(name);
  if (it == params.end()) return default_value;
  auto v = ParseNumber(name, it->second, allow_suffix);
  params.erase(it);
  return v;
}

Status StoreUri::CheckNoneLeft() const {
  if (params.empty()) return Status::Ok();
  return Status::InvalidArgument("store URI '" + Redacted() + "': unknown parameter '" + params.begin()->first +
                                 "' for " + scheme + "://");
}

std::string StoreUri::Redacted() const {
  if (userinfo.empty()) return text;
  const size_t at = text.find('@');
  return text.substr(0, text.find("//") + 2) + "***" + text.substr(at);
}

Result<StoreUri> ParseStoreUri(const std::string& text) {
  StoreUri u;
  u.text = text;
  const size_t sep = text.find("://");
  if (sep == std::string::npos || sep == 0)
    return Status::InvalidArgument("store URI '" + text +
                                   "': want scheme://... (file:///path, mem://, redis://host:port, "
                                   "redis-cluster://h1:p1,h2:p2)");
  u.scheme = text.substr(0, sep);
  std::transform(u.scheme.begin(), u.scheme.end(), u.scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string rest = text.substr(sep + 3);
  const size_t q = rest.find('?');
  std::string query;
  if (q != std::string::npos) {
    query = rest.substr(q + 1);
    rest.resize(q);
  }
  const size_t slash = rest.find('/');
  u.authority = rest.substr(0, slash);
  if (slash != std::string::npos) u.path = rest.substr(slash);
  const size_t at = u.authority.rfind('@');
  if (at != std::string::npos) {
    u.userinfo = u.authority.substr(0, at);
    u.authority = u.authority.substr(at + 1);
  }
  for (size_t qpos = 0; qpos <= query.size();) {
    const size_t amp = std::min(query.find('&', qpos), query.size());
    const std::string kv = query.substr(qpos, amp - qpos);
    qpos = amp + 1;
    if (kv.empty()) continue;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::InvalidArgument("store URI '" + u.Redacted() + "': query part '" + kv + "' is not name=value");
    if (!u.params.emplace(kv.substr(0, eq), kv.substr(eq + 1)).second)
      return Status::InvalidArgument("store URI '" + u.Redacted() + "': parameter '" + kv.substr(0, eq) +
                                     "' given twice");
  }
  return u;
}

Result<std::vector<HostPort>> ParseHostList(const std::string& authority, uint16_t default_port) {
  std::vector<HostPort> out;
  size_t pos = 0;
  while (pos <= authority.size()) {
    const size_t comma = std::min(authority.find(',', pos), authority.size());
    const std::string item = authority.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    HostPort hp;
    std::string port;
    if (item.front() == '[') {  // [v6]:port
      const size_t close = item.find(']');
      if (close == std::string::npos) return Status::InvalidArgument("host '" + item + "': unclosed '['");
      hp.host = item.substr(1, close - 1);
      if (close + 1 < item.size()) {
        if (item[close + 1] != ':') return Status::InvalidArgument("host '" + item + "': junk after ']'");
        port = item.substr(close + 2);
      }
    } else {
      const size_t colon = item.rfind(':');
      hp.host = item.substr(0, colon);
      if (colon != std::string::npos) port = item.substr(colon + 1);
    }
    if (hp.host.empty()) return Status::InvalidArgument("host '" + item + "': empty host name");
    hp.port = default_port;
    if (!port.empty() || item.back() == ':') {
      if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
          std::stoul(port) == 0 || std::stoul(port) > 65535)
        return Status::InvalidArgument("host '" + item + "': port must be 1-65535");
      hp.port = static_cast<uint16_t>(std::stoul(port));
    }
    out.push_back(std::move(hp));
  }
  if (out.empty()) return Status::InvalidArgument("no host given");
  return out;
}

}  // namespace cachegen::store
