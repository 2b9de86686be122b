#include "codec/cachegen/gpu_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>

#include "codec/cachegen/gpu_groups.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/profile_decode_tables.h"
#include "codec/cachegen/rope.h"
#include "codec/cachegen/section_coder.h"
#include "codec/cachegen/section_format.h"
#include "codec/rans.h"
#include "common/bytes.h"
#include "common/parallel.h"
#include "format/container.h"
#include "format/frame.h"

namespace cachegen::gpu {
namespace {

// The cachegen params and section flags (FORMAT.md "Frame parameters",
// "Section payload") this decoder implements: all of version 2's.
constexpr uint8_t kKnownParamsFlags = kParamsRotate | kParamsRope | kParamsProfile;
constexpr uint8_t kKnownSectionFlags = kSectionDelta | kSectionProfileStats | kSectionProfileTables | kSectionCodebook;
constexpr uint8_t kMaxParamsVersion = kParamsVersion2;
static_assert(Takes(kCudaSchedule, ~uint32_t{kFeatureStridedDims}),
              "the planner takes every section feature (CheckLayout refuses strided dims); update both together");

// A plan being made, with what its frames share: a profile's decode tables
// of a (section, grid point) and head transforms of a section go into the
// plan once, whichever frames use them.
struct Builder {
  Plan plan;
  std::map<std::tuple<const void*, uint32_t, uint32_t>, uint32_t> table_base;  // (profile, section, grid) -> table
  std::map<std::pair<const void*, uint32_t>, uint32_t> transform_base;          // (profile, section) -> values index
};

// Index of the next element of an array the device addresses with 32 bits.
template <typename T>
Result<uint32_t> Next32(const std::vector<T>& v, size_t adding) {
  if (v.size() + adding > UINT32_MAX) return Status::Unsupported("CUDA decoder: a plan array outgrew 32-bit indices");
  return static_cast<uint32_t>(v.size());
}

const char* KVName(uint32_t kv) { return kv ? "V" : "K"; }

// Refuses what the device code does not implement, before anything else is
// read: bits the format does not define are corrupt (as on the CPU), bits it
// defines that this decoder does not implement are unsupported.
Status CheckParamsSupported(std::span<const uint8_t> params) {
  if (params.size() < 2 || params[0] == 0) return Status::Corrupt("cachegen params: wrong length or version 0");
  if (params[0] > kMaxParamsVersion)
    return Status::Unsupported("cachegen params version " + std::to_string(params[0]) +
                               " is not supported by the CUDA decoder");
  if (params[1] & ~kParamsFlagsKnown) return Status::Corrupt("cachegen params: unknown flags");
  if (params[1] & ~kKnownParamsFlags)
    return Status::Unsupported("cachegen params flags " + std::to_string(params[1]) +
                               " are not supported by the CUDA decoder (model profiles and newer features are CPU only)");
  return Status::Ok();
}

Status CheckLayout(const OutputLayout& out) {
  const KVStrides& s = out.strides;
  if (out.dtype != DType::kF16 && out.dtype != DType::kBF16 && out.dtype != DType::kF32)
    return Status::InvalidArgument("CUDA decoder: output dtype must be f16, bf16 or f32");
  if (s.dim != 1) return Status::InvalidArgument("CUDA decoder: the output's dim stride must be 1");
  if (s.layer < 0 || s.kv < 0 || s.token < 0 || s.head < 0)
    return Status::InvalidArgument("CUDA decoder: output strides must be non-negative");
  CG_RETURN_IF_ERROR(out.shape.Validate());
  const KVShape& sh = out.shape;
  // The largest element offset any (layer, kv, token, head, dim) reaches.
  using Wide = __int128;
  Wide token_max = 0;
  if (out.page_tokens == 0) {
    token_max = Wide(sh.tokens - 1) * s.token;
  } else {
    const uint64_t pages = (uint64_t{sh.tokens} + out.page_tokens - 1) / out.page_tokens;
    if (out.page_offsets.size() < pages)
      return Status::InvalidArgument("CUDA decoder: " + std::to_string(out.page_offsets.size()) +
                                     " page offsets for " + std::to_string(pages) + " pages");
    for (uint64_t p = 0; p < pages; ++p) {
      if (out.page_offsets[p] < 0) return Status::InvalidArgument("CUDA decoder: negative page offset");
      const uint32_t in_page = std::min<uint64_t>(out.page_tokens, sh.tokens - p * out.page_tokens);
      token_max = std::max(token_max, Wide(out.page_offsets[p]) + Wide(in_page - 1) * s.token);
    }
  }
  const Wide max = Wide(sh.layers - 1) * s.layer + Wide(s.kv) + token_max + Wide(sh.kv_heads - 1) * s.head +
                   (sh.head_dim - 1);
  if (max >= Wide(out.capacity) || max >= Wide(INT64_MAX))
    return Status::InvalidArgument("CUDA decoder: the output layout reaches element " +
                                   std::to_string(static_cast<uint64_t>(max)) + " of " +
                                   std::to_string(out.capacity));
  return Status::Ok();
}

Result<Plan> NewPlan(std::span<const uint8_t> input, const OutputLayout& out) {
  CG_RETURN_IF_ERROR(CheckLayout(out));
  Plan p;
  const auto& table = SigmaTable();
  p.sigma_table.assign(table.begin(), table.end());
  p.pages.assign(out.page_offsets.begin(), out.page_offsets.end());
  p.dest.s_layer = out.strides.layer;
  p.dest.s_kv = out.strides.kv;
  p.dest.s_token = out.strides.token;
  p.dest.s_head = out.strides.head;
  p.dest.page_tokens = out.page_tokens;
  p.dest.dtype = static_cast<uint8_t>(out.dtype);
  p.input_bytes = input.size();
  return p;
}

uint64_t OffsetIn(std::span<const uint8_t> input, const uint8_t* p) { return static_cast<uint64_t>(p - input.data()); }

// A parsed stream header as the device reads it (lengths, areas, states).
void DescribeStream(std::span<const uint8_t> input, const rans::StreamHeader& h, uint64_t n, StreamDesc* d) {
  d->n = n;
  d->mode = h.mode;
  d->constant = h.constant;
  if (h.mode != kStreamRans && h.mode != kStreamTable) return;
  d->lanes = static_cast<uint8_t>(h.lanes);
  d->payload_off = OffsetIn(input, h.payload.data());
  d->payload_words = static_cast<uint32_t>(h.payload.size() / 2);
  d->esc_off = OffsetIn(input, h.esc.data());
  d->esc_len = static_cast<uint32_t>(h.esc.size());
}

// The stream at r of n symbols with its inline table, validated as the CPU
// decoder does.
Status AddStream(Plan* plan, std::span<const uint8_t> input, ByteReader& r, uint64_t n, StreamDesc* d) {
  rans::StreamHeader h;
  CG_RETURN_IF_ERROR(rans::ParseStreamHeader(r, n, &h));
  DescribeStream(input, h, n, d);
  if (h.mode != kStreamRans) return Status::Ok();
  d->escape = static_cast<uint16_t>(h.escape);
  d->escape_used = h.escape_used;
  CG_ASSIGN_OR_RETURN(d->table_off, Next32(plan->freqs, rans::kMaxAlphabet));
  for (uint32_t s = 0; s <= h.escape; ++s) plan->freqs.push_back(static_cast<uint16_t>(h.freq[s]));
  return Status::Ok();
}

// A table-form stream at r of n symbols whose dim d takes table
// cycle[d] (head_dim of them), validated as the CPU decoder does.
Status AddTableStream(Plan* plan, std::span<const uint8_t> input, ByteReader& r, uint64_t n,
                      std::span<const uint32_t> cycle, StreamDesc* d) {
  rans::StreamHeader h;
  CG_RETURN_IF_ERROR(rans::ParseTableStreamHeader(r, n, &h));
  DescribeStream(input, h, n, d);
  if (h.mode != kStreamTable) return Status::Ok();
  d->escape_used = 1;  // a table's escape symbol may always occur (rans_decode.cc)
  CG_ASSIGN_OR_RETURN(d->cycle_off, Next32(plan->indices, cycle.size()));
  d->period = static_cast<uint32_t>(cycle.size());
  plan->indices.insert(plan->indices.end(), cycle.begin(), cycle.end());
  return Status::Ok();
}

// The number of the first of the profile's decode tables of (section, grid)
// in the plan (copied there on first use).
Result<uint32_t> ProfileTables(Builder& b, const internal::ProfileData& prof, uint32_t section, uint32_t grid,
                               const internal::SectionDecodeTables& t) {
  const auto key = std::make_tuple(static_cast<const void*>(&prof), section, grid);
  if (auto it = b.table_base.find(key); it != b.table_base.end()) return it->second;
  CG_ASSIGN_OR_RETURN(const uint32_t at, Next32(b.plan.tables, t.symbols.size() * kTableWords));
  for (const rans::DecodeTable& table : t.symbols) {
    b.plan.tables.insert(b.plan.tables.end(), std::begin(table.entry), std::end(table.entry));
    b.plan.tables.push_back(table.escape);
  }
  return b.table_base[key] = at / kTableWords;
}

// Where U^T of the section's head transforms starts in the plan's values
// (copied there on first use).
Result<uint32_t> ProfileTransforms(Builder& b, const SectionLayout& l) {
  const auto key = std::make_pair(static_cast<const void*>(l.profile), l.section);
  if (auto it = b.transform_base.find(key); it != b.transform_base.end()) return it->second;
  const size_t n = size_t{l.kv_heads} * l.head_dim * l.head_dim;
  CG_ASSIGN_OR_RETURN(const uint32_t at, Next32(b.plan.values, n));
  b.plan.values.insert(b.plan.values.end(), l.transform_t, l.transform_t + n);
  return b.transform_base[key] = at;
}

// What the jobs of a section take from its model profile, resolved into the
// plan: decode tables (grid point given), head transforms, codebook levels.
struct SectionParts {
  std::shared_ptr<const internal::SectionDecodeTables> tables;  // null: streams carry their tables
  bool classes = false;  // table cycles by channel class (inline tables are corrupt then)
  uint32_t table_base = 0;
  uint32_t transform = kNoOffset;
  Codebook cb;
  uint32_t levels = 0;  // values index of cb's levels
};

Status ResolveParts(Builder& b, const SectionLayout& l, const SectionHeader& hdr, ByteReader& r, bool use_delta,
                    SectionParts* parts) {
  if (hdr.grid >= 0) {
    const internal::ProfileData& prof = *l.profile;
    parts->tables = prof.decode_tables.Get(prof, l.section, static_cast<uint32_t>(hdr.grid));
    parts->classes = prof.HasClasses(l.section);
    CG_ASSIGN_OR_RETURN(parts->table_base,
                        ProfileTables(b, prof, l.section, static_cast<uint32_t>(hdr.grid), *parts->tables));
  }
  if (l.transform_t) {
    CG_ASSIGN_OR_RETURN(parts->transform, ProfileTransforms(b, l));
  }
  if (hdr.flags & kSectionCodebook) {
    CG_RETURN_IF_ERROR(ReadCodebook(r, l.channels(), use_delta, &parts->cb));
    const size_t n = parts->cb.LevelsSize(l.channels());
    CG_ASSIGN_OR_RETURN(parts->levels, Next32(b.plan.values, n));
    b.plan.values.resize(b.plan.values.size() + n);
    parts->cb.AllLevels(l.channels(), b.plan.values.data() + parts->levels);
  }
  return Status::Ok();
}

// Stream `kind` (0 anchors, 1 deltas) of head h: n symbols with the tables
// the section gives it (as the CPU decoder's ParseBatchStream chooses).
Status AddHeadStream(Builder& b, std::span<const uint8_t> input, ByteReader& r, const SectionLayout& l,
                     const SectionParts& parts, uint32_t h, uint32_t kind, uint64_t n, StreamDesc* d) {
  ByteReader peek = r;
  if (!parts.tables || (!parts.classes && peek.U8() == rans::kModeRans)) return AddStream(&b.plan, input, r, n, d);
  const uint32_t D = l.head_dim, C = l.channels();
  std::vector<uint32_t> cycle(D);
  for (uint32_t k = 0; k < D; ++k)
    cycle[k] = parts.table_base +
               static_cast<uint32_t>(parts.tables->channel_offset[size_t{kind} * C + h * D + k] / rans::kProbScale);
  return AddTableStream(&b.plan, input, r, n, cycle, d);
}

// Jobs of one section (layer, kv) of a parsed frame: one per head.
Status AddSection(Builder& b, std::span<const uint8_t> input, std::span<const uint8_t> payload, JobDesc job,
                  SectionLayout layout, std::vector<float>& scratch) {
  const std::string where = "layer " + std::to_string(job.layer) + " " + KVName(job.kv) + ": ";
  if (!payload.empty() && (payload[0] & ~kSectionFlagsKnown))
    return Status::Corrupt(where + "cachegen section: unknown flags " + std::to_string(payload[0]));
  if (!payload.empty() && (payload[0] & ~kKnownSectionFlags))
    return Status::Unsupported(where + "cachegen section flags " + std::to_string(payload[0]) +
                               " are not supported by the CUDA decoder");
  const uint32_t H = layout.kv_heads, D = layout.head_dim, C = layout.channels(), tq = layout.quantized_tokens();
  layout.section = 2 * job.layer + job.kv;
  layout.SetProfileTransform();
  scratch.resize(2 * size_t{C});
  const float* sigma = scratch.data();
  const float* mean = scratch.data() + C;
  ByteReader r(payload);
  SectionHeader hdr;
  CG_RETURN_IF_ERROR(ParseSectionHeader(layout, r, &hdr, scratch.data(), scratch.data() + C));
  const bool use_delta = hdr.flags & kSectionDelta;
  const bool own_stats = !(hdr.flags & kSectionProfileStats);
  const uint32_t G = use_delta ? layout.group_tokens : 1;
  const uint64_t anchors = use_delta ? (uint64_t{tq} + G - 1) / G : tq;
  job.step = hdr.step;
  job.step_recent = hdr.step * layout.recent_step_scale;  // the CPU decoder's TokenStep
  job.group = G;
  const uint64_t sigma_off = OffsetIn(input, payload.data() + hdr.stats_begin);
  // Where each head's mean varints start (ParseSectionHeader validated them all).
  ByteReader means(own_stats ? payload.subspan(hdr.stats_begin + C, r.position() - hdr.stats_begin - C)
                             : std::span<const uint8_t>());
  const uint64_t mean_end = OffsetIn(input, payload.data() + r.position());
  SectionParts parts;
  CG_RETURN_IF_ERROR(ResolveParts(b, layout, hdr, r, use_delta, &parts));
  Plan& plan = b.plan;
  const size_t first = plan.jobs.size();
  for (uint32_t h = 0; h < H; ++h) {
    JobDesc& j = plan.jobs.emplace_back(job);
    j.head = h;
    if (own_stats) {
      j.sigma_off = sigma_off + uint64_t{h} * D;
      j.mean_off = sigma_off + C + means.position();
      for (uint32_t d = 0; d < D; ++d) means.Varint();
      j.mean_end = mean_end;
    } else {
      CG_ASSIGN_OR_RETURN(j.stats_off, Next32(plan.values, 2 * size_t{D}));
      plan.values.insert(plan.values.end(), sigma + size_t{h} * D, sigma + size_t{h + 1} * D);
      plan.values.insert(plan.values.end(), mean + size_t{h} * D, mean + size_t{h + 1} * D);
    }
    if (parts.transform != kNoOffset) j.transform_off = parts.transform + h * D * D;
    if (parts.cb.levels) {
      j.level_top = 2 * parts.cb.levels;
      for (uint32_t kind = 0; kind < 2; ++kind) {
        CG_ASSIGN_OR_RETURN(j.level_off[kind], Next32(plan.indices, D));
        for (uint32_t d = 0; d < D; ++d)
          plan.indices.push_back(parts.levels + static_cast<uint32_t>(parts.cb.LevelOffset(kind, h * D + d)));
      }
    }
    CG_RETURN_IF_ERROR(AddHeadStream(b, input, r, layout, parts, h, 0, anchors * D, &j.anchor));
    if (use_delta) CG_RETURN_IF_ERROR(AddHeadStream(b, input, r, layout, parts, h, 1, (tq - anchors) * D, &j.delta));
  }
  const uint64_t exact_values = uint64_t{layout.tokens - tq} * C;
  if (r.remaining() != exact_values * 2)
    return Status::Corrupt("cachegen section: " + std::to_string(r.remaining()) + " trailing bytes, expected " +
                           std::to_string(exact_values * 2));
  for (size_t k = first; k < plan.jobs.size(); ++k)
    plan.jobs[k].tail_off = OffsetIn(input, payload.data() + r.position());
  return Status::Ok();
}

// The jobs of the frame at input[frame_off, + size) into destination tokens
// from dest_token.
Status AddFrame(Builder& b, std::span<const uint8_t> input, std::span<const uint8_t> frame, const ParsedFrame& pf,
                uint32_t dest_token, const OutputLayout& out, const ProfileSet* profiles) {
  Plan* plan = &b.plan;
  const FrameHeader& h = pf.header;
  if (h.codec != CodecId::kCacheGen) {
    auto codec = CodecById(static_cast<uint8_t>(h.codec));
    return Status::Unsupported("the CUDA decoder decodes only the cachegen codec, not " +
                               (codec.ok() ? std::string((*codec)->name()) : std::to_string(int(h.codec))));
  }
  if (h.shape.layers != out.shape.layers || h.shape.kv_heads != out.shape.kv_heads ||
      h.shape.head_dim != out.shape.head_dim || uint64_t{dest_token} + h.shape.tokens > out.shape.tokens)
    return Status::InvalidArgument("frame shape " + h.shape.ToString() + " at token " + std::to_string(dest_token) +
                                   " does not fit the output " + out.shape.ToString());
  CG_RETURN_IF_ERROR(CheckParamsSupported(h.params));
  CG_ASSIGN_OR_RETURN(const CacheGenFrameParams fp,
                      ReadCacheGenFrameParams(h.params, h.shape, h.token_start, h.context_tokens, profiles));
  const SectionLayout& l = fp.layout;
  JobDesc job;
  job.tokens = l.tokens;
  job.quantized = l.quantized_tokens();
  job.recent_begin = l.recent_begin;
  job.head_dim = l.head_dim;
  job.channels = l.channels();
  job.rotate = l.rotate;
  job.hadamard_scale = 1.0f / std::sqrt(static_cast<float>(l.head_dim));  // hadamard.cc's
  job.dest_token = dest_token;
  uint32_t rope_off = 0, rope_pairs = 0;
  if (fp.rope.kind != RopeConfig::Kind::kNone) {
    const RopeTable table(fp.rope, h.token_start, h.shape.tokens);
    if (plan->rope.size() + 2 * table.cos().size() > UINT32_MAX)
      return Status::Unsupported("CUDA decoder: RoPE tables too large for one plan");
    rope_off = static_cast<uint32_t>(plan->rope.size());
    rope_pairs = table.pairs();
    plan->rope.insert(plan->rope.end(), table.cos().begin(), table.cos().end());
    plan->rope.insert(plan->rope.end(), table.sin().begin(), table.sin().end());
    job.rope_neox = fp.rope.kind == RopeConfig::Kind::kNeox;
  }
  std::vector<float> scratch;
  for (uint32_t layer = 0; layer < h.shape.layers; ++layer)
    for (uint32_t kv = 0; kv < 2; ++kv) {
      CG_ASSIGN_OR_RETURN(std::span<const uint8_t> payload, SectionPayload(pf, frame, layer, static_cast<KV>(kv)));
      job.layer = layer;
      job.kv = static_cast<uint8_t>(kv);
      job.rope_off = kv == 0 ? rope_off : 0;
      job.rope_pairs = kv == 0 ? rope_pairs : 0;  // values are never rotated
      CG_RETURN_IF_ERROR(AddSection(b, input, payload, job, l, scratch));
    }
  plan->max_head_dim = std::max(plan->max_head_dim, l.head_dim);
  plan->output_values += h.shape.values();
  return Status::Ok();
}

const char* JobErrorText(uint32_t code) {
  switch (code) {
    case kJobBadMean: return "invalid channel mean";
    case kJobPayloadShort: return "payload length does not match the coded symbols";
    case kJobPayloadLeft: return "payload has unread words after the last symbol";
    case kJobFinalState: return "final state of a lane is not the initial value";
    case kJobEscapeBad: return "escape area exhausted or out of range";
    case kJobEscapeLeft: return "escape area has unread bytes";
    default: return "unknown error";
  }
}

}  // namespace

}  // namespace cachegen::gpu

