// The scalar/generic schedule of the section decoder and its dispatch to the
// fused AVX2 schedule (fused_decode.h): DecodeCacheGenSection.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "codec/cachegen/fused_decode.h"
#include "codec/cachegen/hadamard.h"
#include "codec/cachegen/head_transform.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/rope.h"
#include "codec/cachegen/section_coder.h"
#include "codec/cachegen/section_format.h"
#include "codec/rans.h"
#include "common/bytes.h"
#include "common/convert.h"
#include "common/half.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen {

namespace {

// Dequantization: out[d] = pred[d] + float(UnZigZag(sym[d])) * st[d], in
// exactly that float arithmetic (a multiply, then an add: no FMA).
void DequantScalar(const uint32_t* sym, const float* pred, const float* st, float* out, uint32_t n) {
  for (uint32_t d = 0; d < n; ++d) out[d] = pred[d] + static_cast<float>(UnZigZag(sym[d])) * st[d];
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void DequantAvx2(const uint32_t* sym, const float* pred, const float* st, float* out,
                                                 uint32_t n) {
  uint32_t d = 0;
  const __m256i one = _mm256_set1_epi32(1);
  for (; d + 8 <= n; d += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sym + d));
    const __m256i q = _mm256_xor_si256(_mm256_srli_epi32(u, 1), _mm256_sub_epi32(_mm256_setzero_si256(),
                                                                                 _mm256_and_si256(u, one)));
    const __m256 prod = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(st + d));
    _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_loadu_ps(pred + d), prod));
  }
  DequantScalar(sym + d, pred + d, st + d, out + d, n - d);
}

// Dequantization fused with the f16 store (no rotation, f16 output with
// contiguous dims): dst[d] = f16(pred[d] + q * st[d]); keep (if not null)
// receives the f32 values. Same values as DequantAvx2 + StoreRow(kF16): F16C
// rounds like F32ToF16 except for NaN payloads, which go through StoreRow.
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 Dequant8Avx2(const uint32_t* sym, const float* pred,
                                                                                const float* st) {
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sym));
  const __m256i q = _mm256_xor_si256(_mm256_srli_epi32(u, 1),
                                     _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(u, _mm256_set1_epi32(1))));
  return _mm256_add_ps(_mm256_loadu_ps(pred), _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(st)));
}

__attribute__((target("avx2,f16c"))) void DequantF16Avx2(const uint32_t* sym, const float* pred, const float* st,
                                                         float* keep, uint8_t* dst, uint32_t n) {
  const size_t n8 = n & ~size_t{7};
  __m256 nan = _mm256_setzero_ps();
  if (keep) {
    for (size_t d = 0; d < n8; d += 8) {
      const __m256 v = Dequant8Avx2(sym + d, pred + d, st + d);
      _mm256_storeu_ps(keep + d, v);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * d), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
  } else {
    for (size_t d = 0; d < n8; d += 8) {
      const __m256 v = Dequant8Avx2(sym + d, pred + d, st + d);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * d), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
  }
  // A NaN (only from hostile or overflowing input) redoes the 8-value blocks
  // through StoreRow, which keeps F32ToF16's NaN encoding.
  const bool any_nan = !_mm256_testz_ps(nan, nan);
  for (size_t d = any_nan ? 0 : n8; d < n; d += 8) {
    const uint32_t m = static_cast<uint32_t>(std::min<size_t>(8, n - d));
    float tmp[8];
    DequantScalar(sym + d, pred + d, st + d, tmp, m);
    if (keep && d >= n8) std::memcpy(keep + d, tmp, m * sizeof(float));
    StoreRow(DType::kF16, tmp, m, dst + 2 * d);
  }
}
#endif

using DequantFn = void (*)(const uint32_t*, const float*, const float*, float*, uint32_t);

// Dequantization with a codebook for channels c0.. of one stream kind: a
// symbol u <= top takes its channel's level levels[offset[c] + u], a larger
// one q = UnZigZag(u) as in DequantScalar; out[d] = pred[d] + level * st[d].
void DequantLevels(const float* levels, const int32_t* offset, uint32_t top, const uint32_t* sym, const float* pred,
                   const float* st, float* out, uint32_t n) {
  for (uint32_t d = 0; d < n; ++d) {
    const uint32_t u = sym[d];
    const float v = u <= top ? levels[offset[d] + u] : static_cast<float>(UnZigZag(u));
    out[d] = pred[d] + v * st[d];
  }
}

}  // namespace

