// Encoder: validates the config and input, splits a context into chunks,
// runs the codec on each and wraps the results in frames and a container.
#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>

#include "cachegen/codec.h"
#include "cachegen/profile.h"
#include "codec/cachegen/profile_data.h"
#include "codec/codec.h"
#include "common/parallel.h"
#include "format/container.h"
#include "format/frame.h"

namespace cachegen {
namespace {

constexpr uint32_t kMaxLevels = 8;

bool BadTarget(double v) { return !std::isfinite(v) || v < 0; }

// How many levels the config asks for.
uint32_t RequestedLevels(const CodecConfig& c) {
  return c.level_bits.empty() ? c.levels : static_cast<uint32_t>(c.level_bits.size());
}

}  // namespace

// What one chunk encode allocates that the next can reuse: the gathered f32
// chunk and the codec's own working memory. Fresh memory of this size (tens
// of MB for a production-shaped chunk) is mapped and faulted in page by page,
// which took about as long as the encode itself.
struct ChunkScratch {
  std::unique_ptr<float[]> data;  // not value-initialised: every row is written
  size_t capacity = 0;
  std::unique_ptr<EncodeScratch> codec;
};

class EncoderScratchPool {
 public:
  std::unique_ptr<ChunkScratch> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return std::make_unique<ChunkScratch>();
    std::unique_ptr<ChunkScratch> s = std::move(free_.back());
    free_.pop_back();
    return s;
  }
  void Give(std::unique_ptr<ChunkScratch> s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(s));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<ChunkScratch>> free_;
};

Encoder::Encoder(CodecConfig config)
    : config_(std::move(config)), scratch_(std::make_shared<EncoderScratchPool>()) {}

Result<Encoder> Encoder::Create(const CodecConfig& config) {
  auto codec = CodecByName(config.codec);
  if (!codec.ok()) return codec.status();
  if (BadTarget(config.bits_per_value) || BadTarget(config.snr_db) || BadTarget(config.max_rel_error) ||
      BadTarget(config.max_kl))
    return Status::InvalidArgument("rate targets must be finite and non-negative");
  const int targets = (config.bits_per_value > 0) + (config.snr_db > 0) + (config.max_rel_error > 0) +
                      (config.max_kl > 0);
  if (targets > 1)
    return Status::InvalidArgument("set at most one of bits_per_value, snr_db, max_rel_error, max_kl");
  if (config.max_kl > 0 && !config.level_bits.empty())
    return Status::InvalidArgument("level_bits is a bits target: not with max_kl");
  if (config.max_kl > 0 && config.codec != "cachegen")
    return Status::InvalidArgument("a KL target is for the cachegen codec only, not " + config.codec);
  if (config.max_kl > 0 && (!config.profile || config.profile->data().sensitivity.empty()))
    return Status::InvalidArgument(
        "a KL target needs a model profile with measured sensitivities (cachegen profile train measures them)");
  if (config.level_bits.size() > kMaxLevels)
    return Status::InvalidArgument("level_bits has " + std::to_string(config.level_bits.size()) +
                                   " entries; at most 8 levels");
  for (double b : config.level_bits)
    if (!std::isfinite(b) || b <= 0) return Status::InvalidArgument("level_bits entries must be finite and > 0");
  if (config.profile && config.codec != "cachegen")
    return Status::InvalidArgument("a model profile is for the cachegen codec only, not " + config.codec);
  const uint32_t levels = RequestedLevels(config);
  if (levels < 1 || levels > kMaxLevels)
    return Status::InvalidArgument("levels must be in 1..8, got " + std::to_string(levels));
  if (!std::isfinite(config.layer_slope) || config.layer_slope < 0)
    return Status::InvalidArgument("layer_slope must be finite and non-negative");
  if (!std::isfinite(config.key_step_scale) || config.key_step_scale <= 0 || config.key_step_scale > 1e3)
    return Status::InvalidArgument("key_step_scale must be in (0, 1000]");
  if (!std::isfinite(config.recent_step_scale) || config.recent_step_scale < 0 || config.recent_step_scale > 1)
    return Status::InvalidArgument("recent_step_scale must be in [0, 1]");
  return Encoder(config);
}