namespace cachegen::cuda {

// Here rather than in src/cuda/: plans are made in every build.
DeviceLayout DeviceLayout::Contiguous(const KVShape& shape, DType dtype) {
  DeviceLayout o;
  o.dtype = dtype;
  o.shape = shape;
  o.strides = ContiguousStrides(shape);
  o.capacity = shape.values();
  return o;
}

}  // namespace cachegen::cuda

namespace cachegen::gpu {

Result<Plan> PlanContainer(std::span<const uint8_t> container, uint32_t level, const OutputLayout& out,
                           const ProfileSet* profiles) {
  CG_ASSIGN_OR_RETURN(ContainerInfo info, ParseContainer(container));
  if (!(out.shape == info.shape))
    return Status::InvalidArgument("output shape " + out.shape.ToString() + " does not match container shape " +
                                   info.shape.ToString());
  if (level >= info.levels)
    return Status::InvalidArgument("level " + std::to_string(level) + " out of range (container has " +
                                   std::to_string(info.levels) + ")");
  Builder b;
  CG_ASSIGN_OR_RETURN(b.plan, NewPlan(container, out));
  for (uint32_t c = 0; c < info.chunks.size(); ++c) {
    const ChunkEntry& e = info.chunks[c];
    // Bounds checked by ParseContainer.
    const std::span<const uint8_t> frame = container.subspan(e.frame_offset[level], e.frame_size[level]);
    CG_ASSIGN_OR_RETURN(ParsedFrame pf, ParseFrame(frame));
    CG_RETURN_IF_ERROR(CheckFrameAgainstIndex(info, c, level, pf.header));
    CG_RETURN_IF_ERROR(AddFrame(b, container, frame, pf, e.token_start - info.token_start, out, profiles));
  }
  return std::move(b.plan);
}

Result<Plan> PlanFrame(std::span<const uint8_t> frame, uint32_t dest_token, const OutputLayout& out,
                       const ProfileSet* profiles) {
  Builder b;
  CG_ASSIGN_OR_RETURN(b.plan, NewPlan(frame, out));
  CG_ASSIGN_OR_RETURN(ParsedFrame pf, ParseFrame(frame));
  CG_RETURN_IF_ERROR(AddFrame(b, frame, frame, pf, dest_token, out, profiles));
  return std::move(b.plan);
}

Status JobStatus(const JobDesc& job, uint32_t code) {
  if (code == kJobOk) return Status::Ok();
  const uint32_t what = code & 0xff;
  const char* stream = what == kJobBadMean ? "" : (code >> 8) ? "delta stream: " : "anchor stream: ";
  return Status::Corrupt("layer " + std::to_string(job.layer) + " " + KVName(job.kv) + " head " +
                         std::to_string(job.head) + ": " + stream + JobErrorText(what));
}

Inputs HostInputs(const Plan& plan, std::span<const uint8_t> input, void* dst) {
  Inputs in;
  in.bytes = input.data();
  in.freqs = plan.freqs.data();
  in.sigma_table = plan.sigma_table.data();
  in.rope = plan.rope.data();
  in.values = plan.values.data();
  in.indices = plan.indices.data();
  in.tables = plan.tables.data();
  in.pages = plan.pages.data();
  in.dst = dst;
  in.dest = plan.dest;
  return in;
}

Status RunOnHost(const Plan& plan, std::span<const uint8_t> input, void* dst, uint32_t threads) {
  if (input.size() != plan.input_bytes) return Status::InvalidArgument("input is not the bytes the plan was made from");
  const Inputs in = HostInputs(plan, input, dst);
  return ParallelFor(plan.jobs.size(), threads, [&](uint64_t k) {
    // Workspace pieces are 16-byte aligned; floats give that alignment from new.
    std::vector<float> buffer(WorkspaceBytes(plan.max_head_dim) / sizeof(float));
    const Workspace w = CarveWorkspace(reinterpret_cast<uint8_t*>(buffer.data()), plan.max_head_dim);
    HostGroup g;
    JobRunner<HostGroup> runner(g, plan.jobs[k], in, w);
    return JobStatus(plan.jobs[k], runner.Run());
  });
}

}  // namespace cachegen::gpu