Status ReadCodebook(ByteReader& r, uint32_t channels, bool use_delta, Codebook* cb) {
  cb->levels = r.U8();
  const uint64_t g = r.Varint();
  if (!r.ok()) return Status::Corrupt("cachegen section: truncated codebook");
  if (cb->levels == 0 || cb->levels > kMaxCodebookLevels)
    return Status::Corrupt("cachegen section: codebook levels " + std::to_string(cb->levels) + " not in 1..16");
  if (g == 0 || g > channels)
    return Status::Corrupt("cachegen section: codebook group of " + std::to_string(g) + " channels not in 1..C");
  cb->group_channels = static_cast<uint32_t>(g);
  cb->kinds = use_delta ? 2 : 1;
  const size_t n = size_t{cb->groups(channels)} * cb->kinds * 2 * cb->levels;
  const auto bytes = r.Bytes(n);
  if (!r.ok()) return Status::Corrupt("cachegen section: truncated codebook");
  cb->offsets.resize(n);
  std::memcpy(cb->offsets.data(), bytes.data(), n);
  return Status::Ok();
}

namespace {

DequantFn PickDequant() {
#if defined(__x86_64__)
  if (simd::Avx2()) return &DequantAvx2;
#endif
  return &DequantScalar;
}

// Per-thread buffers reused across sections (grown, never shrunk or cleared:
// every element used is written first).
struct DecodeScratch {
  std::vector<rans::ParsedStream> streams;
  std::vector<uint32_t> symbols;
  std::vector<float> sigma, mean, st, st_recent, anchor, row, transformed, levels;
  std::vector<int32_t> level_offset;             // [kind][channel]: where a channel's codebook levels start
  std::vector<const rans::DecodeTable*> cycles;  // a batch's streams' table cycles, D entries each
  std::vector<rans::TableStream> table_streams;
  std::vector<internal::FusedStream> fused;
};

DecodeScratch& Scratch() {
  thread_local DecodeScratch s;
  return s;
}

// Streams decoded together (heads x anchor/delta) before or while their rows
// are reconstructed: what the AVX2 rANS decoder interleaves, while the
// symbols stay within the L2 cache.
constexpr uint32_t kBatchStreams = 8;

}  // namespace

namespace {

// RoPE whose rotated pairs lie in whole 8-dim blocks: normal pairs (2i, 2i+1)
// over dims a multiple of 8; NeoX pairs (i, i + dims/2) with dims/2 a
// multiple of 8.
bool RopePairsInBlocks(const RopeConfig& r) {
  if (r.kind == RopeConfig::Kind::kNormal) return r.dims % 8 == 0;
  return r.kind == RopeConfig::Kind::kNeox && r.dims % 16 == 0;
}

}  // namespace

uint32_t SectionFeatures(const SectionLayout& l, const SectionHeader& h, const SectionSink& sink) {
  uint32_t f = 0;
  if (h.flags & kSectionProfileStats) f |= kFeatureProfileStats;
  if (h.grid >= 0) f |= l.profile->HasClasses(l.section) ? kFeatureChannelClasses : kFeatureProfileTables;
  if (h.flags & kSectionCodebook) f |= kFeatureCodebook;
  if (l.transform) f |= kFeatureHeadTransform;
  if (l.rotate) f |= kFeatureHadamard;
  if (sink.rope) f |= kFeatureRope;
  // Rows stored from registers 8 dims at a time (without a transform, which
  // stores whole rows through the sink).
  if (!l.transform && sink.rope && !RopePairsInBlocks(sink.rope->rope())) f |= kFeatureRopeSplitPairs;
  if (!l.transform && sink.view.strides().dim != 1) f |= kFeatureStridedDims;
  if (l.head_dim % 8 != 0) f |= kFeatureOddHeadDim;
  if ((h.flags & kSectionDelta) && l.group_tokens < 2) f |= kFeatureSingleTokenGroups;
  if (l.recent_begin < l.tokens) f |= l.recent_step_scale == 0 ? kFeatureExactTail : kFeatureFinerRecent;
  return f;
}

