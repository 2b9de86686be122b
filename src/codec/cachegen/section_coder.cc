#include "codec/cachegen/section_coder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/section_kernels.h"
#include "codec/rans.h"
#include "common/bytes.h"
#include "common/convert.h"
#include "common/half.h"

namespace cachegen {
namespace {

// Streams in table form (frames with a model profile) carrying under 1024
// bytes get one lane, the rest the default 8. Each lane ends with a 4-byte
// state; on stories260K's small heads (8 dims: streams of a few hundred bytes)
// one lane below 512 bytes moved ΔPPL = 1 % from 1.96 to ≈ 1.84 bits/value,
// and 1024 (with channel classes, whose sensitive K sections take streams
// beyond 512 bytes at 3 bits/value) moved mean KL = 1e-3 from ≈ 3.10 to ≈ 3.02
// bits/value (docs/results/eval.md).
// Frames without a profile keep 8 lanes everywhere: the CUDA decoder (which
// takes no profiles) runs a stream's lanes on the threads of a warp, and one
// lane made it 3-6x slower on short chunks (docs/GPU.md); the CPU's fused
// path needs 8 lanes too.
constexpr rans::EncodeOptions kTableFormOptions{.lanes = rans::kDefaultLanes, .single_lane_below_bytes = 1024};

// The profile tables a head's stream of `kind` is coded with at grid point
// g: one per channel (its class's) where the section has channel classes,
// else the head's table alone. Valid until the calling thread's next call.
const std::vector<const rans::FreqTable*>& StreamTables(const internal::ProfileData& prof, uint32_t section, int g,
                                                        uint32_t head, uint32_t kind) {
  thread_local std::vector<const rans::FreqTable*> cycle;
  const uint32_t D = prof.head_dim;
  cycle.clear();
  if (!prof.HasClasses(section)) {
    cycle.push_back(&prof.Table(section, g, head, kind));
    return cycle;
  }
  for (uint32_t d = 0; d < D; ++d) cycle.push_back(&prof.ChannelTable(section, g, kind, head * D + d));
  return cycle;
}

}  // namespace

StreamCounts CountStreams(const SectionLayout& l, bool use_delta) {
  const uint32_t tq = l.quantized_tokens();
  if (!use_delta) return {tq, 0};
  const uint32_t anchors = (tq + l.group_tokens - 1) / l.group_tokens;
  return {anchors, tq - anchors};
}


namespace {

// Lloyd quantizer (encoder choices, FORMAT.md): the rate weight lambda in
// step^2 per bit is the slope of a uniform quantizer's D(R) at high rate,
// 2 ln 2 / 12; a magnitude gets codebook levels when at least
// kCodebookMinCount values use it; kLloydPasses assignment/centroid passes
// follow the first (plain rounding) pass.
constexpr float kLloydLambda = 0.1155f;
constexpr uint64_t kCodebookMinCount = 32;
constexpr int kLloydPasses = 2;
// Values per codebook (a head) and stream kind a full-data codebook is
// learned on, at least (FillStreams): one token group in every
// groups * head_dim / kLearnValues. Measured with `cachegen eval` (docs6L,
// head dim 64: mean KL within noise of learning on every group at 1-3 bits;
// stories260K, head dim 8, keeps every group: one in four raised its KL by
// 20-40 % at 1.5-2 bits).
constexpr uint32_t kLearnValues = 2048;
// A quantization at a step within this many octaves of an earlier one of
// the same sample (rate control's next estimate or correction) keeps that
// one's codebook (QuantizeStreams).
constexpr double kReuseCodebookOctaves = 0.125;

}  // namespace

// What one quantization pass saw: symbol counts per (head, kind) for the rate
// term, sums of the normalized residuals per (group, kind, symbol) for
// centroids. Learning keeps one codebook per head (group = head), so the
// centroids' counts are the histogram's (Count).
struct SectionAnalysis::LloydStats {
  // A pass accumulates into kBanks copies, channel c into bank c % kBanks
  // (consecutive values mostly take the same symbol: one copy would chain
  // every add through memory), which Fold sums into the first.
  static constexpr uint32_t kBanks = 4;
  size_t bins = 0;  // 2M + 3; the last bin counts every larger symbol
  std::vector<uint64_t> hist;  // [bank][head][kind][bins]
  // [bank][group][kind][2M + 1], and one more entry per bank: symbol 0 (no
  // level) and symbols above 2M add to an entry no reader uses (the u = 0
  // entry of the run, or of the next run), which keeps the adds branch-free.
  std::vector<double> sum;
  size_t hist_bank = 0, sum_bank = 0;  // entries per bank
  double distortion = 0;  // sum of squared errors in units of the step
  // Whether the pass measures the distortion (a middle pass of learning
  // does not).
  bool want_distortion = true;
  LloydStats(const Codebook& cb, uint32_t heads, uint32_t head_dim)
      : bins(2 * cb.levels + 3),
        hist(kBanks * size_t{heads} * cb.kinds * bins),
        sum(kBanks * (size_t{cb.groups(heads * head_dim)} * cb.kinds * (2 * cb.levels + 1) + 1)),
        hist_bank(hist.size() / kBanks),
        sum_bank(sum.size() / kBanks) {}
  // Sums the banks into the first (in bank order), which readers then use.
  void Fold() {
    for (uint32_t b = 1; b < kBanks; ++b) {
      for (size_t i = 0; i < hist_bank; ++i) hist[i] += hist[b * hist_bank + i];
      for (size_t i = 0; i < sum_bank; ++i) sum[i] += sum[b * sum_bank + i];
    }
  }
  // After Fold: how many values of (group, kind) gk took symbol u <= 2M.
  uint64_t Count(size_t gk, uint32_t u) const { return hist[gk * bins + u]; }
  // Order-0 entropy of the symbols per (head, kind) stream, in bits (the
  // larger symbols share one bin: the same approximation for every pass).
  double EntropyBits() const {
    double bits = 0;
    for (size_t s0 = 0; s0 < hist_bank; s0 += bins) {
      uint64_t n = 0;
      for (size_t u = 0; u < bins; ++u) n += hist[s0 + u];
      for (size_t u = 0; u < bins; ++u)
        if (hist[s0 + u]) bits += double(hist[s0 + u]) * std::log2(double(n) / double(hist[s0 + u]));
    }
    return bits;
  }
};

void SectionAnalysis::LloydTables::Build(const Codebook& cb, uint32_t C, uint32_t head_dim, uint32_t stream_kinds) {
  const uint32_t M = cb.levels, per_unit = 2 * M + 3, per_side = M + 1;
  levels.resize(cb.LevelsSize(C));
  cb.AllLevels(C, levels.data());
  // Levels at the integers and no rate term (learning's first pass): plain rounding.
  plain = std::all_of(cb.offsets.begin(), cb.offsets.end(), [](int8_t o) { return o == 0; }) &&
          std::all_of(cb.cost.begin(), cb.cost.end(), [](float c) { return c == 0; });
  if (plain) return;
  thr.resize(size_t{stream_kinds} * 2 * per_side * C);
  // Channels of one codebook group and one rate term (a head's, or a channel
  // class's) share their thresholds: each pair is built once into pair_thr,
  // channel c's at at[c], then spread to the channels.
  const size_t units = cb.cost.size() / per_unit;
  std::vector<float> pair_thr;
  std::vector<int32_t> at(C), unit_at(units);
  std::vector<uint32_t> built_for(units);
  for (uint32_t kind = 0; kind < stream_kinds; ++kind) {
    std::fill(built_for.begin(), built_for.end(), ~0u);
    pair_thr.clear();
    for (uint32_t c = 0; c < C; ++c) {
      const uint32_t group = c / cb.group_channels;
      const float* cost = cb.Cost(std::min(kind, cb.kinds - 1), c, c / head_dim, C);
      const size_t unit = static_cast<size_t>(cost - cb.cost.data()) / per_unit;
      if (built_for[unit] != group) {
        unit_at[unit] = static_cast<int32_t>(pair_thr.size());
        pair_thr.resize(pair_thr.size() + 2 * per_side);
        LloydThresholds(levels.data() + cb.LevelOffset(kind, c), M, cost, &pair_thr[size_t(unit_at[unit])]);
        built_for[unit] = group;
      }
      at[c] = unit_at[unit];
    }
    GatherRows(pair_thr.data(), at.data(), C, 2 * per_side, thr.data() + size_t{kind} * 2 * per_side * C);
  }
}

void SectionAnalysis::QuantizeRowLloyd(const Codebook& cb, const LloydTables& t, const float* row, const float* pred,
                                       const float* st, const float* inv, bool is_delta, int32_t* q, float* rec,
                                       float* level, LloydStats* stats) const {
  const uint32_t C = layout_.channels(), D = layout_.head_dim, M = cb.levels, G = cb.group_channels;
  const uint32_t kind = is_delta ? 1 : 0;
  if (t.plain) {  // plain rounding: levels at the symbols' values
    QuantizeRow(row, pred, st, inv, C, reinterpret_cast<uint32_t*>(q), rec);
    for (uint32_t c = 0; c < C; ++c) {
      q[c] = UnZigZag(static_cast<uint32_t>(q[c]));
      level[c] = static_cast<float>(q[c]);
    }
  } else {
    for (uint32_t c0 = 0; c0 < C;) {  // runs of channels sharing a codebook
      const uint32_t group = c0 / G, c1 = std::min(C, (group + 1) * G);
      const LloydRowInput in{row + c0, pred + c0, st + c0, inv + c0, c1 - c0,
                             t.levels.data() + cb.LevelOffset(kind, c0), M,
                             t.thr.data() + size_t{kind} * 2 * (M + 1) * C + c0, C};
      LloydRow(in, q + c0, rec + c0, level + c0);
      c0 = c1;
    }
  }
  if (!stats) return;
  // What the pass saw, per head: the symbols' histogram, and per codebook
  // group the values each symbol took (for the centroids).
  const size_t bins = stats->bins, per_group = 2 * size_t{M} + 1;
  if (stats->want_distortion) {
    double distortion = stats->distortion;
    for (uint32_t c = 0; c < C; ++c) {
      const float e = (row[c] - pred[c]) * inv[c] - level[c];
      distortion += double(e) * e;
    }
    stats->distortion = distortion;
  }
  for (uint32_t c0 = 0; c0 < C;) {  // runs of channels in one head and one codebook group
    const uint32_t h = c0 / D, g = c0 / G, c1 = std::min({C, (h + 1) * D, (g + 1) * G});
    uint64_t* const hist = stats->hist.data() + (size_t{h} * cb.kinds + kind) * bins;
    const size_t sum_at = (size_t{g} * cb.kinds + kind) * per_group, hist_bank = stats->hist_bank;
    double* const sum = stats->sum.data() + sum_at;
    const size_t sum_bank = stats->sum_bank;
    for (uint32_t c = c0; c < c1; ++c) {
      const size_t bank = c % LloydStats::kBanks;
      const uint32_t u = ZigZag(q[c]);
      ++hist[bank * hist_bank + std::min<size_t>(u, bins - 1)];
      const size_t i = bank * sum_bank + std::min<size_t>(u, per_group);  // 1 <= u <= 2M: a level's entry
      sum[i] += (row[c] - pred[c]) * inv[c];
    }
    c0 = c1;
  }
}

Codebook SectionAnalysis::Learn(float step, bool use_delta, uint32_t sample_every) const {
  Codebook cb;
  if (!layout_.lloyd) return cb;
  const uint32_t H = layout_.kv_heads;
  const uint32_t C = layout_.channels();
  cb.group_channels = layout_.head_dim;  // one codebook per head (measured best, docs/results/eval.md)
  cb.kinds = use_delta ? 2 : 1;
  cb.levels = kMaxCodebookLevels;
  const internal::ProfileData* prof = layout_.profile;
  // (Profile training learns before its tables exist.)
  const int grid = prof && !prof->tables.empty() ? prof->GridIndex(step) : -1;
  auto pass = [&](const Codebook& c, bool last) {
    LloydStats stats(c, H, layout_.head_dim);
    stats.want_distortion = last;
    Quantize<false>(step, use_delta, sample_every, [](bool, const uint32_t*, const float*, const float*) {}, &c,
                    &stats);
    stats.Fold();
    return stats;
  };
  // Offsets at the centroids and the rate term of a pass's assignment
  // (st may have more levels than c).
  auto update = [&](Codebook& c, const LloydStats& st) {
    const uint32_t M = c.levels, sm = (uint32_t(st.bins) - 3) / 2;
    c.offsets.assign(size_t{c.groups(C)} * c.kinds * 2 * M, 0);
    for (size_t gk = 0; gk < size_t{c.groups(C)} * c.kinds; ++gk)
      for (uint32_t u = 1; u <= 2 * M; ++u) {
        const size_t i = gk * (2 * sm + 1) + u;
        if (st.Count(gk, u) == 0) continue;
        const double off = st.sum[i] / double(st.Count(gk, u)) - UnZigZag(u);
        c.offsets[gk * 2 * M + u - 1] = static_cast<int8_t>(std::clamp(std::nearbyint(off * 128), -128.0, 127.0));
      }
    // Per head, or per channel class where the profile's tables are per class.
    const bool classes = grid >= 0 && prof->HasClasses(layout_.section);
    const uint32_t units = grid >= 0 ? prof->TableUnits(layout_.section) : H;
    c.cost.assign(size_t{units} * c.kinds * (2 * M + 3), 0);
    if (classes) c.cost_unit = prof->class_of[layout_.section];
    for (uint32_t h = 0; h < units; ++h)
      for (uint32_t k = 0; k < c.kinds; ++k) {
        float* cost = &c.cost[(size_t{h} * c.kinds + k) * (2 * M + 3)];
        if (grid >= 0) {
          // The profile's table is what the stream will be coded with.
          const rans::FreqTable& t = prof->Table(layout_.section, grid, h, k);
          for (uint32_t u = 0; u < 2 * M + 3; ++u)
            cost[u] = kLloydLambda * (12 - std::log2(float(t.freq[std::min(u, t.escape)])) + (u >= t.escape ? 8 : 0));
          continue;
        }
        const uint64_t* hs = &st.hist[(size_t{h} * c.kinds + k) * st.bins];
        uint64_t n = 0;
        for (size_t u = 0; u < st.bins; ++u) n += hs[u];
        for (uint32_t u = 0; u < 2 * M + 3; ++u)
          cost[u] = kLloydLambda * std::log2((double(n) + 1) / (double(hs[u]) + 0.5));
      }
  };
  // First pass: plain rounding (no rate term, levels at q).
  cb.offsets.assign(size_t{cb.groups(C)} * cb.kinds * 2 * cb.levels, 0);
  cb.cost.assign(size_t{H} * cb.kinds * (2 * cb.levels + 3), 0);
  LloydStats st = pass(cb, true);
  // Magnitudes used often enough to estimate a centroid.
  uint32_t M = 1;
  for (uint32_t m = 1; m <= kMaxCodebookLevels; ++m) {
    uint64_t n = 0;
    for (size_t gk = 0; gk < size_t{cb.groups(C)} * cb.kinds; ++gk)
      n += st.Count(gk, 2 * m - 1) + st.Count(gk, 2 * m);
    if (n >= kCodebookMinCount) M = m;
  }
  cb.levels = M;
  const double j_uniform = st.distortion + kLloydLambda * st.EntropyBits();
  for (int it = 0; it < kLloydPasses; ++it) {
    update(cb, st);
    st = pass(cb, it + 1 == kLloydPasses);
  }
  update(cb, st);
  // Keep the codebook only when it lowers distortion + lambda * rate (side
  // bytes included) against plain rounding at this step: at high rates the
  // centroids sit near the bin centres and the codebook would be overhead.
  // The passes saw one token group in sample_every, so the codebook's bytes
  // count in that share: the whole section pays them once.
  const uint32_t G = use_delta ? layout_.group_tokens : 1;
  const uint32_t groups = (layout_.quantized_tokens() + G - 1) / G;
  const double seen = groups ? double((groups + sample_every - 1) / sample_every) / groups : 1.0;
  const double j_lloyd = st.distortion + kLloydLambda * (st.EntropyBits() + 8.0 * double(cb.bytes(C)) * seen);
  if (!(j_lloyd < j_uniform)) return Codebook{};
  return cb;
}

// Calls visit(is_delta, sym, x, rec) once per quantized token row, in stream
// order (token groups, then tokens): sym holds the row's C zigzagged symbols,
// x the original (rotated) row and rec its reconstruction (nullptr unless
// kNeedRec). The per-row loops make no calls, so the compiler vectorizes them.
// With a codebook, rows go through QuantizeRowLloyd instead (its levels and
// rate term; stats, if given, collects what the pass saw).
template <bool kNeedRec, typename Visit>
void SectionAnalysis::Quantize(float step, bool use_delta, uint32_t sample_every, Visit&& visit, const Codebook* cb,
                               LloydStats* stats) const {
  const SectionLayout& l = layout_;
  const uint32_t C = l.channels(), tq = l.quantized_tokens();
  const uint32_t G = use_delta ? l.group_tokens : 1;
  std::vector<float> anchor(C), st(C), inv(C), rec(kNeedRec ? C : 0), lloyd_rec(cb ? C : 0), level(cb ? C : 0);
  std::vector<int32_t> q(C);
  LloydTables lloyd;
  if (cb && cb->levels) lloyd.Build(*cb, C, l.head_dim, use_delta && G > 1 ? 2 : 1);
  std::vector<uint32_t> sym(C);
  float st_for = -1;
  for (uint32_t g0 = 0, gi = 0; g0 < tq; g0 += G, ++gi) {
    if (sample_every > 1 && gi % sample_every != 0) continue;
    for (uint32_t t = g0; t < std::min(g0 + G, tq); ++t) {
      const float ts = TokenStep(l, step, t);
      if (ts != st_for) {
        for (uint32_t c = 0; c < C; ++c) {
          st[c] = sigma_[c] * ts;
          inv[c] = 1.0f / st[c];
        }
        st_for = ts;
      }
      const float* row = &rows_[size_t{t} * C];
      const bool is_delta = t != g0;
      const float* pred = is_delta ? anchor.data() : mean_.data();
      // An anchor's reconstruction is the prediction of its group's deltas.
      float* out = !is_delta ? anchor.data() : kNeedRec ? rec.data() : nullptr;
      if (cb && cb->levels) {
        if (!out) out = lloyd_rec.data();
        QuantizeRowLloyd(*cb, lloyd, row, pred, st.data(), inv.data(), is_delta, q.data(), out, level.data(), stats);
        for (uint32_t c = 0; c < C; ++c) sym[c] = ZigZag(q[c]);
      } else {
        QuantizeRow(row, pred, st.data(), inv.data(), C, sym.data(), out);
      }
      visit(is_delta, sym.data(), row, kNeedRec ? out : nullptr);
    }
  }
}

double SectionAnalysis::EstimateBytes(float step, bool use_delta, uint32_t sample_every) const {
  QuantizedSection q;
  QuantizeStreams(step, use_delta, sample_every, &q);
  return q.bytes;
}

double SectionAnalysis::FillStreams(float step, bool use_delta, uint32_t sample_every, QuantizedSection* q,
                                    const QuantizedSection* near) const {
  const SectionLayout& l = layout_;
  const uint32_t H = l.kv_heads, D = l.head_dim, tq = l.quantized_tokens();
  const uint32_t G = use_delta ? l.group_tokens : 1;
  sample_every = std::max(1u, sample_every);
  q->step = step;
  q->use_delta = use_delta;
  q->sample_every = sample_every;
  // The codebook is learned on a sample of about kLearnValues values per
  // codebook: centroids and their counts need far fewer values than a large
  // section has, and learning takes three passes over what it reads.
  const uint64_t learn_every = uint64_t{(tq + G - 1) / G} * D / kLearnValues;
  const internal::ProfileData* prof = l.profile;
  if (near && near->sample_every == sample_every && near->use_delta == use_delta && near->step > 0 &&
      std::abs(std::log2(step / near->step)) <= kReuseCodebookOctaves &&
      (!prof || prof->GridIndex(near->step) == prof->GridIndex(step)))
    q->cb = near->cb;
  else
    q->cb = Learn(step, use_delta,
                  sample_every > 1 ? sample_every : static_cast<uint32_t>(std::max<uint64_t>(1, learn_every)));
  q->counts.clear();  // stale once the symbols change
  q->table_costs.clear();
  // Rows of each stream kind in the sampled groups (Quantize's order).
  size_t rows[2] = {0, 0};
  uint32_t groups = 0, sampled = 0;
  for (uint32_t g0 = 0; g0 < tq; g0 += G, ++groups) {
    if (groups % sample_every != 0) continue;
    ++sampled;
    ++rows[0];
    rows[1] += std::min(G, tq - g0) - 1;
  }
  q->begin.resize(size_t{2} * H + 1);
  size_t off = 0;
  for (uint32_t s = 0; s < 2 * H; ++s) {
    q->begin[s] = off;
    off += rows[s & 1] * D;
  }
  q->begin[2 * H] = off;
  if (q->capacity < off) {
    q->symbols.reset(new uint32_t[off]);  // not value-initialised: every symbol is written
    q->capacity = off;
  }
  size_t next[2] = {0, 0};
  Quantize<false>(
      step, use_delta, sample_every,
      [&](bool is_delta, const uint32_t* sym, const float*, const float*) {
        const size_t r = next[is_delta]++;
        for (uint32_t h = 0; h < H; ++h)
          std::memcpy(q->symbols.get() + q->begin[2 * h + is_delta] + r * D, sym + size_t{h} * D, D * sizeof(uint32_t));
      },
      &q->cb);
  return sampled ? double(groups) / sampled : 1.0;
}

void SectionAnalysis::QuantizeStreams(float step, bool use_delta, uint32_t sample_every, QuantizedSection* q,
                                      const QuantizedSection* near) const {
  const double scale = FillStreams(step, use_delta, sample_every, q, near);
  const uint32_t H = layout_.kv_heads;
  const int g = layout_.profile ? layout_.profile->GridIndex(step) : -1;
  // A sample's counts are scaled up to the whole section before the estimate,
  // so per-stream costs (tables, flush bytes) are counted once, not scaled.
  // The counts are kept for Encode.
  double stream_bytes = g >= 0 ? 1 : 0;  // the grid point byte
  q->counts.resize(g >= 0 ? 0 : size_t{H} * 2);
  q->table_costs.resize(g >= 0 && sample_every == 1 ? size_t{H} * 2 : 0);
  for (uint32_t s = 0; s < H * 2; ++s) {
    if ((s & 1) && !use_delta) continue;
    const std::span<const uint32_t> sym(q->symbols.get() + q->begin[s], q->begin[s + 1] - q->begin[s]);
    if (g >= 0) {
      const std::vector<const rans::FreqTable*>& cycle = StreamTables(*layout_.profile, layout_.section, g, s / 2, s & 1);
      if (q->table_costs.empty()) {
        stream_bytes += static_cast<double>(rans::EstimateStreamBytesWithTables(sym, cycle, scale, kTableFormOptions));
        continue;
      }
      // The full data's cost is kept for Encode.
      q->table_costs[s] = rans::CostWithTables(sym, cycle);
      stream_bytes += static_cast<double>(rans::EstimateStreamBytesWithTables(q->table_costs[s], sym.size(),
                                                                              kTableFormOptions));
      continue;
    }
    rans::SymbolCounts& counts = q->counts[s];
    counts.fill(0);
    rans::CountSymbols(sym, counts);
    stream_bytes += static_cast<double>(rans::EstimateStreamBytes(sym, counts, scale));
  }
  q->bytes = stream_bytes + side_info_bytes_ + q->cb.bytes(layout_.channels()) + exact_.size() * 2.0;
}

bool SectionAnalysis::PreferDelta(float step, uint32_t sample_every) const {
  if (layout_.group_tokens <= 1) return false;
  return EstimateBytes(step, true, sample_every) < EstimateBytes(step, false, sample_every * layout_.group_tokens);
}

double SectionAnalysis::MeasureMse(float step, bool use_delta) const {
  const uint32_t C = layout_.channels();
  double err = 0;
  size_t n = 0;
  const Codebook cb = Learn(step, use_delta, 1);
  Quantize<true>(
      step, use_delta, 1,
      [&](bool, const uint32_t*, const float* x, const float* rec) {
        for (uint32_t c = 0; c < C; ++c) err += double(x[c] - rec[c]) * (x[c] - rec[c]);
        n += C;
      },
      &cb);
  for (float v : exact_) {
    const double e = v - RoundToF16(v);
    err += e * e;
  }
  n += exact_.size();
  return n ? err / n : 0;
}

void SectionAnalysis::Encode(float step, bool use_delta, std::vector<uint8_t>* out, uint32_t* side_bytes) const {
  QuantizedSection q;
  FillStreams(step, use_delta, 1, &q);
  Encode(q, out, side_bytes);
}

void SectionAnalysis::Encode(const QuantizedSection& q, std::vector<uint8_t>* out, uint32_t* side_bytes) const {
  const uint32_t H = layout_.kv_heads, C = layout_.channels();
  const float step = q.step;
  const bool use_delta = q.use_delta;
  const Codebook& cb = q.cb;
  out->reserve(out->size() + static_cast<size_t>(q.bytes * 1.01) + 64);
  ByteWriter w(out);
  const size_t start = w.size();
  const internal::ProfileData* prof = layout_.profile;
  const int g = prof ? prof->GridIndex(step) : -1;
  w.U8((use_delta ? kSectionDelta : 0) | (prof ? kSectionProfileStats : 0) | (g >= 0 ? kSectionProfileTables : 0) |
       (cb.levels ? kSectionCodebook : 0));
  w.F32(step);
  if (g >= 0) w.U8(static_cast<uint8_t>(g));
  if (!prof) {
    for (uint32_t c = 0; c < C; ++c) w.U8(sigma_code_[c]);
    for (uint32_t c = 0; c < C; ++c) w.Varint(ZigZag(mean_code_[c]));
  }
  if (cb.levels) {
    w.U8(static_cast<uint8_t>(cb.levels));
    w.Varint(cb.group_channels);
    for (int8_t o : cb.offsets) w.U8(static_cast<uint8_t>(o));
  }
  *side_bytes = static_cast<uint32_t>(w.size() - start);
  auto stream = [&](uint32_t h, uint32_t kind) {
    const size_t s = 2 * h + kind;
    const std::span<const uint32_t> sym(q.symbols.get() + q.begin[s], q.begin[s + 1] - q.begin[s]);
    if (g >= 0)
      return rans::EncodeStreamWithTables(sym, StreamTables(*prof, layout_.section, g, h, kind), w, kTableFormOptions,
                                          q.table_costs.size() > s ? &q.table_costs[s] : nullptr);
    return q.counts.size() > s ? rans::EncodeStream(sym, q.counts[s], w) : rans::EncodeStream(sym, w);
  };
  for (uint32_t h = 0; h < H; ++h) {
    *side_bytes += static_cast<uint32_t>(stream(h, 0));
    if (use_delta) *side_bytes += static_cast<uint32_t>(stream(h, 1));
  }
  for (float v : exact_) w.U16(F32ToF16(v));
}

void SectionAnalysis::Histograms(float step, bool use_delta, size_t bins, std::vector<uint64_t>* hist,
                                 uint32_t sample_every, bool per_channel) const {
  QuantizedSection q;
  FillStreams(step, use_delta, sample_every, &q);
  const uint32_t D = per_channel ? layout_.head_dim : 1;
  hist->assign(size_t{layout_.kv_heads} * 2 * D * bins, 0);
  for (size_t s = 0; s + 1 < q.begin.size(); ++s) {
    if (!per_channel) {
      rans::CountSymbols({q.symbols.get() + q.begin[s], q.begin[s + 1] - q.begin[s]}, {hist->data() + s * bins, bins});
      continue;
    }
    for (size_t i = q.begin[s], d = 0; i < q.begin[s + 1]; ++i, d = d + 1 == D ? 0 : d + 1)
      ++(*hist)[(s * D + d) * bins + std::min<size_t>(q.symbols[i], bins - 1)];
  }
}

}  // namespace cachegen