namespace {

// EncodeChunk's body; `check_finite` is false when the caller (Encode) has
// already scanned the whole context, so the scan is not repeated per chunk.
Result<std::vector<std::vector<uint8_t>>> EncodeChunkImpl(const CodecConfig& config, const KVView& chunk,
                                                          uint32_t token_start, uint32_t context_tokens,
                                                          std::vector<FrameStats>* stats, bool check_finite,
                                                          EncoderScratchPool* pool) {
  const KVShape& shape = chunk.shape();
  CG_RETURN_IF_ERROR(shape.Validate());
  if (uint64_t{token_start} + shape.tokens > UINT32_MAX)
    return Status::InvalidArgument("token_start + tokens overflows 32 bits");
  if (context_tokens == 0) context_tokens = token_start + shape.tokens;
  if (context_tokens < token_start + shape.tokens)
    return Status::InvalidArgument("context_tokens is less than the chunk's end");
  if (check_finite) CG_RETURN_IF_ERROR(CheckFinite(chunk));
  CG_ASSIGN_OR_RETURN(const Codec* codec, CodecByName(config.codec));

  // Gather the chunk as contiguous f32 [layer][K|V][token][channel].
  const uint64_t row = shape.channels();
  struct Lease {
    EncoderScratchPool* pool;
    std::unique_ptr<ChunkScratch> s;
    ~Lease() { pool->Give(std::move(s)); }
  } lease{pool, pool->Take()};
  ChunkScratch& scratch = *lease.s;
  if (scratch.capacity < shape.values()) {
    scratch.data.reset();
    scratch.data.reset(new float[shape.values()]);
    scratch.capacity = shape.values();
  }
  float* data = scratch.data.get();
  for (uint32_t l = 0; l < shape.layers; ++l)
    for (KV kv : {KV::kKey, KV::kValue})
      for (uint32_t t = 0; t < shape.tokens; ++t)
        chunk.ReadRow(l, kv, t, &data[((uint64_t{l} * 2 + static_cast<uint8_t>(kv)) * shape.tokens + t) * row]);
  ChunkF32 in;
  in.shape = shape;
  in.source_dtype = chunk.dtype();
  in.token_start = token_start;
  in.context_tokens = context_tokens;
  in.data = std::span<const float>(data, shape.values());
  in.scratch = &scratch.codec;

  CG_ASSIGN_OR_RETURN(std::vector<EncodedLevel> levels, codec->Encode(in, config));
  if (levels.empty() || levels.size() > RequestedLevels(config))
    return Status::Internal(std::string(codec->name()) + " returned " + std::to_string(levels.size()) +
                            " levels");
  std::vector<std::vector<uint8_t>> frames;
  const double section_values = double(shape.tokens) * double(row);
  for (uint32_t lv = 0; lv < levels.size(); ++lv) {
    EncodedLevel& level = levels[lv];
    if (level.sections.size() != 2 * size_t{shape.layers})
      return Status::Internal(std::string(codec->name()) + " returned a wrong section count");
    if (level.params.size() > (1u << 16)) return Status::Internal("codec params too large");
    FrameStats fs;
    fs.level = lv;
    fs.predicted_kl = level.predicted_kl;
    fs.token_start = token_start;
    fs.tokens = shape.tokens;
    for (uint32_t l = 0; l < shape.layers; ++l) {
      const EncodedSection& k = level.sections[2 * l];
      const EncodedSection& v = level.sections[2 * l + 1];
      for (const EncodedSection* s : {&k, &v}) {
        if (s->bytes.size() > UINT32_MAX || s->side_bytes > s->bytes.size())
          return Status::Internal(std::string(codec->name()) + " returned an oversized section");
        fs.side_bytes += s->side_bytes;
        fs.sections_unlike_profile += s->unlike_profile;
      }
      fs.layer_bits_k.push_back(double(k.bytes.size()) * 8 / section_values);
      fs.layer_bits_v.push_back(double(v.bytes.size()) * 8 / section_values);
    }
    FrameHeader h;
    h.codec = codec->id();
    h.dtype = chunk.dtype();
    h.level = lv;
    h.shape = shape;
    h.token_start = token_start;
    h.context_tokens = context_tokens;
    h.params = std::move(level.params);
    frames.push_back(WriteFrame(h, level.sections));
    fs.bytes = frames.back().size();
    fs.bits_per_value = double(fs.bytes) * 8 / double(shape.values());
    if (stats) stats->push_back(std::move(fs));
  }
  return frames;
}

}  // namespace