Status ParseSectionHeader(const SectionLayout& l, ByteReader& r, SectionHeader* hdr, float* sigma, float* mean) {
  const uint32_t C = l.channels();
  const uint8_t flags = r.U8();
  const float step = r.F32();
  if (!r.ok()) return Status::Corrupt("cachegen section: truncated header");
  if (flags & ~kSectionFlagsKnown) return Status::Corrupt("cachegen section: unknown flags " + std::to_string(flags));
  if (!(step > 0) || !std::isfinite(step) || step > 1e30f) return Status::Corrupt("cachegen section: invalid step");
  const internal::ProfileData* prof = l.profile;
  if ((flags & (kSectionProfileStats | kSectionProfileTables)) && !prof)
    return Status::Corrupt("cachegen section: uses a profile but the frame references none");
  int grid = -1;
  if (flags & kSectionProfileTables) {
    grid = r.U8();
    if (!r.ok() || uint32_t(grid) >= prof->grid_points)
      return Status::Corrupt("cachegen section: profile grid point out of range");
  }
  hdr->flags = flags;
  hdr->step = step;
  hdr->grid = grid;
  hdr->stats_begin = r.position();
  const std::array<float, 256>& sigma_table = SigmaTable();
  if (flags & kSectionProfileStats) {
    const auto& sc_codes = prof->sigma_code[l.section];
    const auto& mc_codes = prof->mean_code[l.section];
    for (uint32_t c = 0; c < C; ++c) {
      sigma[c] = sigma_table[sc_codes[c]];
      mean[c] = MeanFromCode(mc_codes[c], sigma[c]);
    }
  } else {
    auto sigma_codes = r.Bytes(C);
    if (!r.ok()) return Status::Corrupt("cachegen section: truncated header");
    for (uint32_t c = 0; c < C; ++c) {
      sigma[c] = sigma_table[sigma_codes[c]];
      const uint64_t z = r.Varint();
      if (!r.ok() || z > (uint64_t{1} << 31)) return Status::Corrupt("cachegen section: invalid channel mean");
      mean[c] = MeanFromCode(UnZigZag(static_cast<uint32_t>(z)), sigma[c]);
    }
  }
  return Status::Ok();
}

