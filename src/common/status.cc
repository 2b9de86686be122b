#include "cachegen/status.h"

namespace cachegen {

std::string Status::ToString() const {
  const char* prefix = "ok";
  switch (code_) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: prefix = "invalid argument"; break;
    case StatusCode::kCorrupt: prefix = "corrupt"; break;
    case StatusCode::kUnsupported: prefix = "unsupported"; break;
    case StatusCode::kNotFound: prefix = "not found"; break;
    case StatusCode::kIOError: prefix = "I/O error"; break;
    case StatusCode::kInternal: prefix = "internal error"; break;
    case StatusCode::kUnavailable: prefix = "unavailable"; break;
  }
  return std::string(prefix) + ": " + message_;
}

}  // namespace cachegen