Result<std::vector<std::vector<uint8_t>>> Encoder::EncodeChunk(const KVView& chunk, uint32_t token_start,
                                                               uint32_t context_tokens,
                                                               std::vector<FrameStats>* stats) const {
  return EncodeChunkImpl(config_, chunk, token_start, context_tokens, stats, /*check_finite=*/true, scratch_.get());
}

Result<std::vector<uint8_t>> Encoder::Encode(const KVView& kv, EncodeStats* stats, uint32_t token_start) const {
  const KVShape& shape = kv.shape();
  CG_RETURN_IF_ERROR(shape.Validate());
  if (uint64_t{token_start} + shape.tokens > UINT32_MAX)
    return Status::InvalidArgument("token_start + tokens overflows 32 bits");
  // Checked once over the whole view so that the error names absolute positions.
  CG_RETURN_IF_ERROR(CheckFinite(kv));
  const uint32_t chunk_tokens =
      config_.chunk_tokens == 0 ? shape.tokens : std::min(config_.chunk_tokens, shape.tokens);
  const uint32_t chunks = (shape.tokens + chunk_tokens - 1) / chunk_tokens;
  const uint32_t context_tokens = token_start + shape.tokens;

  std::vector<std::vector<std::vector<uint8_t>>> frames(chunks);
  std::vector<std::vector<FrameStats>> chunk_stats(chunks);
  CG_RETURN_IF_ERROR(ParallelFor(chunks, config_.threads, [&](uint64_t c) -> Status {
    const uint32_t begin = static_cast<uint32_t>(c) * chunk_tokens;
    const uint32_t n = std::min(chunk_tokens, shape.tokens - begin);
    CG_ASSIGN_OR_RETURN(frames[c], EncodeChunkImpl(config_, kv.Tokens(begin, n), token_start + begin,
                                                   context_tokens, &chunk_stats[c], /*check_finite=*/false,
                                                   scratch_.get()));
    return Status::Ok();
  }));
  const size_t levels = frames[0].size();
  for (const auto& f : frames)
    if (f.size() != levels) return Status::Internal("chunks were encoded at different level counts");

  ContainerInfo info;
  info.format_version = kContainerFormatVersion;
  info.codec = config_.codec;
  info.dtype = kv.dtype();
  info.shape = shape;
  info.token_start = token_start;
  info.levels = static_cast<uint32_t>(levels);
  info.chunk_tokens = chunk_tokens;
  std::vector<uint8_t> out = WriteContainer(info, frames);

  if (stats) {
    *stats = EncodeStats();
    stats->input_values = shape.values();
    stats->container_bytes = out.size();
    std::vector<uint64_t> level_bytes(levels, 0);
    uint64_t frame_bytes = 0;
    for (uint32_t c = 0; c < chunks; ++c)
      for (FrameStats& fs : chunk_stats[c]) {
        fs.chunk = c;
        level_bytes[fs.level] += fs.bytes;
        frame_bytes += fs.bytes;
        stats->frames.push_back(std::move(fs));
      }
    // Container header and index bytes, spread over levels by their share.
    const double overhead = double(out.size() - frame_bytes);
    // Predicted KL per level: token-weighted over chunks (a chunk's error
    // moves the next-token distributions in proportion to its share of the
    // attended tokens, as the sensitivities were measured on whole contexts).
    stats->level_predicted_kl.assign(levels, 0);
    for (const FrameStats& fs : stats->frames) {
      double& p = stats->level_predicted_kl[fs.level];
      p = (p < 0 || fs.predicted_kl < 0) ? -1 : p + fs.predicted_kl * fs.tokens / double(shape.tokens);
    }
    for (size_t l = 0; l < levels; ++l) {
      const double share = frame_bytes ? double(level_bytes[l]) / double(frame_bytes) : 1.0 / double(levels);
      stats->level_bits_per_value.push_back((double(level_bytes[l]) + overhead * share) * 8 /
                                            double(shape.values()));
    }
  }
  return out;
}

}  // namespace cachegen