namespace {

// The streams of one batch of heads (per head its anchor stream, then with
// deltas its delta stream), parsed. A stream of a section with profile
// tables is a cycle of tables (per dim its channel's: the head's table, or
// with channel classes its class's) and decodes with them from the profile's
// cache; other streams carry their table inline (FORMAT.md "Symbol streams").
struct BatchStreams {
  uint32_t count = 0;
  bool table_form[kBatchStreams] = {};
  rans::ParsedStream* inline_stream[kBatchStreams] = {};
  rans::TableStream* table_stream[kBatchStreams] = {};
  uint32_t head[kBatchStreams] = {}, kind[kBatchStreams] = {};
  uint32_t* out[kBatchStreams] = {};
};

// Where a section's streams find their tables: none (inline), or a profile's.
struct SectionTables {
  const internal::SectionDecodeTables* profile = nullptr;
  bool classes = false;  // mode-2 (inline) streams are corrupt in a class section
};

// Parses the next stream (head, kind) of a batch as its k-th; inline tables
// in form `form`.
Status ParseBatchStream(ByteReader& r, const SectionLayout& l, const SectionTables& tables, DecodeScratch& sc,
                        uint32_t k, uint32_t head, uint32_t kind, std::span<uint32_t> out, rans::TableForm form,
                        BatchStreams* b) {
  const uint32_t D = l.head_dim;
  b->head[k] = head;
  b->kind[k] = kind;
  b->out[k] = out.data();
  ByteReader peek = r;
  const bool inline_table = !tables.profile || (!tables.classes && peek.U8() == rans::kModeRans);
  b->table_form[k] = !inline_table;
  if (inline_table) {
    b->inline_stream[k] = &sc.streams[k];
    return rans::ParseStream(r, out.size(), b->inline_stream[k], form);
  }
  const std::span<const rans::DecodeTable*> cycle(sc.cycles.data() + size_t{k} * D, D);
  for (uint32_t d = 0; d < D; ++d) cycle[d] = tables.profile->Symbols(kind, head * D + d);
  b->table_stream[k] = &sc.table_streams[k];
  return rans::ParseStreamWithTables(r, cycle, out, b->table_stream[k]);
}

// Decodes a parsed batch's symbols into their outputs (the generic schedule).
Status DecodeBatchSymbols(const BatchStreams& b) {
  rans::ParsedStream* ps[kBatchStreams];
  uint32_t* po[kBatchStreams];
  rans::TableStream* ts[kBatchStreams];
  size_t np = 0, nt = 0;
  for (uint32_t k = 0; k < b.count; ++k) {
    if (b.table_form[k]) {
      ts[nt++] = b.table_stream[k];
    } else {
      ps[np] = b.inline_stream[k];
      po[np++] = b.out[k];
    }
  }
  if (np) CG_RETURN_IF_ERROR(rans::DecodeParsed(std::span(ps, np), std::span(po, np)));
  if (nt) CG_RETURN_IF_ERROR(rans::DecodeStreamsWithTables(std::span(ts, nt)));
  return Status::Ok();
}

// The fused schedule's view of a parsed batch; false when some stream is not
// an 8-lane rANS stream (empty and constant streams, one lane). *plain: every
// stream has its inline table (they are the consecutive sc.streams).
bool FusedStreams(const BatchStreams& b, const SectionLayout& l, const SectionTables& tables, DecodeScratch& sc,
                  bool* plain) {
  const uint32_t D = l.head_dim, C = l.channels();
  *plain = true;
  for (uint32_t k = 0; k < b.count; ++k) {
    internal::FusedStream& f = sc.fused[k];
    if (!b.table_form[k]) {
      const rans::ParsedStream& p = *b.inline_stream[k];
      if (p.mode != rans::kModeRans || p.lanes != 8) return false;
      f = {p.table.entry, nullptr, p.escape, nullptr, p.state, p.esc, p.payload};
      continue;
    }
    *plain = false;
    const rans::TableStream& t = *b.table_stream[k];
    if (t.mode != rans::kModeTable || t.lanes != 8) return false;
    const internal::SectionDecodeTables& pt = *tables.profile;
    const size_t c0 = size_t{b.kind[k]} * C + size_t{b.head[k]} * D;
    f = {pt.values.data(), nullptr, 0, nullptr, t.state, t.esc, t.payload};
    if (tables.classes) {
      f.dim_offset = pt.channel_offset.data() + c0;
      f.dim_escape = pt.channel_escape.data() + c0;
    } else {
      f.table = pt.Values(b.head[k], b.kind[k]);
      f.escape = pt.channel_escape[c0];
    }
  }
  return true;
}

}  // namespace

