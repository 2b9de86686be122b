// TEMPORARY during parallel development: factories for codecs whose files are
// being written. Each is removed when its real file lands. Must not ship.
#include "codec/codec.h"

namespace cachegen {
namespace {
class Pending final : public Codec {
 public:
  Pending(CodecId id, const char* name) : id_(id), name_(name) {}
  CodecId id() const override { return id_; }
  std::string_view name() const override { return name_; }
  Result<std::vector<EncodedLevel>> Encode(const ChunkF32&, const CodecConfig&) const override {
    return Status::Unsupported(std::string(name_) + " not yet implemented");
  }
  Status DecodeSection(const SectionContext&, std::span<const uint8_t>, std::span<float>) const override {
    return Status::Unsupported(std::string(name_) + " not yet implemented");
  }
 private:
  CodecId id_;
  const char* name_;
};
}  // namespace


}  // namespace cachegen
