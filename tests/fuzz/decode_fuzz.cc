// Fuzzes the decoder with arbitrary bytes as a container and as a bare frame.
// Frames may reference two model profiles registered at start-up.
//
// Checksums would stop almost every random mutation at the header, so a
// custom mutator (1) now and then replaces the input with a freshly encoded
// valid container or frame from a small random shape and an implemented
// codec, and (2) after most mutations recomputes every checksum it can
// locate, so that mutated headers, indexes and section payloads reach the
// structural checks and the codecs' DecodeSection. The remaining mutations
// keep their stale checksums and exercise the checksum rejection paths.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/profile.h"
#include "common/checksum.h"
#include "format/container.h"
#include "format/frame.h"
#include "fuzz_profiles.h"

using namespace cachegen;

namespace {

// Bound on decoded values of the outputs this fuzzer allocates itself, so
// that a hostile (or resealed) header cannot make it allocate gigabytes:
// callers that allocate bound this themselves (Decoder::Decode(dtype) is
// bounded by the library).
constexpr uint64_t kMaxValues = 1u << 20;

template <typename T>
bool Load(const uint8_t* d, size_t size, uint64_t pos, T* v) {
  if (pos > size || sizeof(T) > size - pos) return false;
  std::memcpy(v, d + pos, sizeof(T));
  return true;
}

template <typename T>
void Store(uint8_t* d, uint64_t pos, T v) {
  std::memcpy(d + pos, &v, sizeof(T));
}

// Recomputes a frame's header and section checksums where they lie in bounds.
void ResealFrame(uint8_t* d, size_t size) {
  uint32_t magic = 0, layers = 0, params = 0;
  uint16_t version = 0;
  if (!Load(d, size, 0, &magic) || magic != kFrameMagic) return;
  if (!Load(d, size, 4, &version) || !Load(d, size, 12, &layers) || !Load(d, size, 36, &params)) return;
  if (layers > 4096 || params > (1u << 16)) return;
  const uint64_t key_bytes = version >= 2 ? 16 : 0;  // a bound frame's chunk key (FORMAT.md)
  const uint64_t table = 40 + key_bytes + uint64_t{params};
  const uint64_t covered = table + 2 * uint64_t{layers} * 24;
  if (covered + 8 > size) return;
  for (uint64_t i = 0; i < 2 * uint64_t{layers}; ++i) {
    uint64_t off = 0;
    uint32_t len = 0;
    Load(d, size, table + i * 24, &off);
    Load(d, size, table + i * 24 + 8, &len);
    if (off <= size && len <= size - off)
      Store<uint64_t>(d, table + i * 24 + 16, Checksum64({d + off, len}));
  }
  Store<uint64_t>(d, covered, Checksum64({d, covered}));
}

void ResealContainer(uint8_t* d, size_t size) {
  uint32_t magic = 0, chunks = 0;
  uint8_t levels = 0;
  if (!Load(d, size, 0, &magic) || magic != kContainerMagic) return;
  if (!Load(d, size, 10, &levels) || !Load(d, size, 36, &chunks)) return;
  const uint64_t entry = 8 + 16 * uint64_t{levels};
  const uint64_t covered = 40 + uint64_t{chunks} * entry;
  if (covered + 8 > size) return;
  for (uint64_t c = 0; c < chunks; ++c)
    for (uint64_t l = 0; l < levels; ++l) {
      uint64_t off = 0, len = 0;
      Load(d, size, 40 + c * entry + 8 + l * 16, &off);
      Load(d, size, 40 + c * entry + 16 + l * 16, &len);
      if (off <= size && len <= size - off) ResealFrame(d + off, len);
    }
  Store<uint64_t>(d, covered, Checksum64({d, covered}));
}

using fuzz::FuzzProfiles;
using fuzz::Profiles;
using fuzz::RandomKV;

// A valid container (or one of its frames) from a small random shape, a
// third of them with a model profile.
std::vector<uint8_t> MakeValid(std::mt19937& rng) {
  const std::vector<std::string> names = CodecNames();
  CodecConfig cfg;
  cfg.codec = names[rng() % names.size()];
  cfg.levels = 1 + rng() % 3;
  cfg.chunk_tokens = rng() % 3 == 0 ? 0 : 1 + rng() % 24;
  cfg.threads = 1;
  if (rng() % 2) cfg.quantizer = CodecConfig::Quantizer::kLloyd;  // cachegen: sections with codebooks
  const uint32_t dims[] = {1, 2, 4, 8, 16, 32};
  KVShape shape{1 + uint32_t(rng() % 3), 1 + uint32_t(rng() % 2), dims[rng() % 6], 1 + uint32_t(rng() % 48)};
  const FuzzProfiles& profiles = Profiles();
  const int q = cfg.quantizer == CodecConfig::Quantizer::kLloyd ? 1 : 0;
  if (rng() % 3 == 0 && profiles.by_quantizer[q]) {
    cfg.codec = "cachegen";
    cfg.profile = profiles.by_quantizer[q];
    shape = profiles.shape;
    shape.tokens = 1 + uint32_t(rng() % 48);
  }
  const DType dtype = static_cast<DType>(rng() % 3);
  const KVTensor src = RandomKV(shape, rng).Converted(dtype);
  auto enc = Encoder::Create(cfg);
  if (!enc.ok()) return {};
  auto bytes = enc->Encode(src.view(), nullptr, rng() % 1000);
  if (!bytes.ok()) return {};  // codec not implemented yet
  if (rng() % 3 == 0) {
    auto dec = Decoder::Open(*bytes, &profiles.set);
    if (!dec.ok()) return {};
    auto frame = dec->Frame(uint32_t(rng() % dec->info().chunks.size()), uint32_t(rng() % dec->info().levels));
    if (!frame.ok()) return {};
    if (rng() % 2 == 0) return std::vector<uint8_t>(frame->begin(), frame->end());
    ChunkKey key;  // a stored frame: bound to a chunk key (format version 2)
    for (auto& b : key.bytes) b = static_cast<uint8_t>(rng());
    auto bound = BindFrameToChunk(*frame, key);
    if (bound.ok()) return std::move(bound).value();
  }
  return std::move(*bytes);
}

// A decode that succeeds writes every output byte, corrupt-but-accepted input
// included: Decoder::Decode(dtype) hands out a tensor it did not zero-fill.
// Two outputs prefilled with different bytes must come out equal.
void CheckEveryByteWritten(const Decoder& dec, uint32_t level) {
  KVTensor a(dec.info().shape, DType::kF16), b(dec.info().shape, DType::kF16);
  std::memset(b.data(), 0xff, b.size_bytes());
  if (dec.Decode(a.view(), level, 1).ok() && dec.Decode(b.view(), level, 1).ok() &&
      std::memcmp(a.data(), b.data(), a.size_bytes()) != 0)
    __builtin_trap();
}

}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937 rng(seed);
  if (size < 16 || rng() % 32 == 0) {
    std::vector<uint8_t> v = MakeValid(rng);
    if (!v.empty() && v.size() <= max_size) {
      std::memcpy(data, v.data(), v.size());
      size = v.size();
      if (rng() % 2 == 0) return size;  // sometimes keep it intact
    }
  }
  size = LLVMFuzzerMutate(data, size, max_size);
  if (rng() % 4 != 0) {
    ResealContainer(data, size);
    ResealFrame(data, size);
  }
  return size;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ProfileSet* profiles = &Profiles().set;
  const std::span<const uint8_t> bytes(data, size);
  if (auto dec = Decoder::Open(bytes, profiles); dec.ok()) {
    const ContainerInfo& info = dec->info();
    if (info.shape.values() <= kMaxValues) {
      KVTensor out(info.shape, DType::kBF16);
      for (uint32_t level = 0; level < info.levels; ++level) (void)dec->Decode(out.view(), level, 1);
      CheckEveryByteWritten(*dec, info.levels - 1);
    }
    // The library's own allocation, whatever the header claims: bounded by
    // DecodeOutputLimit (FORMAT.md, "Decode bound"), which the fuzz run's
    // RSS limit checks.
    (void)dec->Decode(DType::kF32, 0, 2);
  }
  if (auto fi = InspectFrame(bytes); fi.ok() && fi->shape.values() <= kMaxValues) {
    KVTensor out(fi->shape, DType::kF16);
    (void)DecodeFrame(bytes, out.view(), 1, profiles);
    (void)DecodeFrameLayer(bytes, fi->shape.layers - 1, out.view(), profiles);
  }
  return 0;
}