Status DecodeCacheGenSection(const SectionLayout& l, std::span<const uint8_t> payload, const SectionSink& sink) {
  const uint32_t H = l.kv_heads, D = l.head_dim, C = l.channels(), tq = l.quantized_tokens();
  ByteReader r(payload);
  DecodeScratch& sc = Scratch();
  float* sigma = GrowScratch(sc.sigma, C);
  float* mean = GrowScratch(sc.mean, C);
  SectionHeader hdr;
  CG_RETURN_IF_ERROR(ParseSectionHeader(l, r, &hdr, sigma, mean));
  const float step = hdr.step;
  const bool use_delta = hdr.flags & kSectionDelta;
  const internal::ProfileData* prof = l.profile;
  SectionTables tables;
  std::shared_ptr<const internal::SectionDecodeTables> held;  // kept while the section decodes
  if (hdr.grid >= 0) {
    held = prof->decode_tables.Get(*prof, l.section, static_cast<uint32_t>(hdr.grid));
    tables.profile = held.get();
    tables.classes = prof->HasClasses(l.section);
  }
  // Reconstruction levels per (channel group, stream kind), when the section
  // has a codebook, and per [kind][channel] where its channel's levels start.
  Codebook cb;
  float* levels = nullptr;
  uint32_t level_top = 0;  // 2M: symbols u <= level_top have a level
  int32_t* level_offset = nullptr;
  if (hdr.flags & kSectionCodebook) {
    CG_RETURN_IF_ERROR(ReadCodebook(r, C, use_delta, &cb));
    levels = GrowScratch(sc.levels, cb.LevelsSize(C));
    cb.AllLevels(C, levels);
    level_top = 2 * cb.levels;
    level_offset = GrowScratch(sc.level_offset, size_t{2} * C);
    for (uint32_t k = 0; k < 2; ++k)
      for (uint32_t c = 0; c < C; ++c) level_offset[size_t{k} * C + c] = static_cast<int32_t>(cb.LevelOffset(k, c));
  }
  // Steps of the older and of the recent tokens (TokenStep), per channel.
  float* st = GrowScratch(sc.st, C);
  float* st_recent = GrowScratch(sc.st_recent, C);
  const float step_recent = TokenStep(l, step, l.recent_begin);
  for (uint32_t c = 0; c < C; ++c) {
    st[c] = sigma[c] * step;
    st_recent[c] = sigma[c] * step_recent;
  }

  const StreamCounts counts = CountStreams(l, use_delta);
  const size_t na = size_t{counts.anchors} * D, nd = size_t{counts.deltas} * D;
  const uint32_t per_head = use_delta ? 2 : 1;
  const uint32_t batch = std::min(H, kBatchStreams / per_head);
  GrowScratch(sc.streams, kBatchStreams);
  GrowScratch(sc.table_streams, kBatchStreams);
  GrowScratch(sc.fused, kBatchStreams);
  GrowScratch(sc.cycles, size_t{kBatchStreams} * D);
  uint32_t* symbols = GrowScratch(sc.symbols, size_t{batch} * (na + nd));
  float* anchor = GrowScratch(sc.anchor, D);
  float* row = GrowScratch(sc.row, D);
  float* transformed = l.transform ? GrowScratch(sc.transformed, D) : nullptr;
  const DequantFn dequant = PickDequant();
  const uint32_t G = use_delta ? l.group_tokens : 1;
#if defined(__x86_64__)
  const bool fused_f16 =
      !levels && !l.rotate && !l.transform && !sink.rope && sink.view.dtype() == DType::kF16 && sink.view.strides().dim == 1 && simd::Avx2();
#endif

  // The fused schedule where it takes what the section asks for (and every
  // stream of a batch is 8-lane rANS: FusedStreams); else the generic one.
  const bool fused = internal::FusedAvailable() && Takes(kFusedSchedule, SectionFeatures(l, hdr, sink));
  const internal::FusedSection fs{&l, &sink, use_delta, mean, st, st_recent, levels, level_offset, level_top};

  for (uint32_t h0 = 0; h0 < H; h0 += batch) {
    const uint32_t hn = std::min(batch, H - h0);
    BatchStreams b;
    b.count = hn * per_head;
    // Parses the batch's streams (per head: anchors, then deltas).
    auto parse = [&](rans::TableForm form) -> Status {
      for (uint32_t h = 0, k = 0; h < hn; ++h) {
        uint32_t* base = symbols + size_t{h} * (na + nd);
        for (uint32_t kind = 0; kind < per_head; ++kind, ++k)
          CG_RETURN_IF_ERROR(ParseBatchStream(r, l, tables, sc, k, h0 + h, kind,
                                              {base + (kind ? na : 0), kind ? nd : na}, form, &b));
      }
      return Status::Ok();
    };
    const ByteReader batch_start = r;
    if (fused) {
      CG_RETURN_IF_ERROR(parse(rans::TableForm::kZigZagValues));
      bool plain = false;
      if (FusedStreams(b, l, tables, sc, &plain) && internal::DecodeFusedBatch(fs, sc.fused.data(), h0, hn, plain))
        continue;
      // Not for the fused schedule after all (or corrupt): the generic one
      // decodes the same bytes again and has the last word.
      r = batch_start;
    }
    CG_RETURN_IF_ERROR(parse(rans::TableForm::kSymbols));
    CG_RETURN_IF_ERROR(DecodeBatchSymbols(b));
    // Reconstruct exactly as the encoder's Quantize() did, head by head.
    for (uint32_t h = 0; h < hn; ++h) {
      const uint32_t head = h0 + h;
      const size_t c0 = size_t{head} * D;
      const uint32_t* asym = symbols + size_t{h} * (na + nd);
      const uint32_t* dsym = asym + na;
#if defined(__x86_64__)
      if (fused_f16) {
        for (uint32_t g0 = 0; g0 < tq; g0 += G) {
          const uint32_t g1 = std::min(g0 + G, tq);
          for (uint32_t t = g0; t < g1; ++t) {
            const float* stt = (t >= l.recent_begin ? st_recent : st) + c0;
            uint8_t* dst = static_cast<uint8_t*>(sink.view.Pointer(sink.layer, sink.kv, t, head, 0));
            if (t == g0) {
              DequantF16Avx2(asym, mean + c0, stt, anchor, dst, D);
              asym += D;
            } else {
              DequantF16Avx2(dsym, anchor, stt, nullptr, dst, D);
              dsym += D;
            }
          }
        }
        continue;
      }
#endif
      for (uint32_t g0 = 0; g0 < tq; g0 += G) {
        const uint32_t g1 = std::min(g0 + G, tq);
        for (uint32_t t = g0; t < g1; ++t) {
          const float* stt = (t >= l.recent_begin ? st_recent : st) + c0;
          float* rec = t == g0 ? anchor : row;
          if (t == g0) {
            if (levels)
              DequantLevels(levels, level_offset + c0, level_top, asym, mean + c0, stt, anchor, D);
            else
              dequant(asym, mean + c0, stt, anchor, D);
            asym += D;
          } else {
            if (levels)
              DequantLevels(levels, level_offset + C + c0, level_top, dsym, anchor, stt, row, D);
            else
              dequant(dsym, anchor, stt, row, D);
            dsym += D;
          }
          if (l.rotate) {
            if (rec == anchor) {
              std::memcpy(row, anchor, size_t{D} * sizeof(float));
              rec = row;
            }
            HadamardInPlace(rec, D);
          } else if (l.transform) {
            HeadFromCoding(l.transform_t + size_t{head} * D * D, rec, transformed, D);
            rec = transformed;
          }
          sink.Store(t, head, rec);
        }
      }
    }
  }

  const size_t exact_values = size_t{l.tokens - tq} * C;
  if (r.remaining() != exact_values * 2)
    return Status::Corrupt("cachegen section: " + std::to_string(r.remaining()) + " trailing bytes, expected " +
                           std::to_string(exact_values * 2));
  for (uint32_t t = tq; t < l.tokens; ++t)
    for (uint32_t h = 0; h < H; ++h) {
      for (uint32_t d = 0; d < D; ++d) row[d] = F16ToF32(r.U16());
      sink.Store(t, h, row);
    }
  return Status::Ok();
}

