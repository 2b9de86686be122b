#include <array>
#include <memory>
#include <string>

#include "codec/codec.h"

namespace cachegen {
namespace {

struct Registry {
  std::vector<std::unique_ptr<Codec>> codecs;
  Registry() {
    codecs.push_back(MakeCacheGenCodec());
    codecs.push_back(MakeFp16Codec());
    codecs.push_back(MakeFp16ZstdCodec());
    codecs.push_back(MakeQ8Codec());
    codecs.push_back(MakeQ4Codec());
    codecs.push_back(MakeKivi2Codec());
    codecs.push_back(MakeKivi4Codec());
    codecs.push_back(MakeCacheGenRefCodec());
  }
};

const Registry& TheRegistry() {
  static const Registry registry;
  return registry;
}

}  // namespace

std::vector<std::string> CodecNames() {
  std::vector<std::string> names;
  for (const auto& c : TheRegistry().codecs) names.emplace_back(c->name());
  return names;
}

Result<const Codec*> CodecByName(std::string_view name) {
  for (const auto& c : TheRegistry().codecs)
    if (c->name() == name) return c.get();
  std::string known;
  for (const auto& n : CodecNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::InvalidArgument("unknown codec '" + std::string(name) + "' (known: " + known + ")");
}

Result<const Codec*> CodecById(uint8_t id) {
  for (const auto& c : TheRegistry().codecs)
    if (static_cast<uint8_t>(c->id()) == id) return c.get();
  return Status::Unsupported("unknown codec id " + std::to_string(id));
}

Result<const Codec*> FrameCodec(uint8_t id, std::span<const uint8_t> params) {
  CG_ASSIGN_OR_RETURN(const Codec* codec, CodecById(id));
  if (codec->id() != CodecId::kCacheGen && !params.empty())
    return Status::Corrupt(std::string(codec->name()) + " frame: codec params must be empty, got " +
                           std::to_string(params.size()) + " bytes");
  return codec;
}

}  // namespace cachegen