void SectionSink::Store(uint32_t token, uint32_t head, const float* values) const {
  const uint32_t D = view.shape().head_dim;
  if (rope) {
    thread_local std::vector<float> roped;
    if (roped.size() < D) roped.resize(D);
    std::memcpy(roped.data(), values, size_t{D} * sizeof(float));
    rope->Apply(token, roped.data(), /*inverse=*/false);
    values = roped.data();
  }
  if (view.strides().dim == 1) {
    StoreRow(view.dtype(), values, D, view.Pointer(layer, kv, token, head, 0));
  } else {
    for (uint32_t d = 0; d < D; ++d) view.Set(layer, kv, token, head, d, values[d]);
  }
}

Status DecodeCacheGenSection(const SectionLayout& l, std::span<const uint8_t> payload, std::span<float> out,
                             const RopeTable* rope) {
  const uint64_t C = l.channels();
  if (out.size() != size_t{l.tokens} * C) return Status::Internal("cachegen section: output size mismatch");
  const KVShape shape{1, l.kv_heads, l.head_dim, l.tokens};
  const KVStrides strides{0, 0, static_cast<int64_t>(C), l.head_dim, 1};
  return DecodeCacheGenSection(l, payload, SectionSink{KVView(out.data(), DType::kF32, shape, strides), 0, KV::kKey, rope});
}

}  // namespace cachegen
