// The SIMD decode paths against the scalar ones, selected in-process with
// simd::SetEnabled: the same streams and containers must decode to identical
// output either way. Covers every lane count, lengths around the decoders'
// block sizes (odd, shorter than a block, one symbol), escape symbols, and
// several 8-lane streams decoded together (the AVX2 lockstep groups of 8, 4
// and 2 streams plus a single one, with unequal lengths).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <random>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/profile.h"
#include "codec/cachegen/fused_decode.h"
#include "codec/cachegen/head_transform.h"
#include "codec/cachegen/section_kernels.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/rope.h"
#include "codec/cachegen/section_coder.h"
#include "codec/rans.h"
#include "common/simd.h"
#include "kv/synthetic.h"

namespace cachegen {
namespace {

class SimdParity : public ::testing::Test {
 protected:
  void SetUp() override {
    simd::SetEnabled(true);
    if (!simd::Avx2()) GTEST_SKIP() << "CPU without AVX2/F16C/BMI2 (or CACHEGEN_SIMD=0): only the scalar path exists";
  }
  void TearDown() override { simd::SetEnabled(true); }
};

// Mostly small geometric values, with huge ones (escapes) mixed in when asked.
std::vector<uint32_t> Symbols(size_t n, uint64_t seed, bool escapes) {
  std::mt19937_64 rng(seed);
  std::geometric_distribution<uint32_t> geo(0.35);
  std::vector<uint32_t> v(n);
  for (auto& x : v) {
    x = geo(rng);
    if (escapes && rng() % 50 == 0) x = static_cast<uint32_t>(rng() >> (rng() % 33 + 31));
  }
  return v;
}

std::vector<uint8_t> EncodeAll(const std::vector<std::vector<uint32_t>>& streams, uint32_t lanes) {
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  for (const auto& s : streams) rans::EncodeStream(s, w, {lanes});
  return buf;
}

// Decodes the concatenated streams together (ParseStream + DecodeParsed).
std::vector<std::vector<uint32_t>> DecodeAll(const std::vector<uint8_t>& buf,
                                             const std::vector<std::vector<uint32_t>>& like, bool use_simd) {
  simd::SetEnabled(use_simd);
  ByteReader r(buf);
  std::vector<std::unique_ptr<rans::ParsedStream>> parsed;
  std::vector<std::vector<uint32_t>> out;
  for (const auto& s : like) {
    parsed.push_back(std::make_unique<rans::ParsedStream>());
    out.emplace_back(s.size(), 0xdeadbeef);
    Status st = rans::ParseStream(r, s.size(), parsed.back().get());
    EXPECT_TRUE(st.ok()) << st.message();
  }
  std::vector<rans::ParsedStream*> ps;
  std::vector<uint32_t*> po;
  for (size_t k = 0; k < like.size(); ++k) {
    ps.push_back(parsed[k].get());
    po.push_back(out[k].data());
  }
  Status st = rans::DecodeParsed(ps, po);
  EXPECT_TRUE(st.ok()) << st.message();
  simd::SetEnabled(true);
  return out;
}

// The AVX2 rANS encoder (8 lanes) writes exactly the scalar encoder's bytes:
// lengths around the 8-symbol rounds, skewed and flat alphabets, escapes,
// table mode.
TEST_F(SimdParity, RansEncodeMatchesScalar) {
  std::mt19937_64 rng(21);
  for (size_t n : {8, 9, 15, 16, 17, 64, 1000, 4099, 65536})
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<uint32_t> v = kind == 2 ? Symbols(n, rng(), true) : std::vector<uint32_t>(n);
      if (kind < 2)
        for (auto& x : v) x = kind == 0 ? uint32_t(rng() % 3 == 0) : uint32_t(rng() % 200);
      std::vector<uint64_t> hist(256, 0);
      rans::CountSymbols(v, hist);
      const rans::FreqTable table = rans::MakeFreqTable(hist);
      std::vector<uint8_t> out[2][2];
      for (int avx = 0; avx < 2; ++avx) {
        simd::SetEnabled(avx == 1);
        ByteWriter w0(&out[avx][0]), w1(&out[avx][1]);
        rans::EncodeStream(v, w0);
        rans::EncodeStreamWithTable(v, table, w1);
      }
      EXPECT_EQ(out[0][0], out[1][0]) << "n=" << n << " kind " << kind;
      EXPECT_EQ(out[0][1], out[1][1]) << "table form, n=" << n << " kind " << kind;
    }
}

// Table cycles (channel classes): a cycle whose period is a multiple of 8
// takes the AVX2 rounds, each lane its position's table; any other period
// the scalar loop. Same bytes either way, escapes of each table's own
// threshold included, and the stream decodes back; CostWithTables (the
// AVX2 gathers of symbol costs) gives the scalar sums.
TEST_F(SimdParity, RansCycleEncodeMatchesScalar) {
  std::mt19937_64 rng(29);
  std::vector<rans::FreqTable> tables;
  for (int t = 0; t < 4; ++t) {
    std::vector<uint64_t> hist(8 + 6 * t, 0);
    for (uint64_t& h : hist) h = 1 + rng() % (50 << t);
    tables.push_back(rans::MakeFreqTable(hist));
  }
  std::vector<std::unique_ptr<rans::DecodeTable>> decode;
  for (const rans::FreqTable& t : tables) {
    decode.push_back(std::make_unique<rans::DecodeTable>());
    rans::BuildDecodeTable(t, decode.back().get());
  }
  for (size_t period : {8, 12, 64})
    for (size_t n : {9, 64, 1000, 4099}) {
      std::vector<const rans::FreqTable*> cycle(period);
      std::vector<const rans::DecodeTable*> dcycle(period);
      for (size_t p = 0; p < period; ++p) {
        const size_t t = rng() % tables.size();
        cycle[p] = &tables[t];
        dcycle[p] = decode[t].get();
      }
      std::vector<uint32_t> v(n);
      for (uint32_t& x : v) x = rng() % 40 == 0 ? uint32_t(rng() % 300) : uint32_t(rng() % 8);
      std::vector<uint8_t> out[2];
      rans::TableStreamCost cost[2];
      for (int avx = 0; avx < 2; ++avx) {
        simd::SetEnabled(avx == 1);
        ByteWriter w(&out[avx]);
        rans::EncodeStreamWithTables(v, cycle, w);
        cost[avx] = rans::CostWithTables(v, cycle);
      }
      const std::string at = "period " + std::to_string(period) + " n " + std::to_string(n);
      ASSERT_EQ(out[0], out[1]) << at;
      EXPECT_EQ(cost[0].bits, cost[1].bits) << at;  // the same sums in the same order
      EXPECT_EQ(cost[0].escape_bytes, cost[1].escape_bytes) << at;
      EXPECT_EQ(cost[0].constant, cost[1].constant) << at;
      if (n >= 1000) {  // values up to 300 against escapes of 8-26
        EXPECT_GT(cost[1].escape_bytes, 0u) << at;
      }
      ByteReader r(out[1]);
      std::vector<uint32_t> back(n);
      ASSERT_TRUE(rans::DecodeStreamWithTables(r, dcycle, back).ok()) << at;
      EXPECT_EQ(back, v) << at;
    }
}

TEST_F(SimdParity, RansEveryLaneCountAndLength) {
  const size_t lengths[] = {1, 2, 7, 8, 9, 63, 64, 65, 71, 127, 128, 129, 200, 511, 1031, 4099};
  for (uint32_t lanes = 1; lanes <= rans::kMaxLanes; ++lanes)
    for (size_t n : lengths)
      for (bool esc : {false, true}) {
        const std::vector<std::vector<uint32_t>> s = {Symbols(n, lanes * 1000 + n, esc)};
        const std::vector<uint8_t> buf = EncodeAll(s, lanes);
        const auto scalar = DecodeAll(buf, s, false);
        const auto vec = DecodeAll(buf, s, true);
        ASSERT_EQ(scalar, s) << "lanes " << lanes << " n " << n << " escapes " << esc;
        ASSERT_EQ(vec, s) << "lanes " << lanes << " n " << n << " escapes " << esc;
      }
}

TEST_F(SimdParity, RansStreamGroups) {
  // 1..19 streams of 8 lanes: groups of 8, then 4, 2 and a single stream;
  // of one lane: groups of 4, then 2 and 1. Unequal lengths so grouped
  // streams finish at different points, some shorter than a lockstep block.
  for (uint32_t lanes : {8u, 1u})
    for (size_t count = 1; count <= 19; ++count) {
      std::vector<std::vector<uint32_t>> s;
      for (size_t k = 0; k < count; ++k)
        s.push_back(Symbols(k % 4 == 3 ? 5 + k : 300 + 97 * ((k * 7) % 5) + k, count * 100 + k, k % 3 == 1));
      if (count == 5) s[2] = std::vector<uint32_t>(100, 4);  // a constant stream in the middle of a group
      const std::vector<uint8_t> buf = EncodeAll(s, lanes);
      const auto scalar = DecodeAll(buf, s, false);
      const auto vec = DecodeAll(buf, s, true);
      ASSERT_EQ(scalar, s) << count << " streams of " << lanes << " lanes";
      ASSERT_EQ(vec, s) << count << " streams of " << lanes << " lanes";
    }
}

// Flipped bytes in streams decoded in lockstep groups (8-lane and one-lane):
// the scalar and AVX2 paths and each stream decoded alone reach the same
// verdict and, where they accept, the same symbols.
TEST_F(SimdParity, RansCorruptPayloadFailsOnBothPaths) {
  for (uint32_t lanes : {8u, 1u}) {
    SCOPED_TRACE(std::to_string(lanes) + " lanes");
    std::vector<std::vector<uint32_t>> s;
    for (int k = 0; k < 8; ++k) s.push_back(Symbols(2000, 77 + k, true));
    std::vector<uint8_t> buf = EncodeAll(s, lanes);
    std::mt19937_64 rng(5);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint8_t> bad = buf;
      bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      Status results[2];
      std::vector<std::vector<uint32_t>> outs[2];
      for (int simd_on = 0; simd_on < 2; ++simd_on) {
        simd::SetEnabled(simd_on);
        ByteReader r(bad);
        std::vector<std::unique_ptr<rans::ParsedStream>> parsed;
        std::vector<rans::ParsedStream*> ps;
        std::vector<uint32_t*> po;
        outs[simd_on].assign(s.size(), std::vector<uint32_t>(2000, 0));
        Status st;
        for (size_t k = 0; k < s.size() && st.ok(); ++k) {
          parsed.push_back(std::make_unique<rans::ParsedStream>());
          st = rans::ParseStream(r, 2000, parsed.back().get());
          ps.push_back(parsed.back().get());
          po.push_back(outs[simd_on][k].data());
        }
        if (st.ok()) st = rans::DecodeParsed(ps, po);
        results[simd_on] = st;
      }
      simd::SetEnabled(true);
      // Each stream alone (DecodeStream: no group), until the first failure.
      Status alone;
      {
        ByteReader r(bad);
        for (size_t k = 0; k < s.size() && alone.ok(); ++k) {
          std::vector<uint32_t> o(2000);
          alone = rans::DecodeStream(r, o);
        }
      }
      // Same verdict; where both accept, the same symbols.
      ASSERT_EQ(results[0].ok(), results[1].ok()) << "trial " << trial << ": " << results[0].message() << " / "
                                                  << results[1].message();
      ASSERT_EQ(results[0].ok(), alone.ok()) << "trial " << trial << ": " << results[0].message() << " / "
                                             << alone.message();
      if (results[0].ok()) {
        ASSERT_EQ(outs[0], outs[1]) << "trial " << trial;
      }
    }
  }
}

// Streams coded with a cycle of 8 tables (channel classes of 8-dim heads),
// decoded together (lockstep groups of one-lane streams, AVX2 groups of
// 8-lane streams; mixed lengths, escapes, a constant stream) with and without
// SIMD: the symbols encoded. Flipped bytes: the same verdict with and
// without SIMD and as the streams decoded one by one, and where all accept,
// the same symbols.
TEST_F(SimdParity, RansTableCycleGroups) {
  constexpr size_t kPeriod = 8;
  std::vector<rans::FreqTable> tables;
  std::vector<rans::DecodeTable> decode(kPeriod);
  std::vector<const rans::FreqTable*> cycle;
  std::vector<const rans::DecodeTable*> decode_cycle;
  for (size_t p = 0; p < kPeriod; ++p) {
    std::vector<uint64_t> hist(4 + 4 * p, 0);
    rans::CountSymbols(Symbols(4000, 900 + p, false), hist);
    tables.push_back(rans::MakeFreqTable(hist));
  }
  for (size_t p = 0; p < kPeriod; ++p) {
    cycle.push_back(&tables[p]);
    rans::BuildDecodeTable(tables[p], &decode[p]);
    decode_cycle.push_back(&decode[p]);
  }
  auto decode_all = [&](const std::vector<uint8_t>& buf, const std::vector<size_t>& lengths, bool use_simd,
                        bool together, std::vector<std::vector<uint32_t>>* out) {
    simd::SetEnabled(use_simd);
    out->assign(lengths.size(), {});
    ByteReader r(buf);
    std::vector<rans::TableStream> ts(lengths.size());
    std::vector<rans::TableStream*> tp;
    Status st;
    for (size_t k = 0; k < lengths.size() && st.ok(); ++k) {
      (*out)[k].assign(lengths[k], 0);
      if (together) {
        st = rans::ParseStreamWithTables(r, decode_cycle, (*out)[k], &ts[k]);
        tp.push_back(&ts[k]);
      } else {
        st = rans::DecodeStreamWithTables(r, decode_cycle, (*out)[k]);
      }
    }
    if (st.ok() && together) st = rans::DecodeStreamsWithTables(tp);
    simd::SetEnabled(true);
    return st;
  };
  for (uint32_t lanes : {8u, 1u})
    for (size_t count = 1; count <= 9; ++count) {
      SCOPED_TRACE(std::to_string(count) + " streams of " + std::to_string(lanes) + " lanes");
      std::vector<std::vector<uint32_t>> s;
      std::vector<size_t> lengths;
      std::vector<uint8_t> buf;
      ByteWriter w(&buf);
      for (size_t k = 0; k < count; ++k) {
        const size_t n = k % 4 == 3 ? 8 * (k + 1) : k % 2 ? 1024 : 1024 + 64 * (k % 3);
        s.push_back(count == 5 && k == 2 ? std::vector<uint32_t>(n, 3) : Symbols(n, count * 100 + k, k % 3 == 1));
        lengths.push_back(n);
        rans::EncodeStreamWithTables(s.back(), cycle, w, {.lanes = lanes});
      }
      std::vector<std::vector<uint32_t>> out;
      for (bool use_simd : {false, true}) {
        ASSERT_TRUE(decode_all(buf, lengths, use_simd, true, &out).ok()) << use_simd;
        ASSERT_EQ(out, s) << use_simd;
      }
      if (count != 8) continue;
      std::mt19937_64 rng(lanes);
      for (int trial = 0; trial < 100; ++trial) {
        std::vector<uint8_t> bad = buf;
        bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
        std::vector<std::vector<uint32_t>> a, b, c;
        const Status sa = decode_all(bad, lengths, false, true, &a), sb = decode_all(bad, lengths, true, true, &b),
                     sc = decode_all(bad, lengths, true, false, &c);
        ASSERT_EQ(sa.ok(), sb.ok()) << trial << ": " << sa.message() << " / " << sb.message();
        ASSERT_EQ(sa.ok(), sc.ok()) << trial << ": " << sa.message() << " / " << sc.message();
        if (sa.ok()) {
          ASSERT_EQ(a, b) << trial;
          ASSERT_EQ(a, c) << trial;
        }
      }
    }
}

// Key RoPE settings of the cases below.
RopeConfig Rope(RopeConfig::Kind kind, uint32_t dims) {
  RopeConfig r;
  r.kind = kind;
  r.dims = dims;
  r.freq_base = 10000.0;
  return r;
}

// The value-form decode table (what the fused section decoder reads) says
// what the symbol-form one says, with each symbol's zigzag-decoded value and
// the escape marked -128; built the same with AVX2 and scalar code.
TEST_F(SimdParity, ValueFormTablesMatchSymbolTables) {
  const std::vector<std::vector<uint32_t>> s = {Symbols(3000, 4, true)};
  const std::vector<uint8_t> buf = EncodeAll(s, 8);
  auto parse = [&](rans::TableForm form, bool use_simd) {
    simd::SetEnabled(use_simd);
    auto p = std::make_unique<rans::ParsedStream>();
    ByteReader r(buf);
    EXPECT_TRUE(rans::ParseStream(r, s[0].size(), p.get(), form).ok());
    simd::SetEnabled(true);
    return p;
  };
  const auto sym = parse(rans::TableForm::kSymbols, true);
  const auto val = parse(rans::TableForm::kZigZagValues, true);
  const auto val_scalar = parse(rans::TableForm::kZigZagValues, false);
  ASSERT_EQ(sym->mode, rans::kModeRans);
  for (uint32_t slot = 0; slot < rans::kProbScale; ++slot) {
    const uint32_t a = sym->table.entry[slot], b = val->table.entry[slot];
    ASSERT_EQ(b, val_scalar->table.entry[slot]) << slot;
    const uint32_t v = a & 0xff;
    const int32_t q = v == sym->escape ? -128 : static_cast<int32_t>(v >> 1) ^ -static_cast<int32_t>(v & 1);
    EXPECT_EQ(static_cast<int32_t>(b) >> 24, q) << slot;
    EXPECT_EQ((b >> 12) & 0xfff, (a >> 8) & 0xfff) << slot;  // freq - 1
    EXPECT_EQ(b & 0xfff, a >> 20) << slot;                    // slot offset
  }
}

// Decodes a section payload into f16, bf16 and f32 rows with SIMD on or off
// (keys with RoPE redone when rope is given).
struct SectionOut {
  bool ok = false;
  std::vector<uint8_t> f16, bf16;
  std::vector<float> f32;
  uint64_t fused = 0;  // batches the three decodes took through the fused path
};
SectionOut DecodeSection(const SectionLayout& l, std::span<const uint8_t> payload, bool use_simd,
                         KVPaging paging = {}, const RopeTable* rope = nullptr) {
  simd::SetEnabled(use_simd);
  SectionOut o;
  const KVShape shape{1, l.kv_heads, l.head_dim, l.tokens};
  // Paged: room for whole pages.
  const uint32_t rows = paging.page_tokens ? static_cast<uint32_t>(paging.page_offsets.size()) * paging.page_tokens
                                           : l.tokens;
  o.f16.assign(size_t{rows} * l.channels() * 2, 0xee);
  o.bf16.assign(size_t{l.tokens} * l.channels() * 2, 0xee);
  o.f32.assign(size_t{l.tokens} * l.channels(), -1.0f);
  const KVView v16(o.f16.data(), DType::kF16, shape, ContiguousStrides(shape), paging);
  const KVView vb16(o.bf16.data(), DType::kBF16, shape, ContiguousStrides(shape));
  const uint64_t fused0 = internal::FusedBatchesOnThisThread();
  o.ok = DecodeCacheGenSection(l, payload, SectionSink{v16, 0, KV::kKey, rope}).ok();
  o.ok = DecodeCacheGenSection(l, payload, SectionSink{vb16, 0, KV::kKey, rope}).ok() && o.ok;
  o.ok = DecodeCacheGenSection(l, payload, o.f32, rope).ok() && o.ok;
  o.fused = internal::FusedBatchesOnThisThread() - fused0;
  simd::SetEnabled(true);
  return o;
}

// Section payloads straight into the section decoder (no container
// checksum in front): intact, with flipped bytes, and with a step so large
// that values overflow to Inf and NaN; without RoPE and as keys with normal
// and NeoX RoPE; groups of 2 and 3 tokens. The AVX2 paths (the fused one
// among them) and the scalar one must agree on the verdict and, where they
// accept, on every output byte.
TEST_F(SimdParity, SectionPayloadsDecodeIdentically) {
  int accepted = 0;
  for (uint32_t group : {2u, 3u})
    for (RopeConfig::Kind kind : {RopeConfig::Kind::kNone, RopeConfig::Kind::kNormal, RopeConfig::Kind::kNeox}) {
      SectionLayout l;
      l.tokens = 37;  // odd: the last delta group is short
      l.kv_heads = 5;  // with deltas: a batch of 4 heads and one of 1
      l.head_dim = 32;
      l.group_tokens = group;
      l.recent_begin = 29;  // a group straddles the finer recent step
      l.recent_step_scale = 0.5f;
      std::optional<RopeTable> table;
      if (kind != RopeConfig::Kind::kNone) table.emplace(Rope(kind, 32), 100, l.tokens);
      const RopeTable* rope = table ? &*table : nullptr;
      std::mt19937_64 rng(21);
      std::vector<float> rows(size_t{l.tokens} * l.channels());
      for (size_t i = 0; i < rows.size(); ++i)
        rows[i] = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 400.0f + (i % 29 == 3 ? 6.0f : 0.0f);
      const SectionAnalysis a(l, rows);
      for (bool delta : {true, false})
        for (float step : {0.02f, 0.6f}) {
          std::vector<uint8_t> payload;
          uint32_t side = 0;
          a.Encode(step, delta, &payload, &side);
          std::vector<std::vector<uint8_t>> variants = {payload};
          std::vector<uint8_t> huge = payload;
          const float big = 1e30f;
          std::memcpy(&huge[1], &big, 4);  // the section step follows the flags byte
          variants.push_back(huge);
          for (int t = 0; t < 60; ++t) {
            std::vector<uint8_t> bad = payload;
            bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
            variants.push_back(std::move(bad));
          }
          for (size_t i = 0; i < variants.size(); ++i) {
            const SectionOut scalar = DecodeSection(l, variants[i], false, {}, rope);
            const SectionOut vec = DecodeSection(l, variants[i], true, {}, rope);
            const std::string what = "G " + std::to_string(group) + " rope " + std::to_string(int(kind)) + " delta " +
                                     std::to_string(delta) + " step " + std::to_string(step) + " variant " +
                                     std::to_string(i);
            ASSERT_EQ(scalar.ok, vec.ok) << what;
            if (i < 2) {
              ASSERT_TRUE(vec.ok) << what;
            }
            if (i == 0) {
              // 5 heads: batches of 4 + 1 heads with deltas, one of 5 without.
              EXPECT_EQ(vec.fused, delta ? 6u : 3u) << what;
              EXPECT_EQ(scalar.fused, 0u) << what;
            }
            if (!vec.ok) continue;
            accepted++;
            ASSERT_EQ(scalar.f16, vec.f16) << what;
            ASSERT_EQ(scalar.bf16, vec.bf16) << what;
            ASSERT_EQ(0, std::memcmp(scalar.f32.data(), vec.f32.data(), vec.f32.size() * sizeof(float))) << what;
          }
        }
    }
  EXPECT_GT(accepted, 48);
}

// Which RoPE layouts the fused path takes (pairs in whole 8-dim blocks) and
// which it leaves to the generic path; the bytes agree either way.
TEST_F(SimdParity, FusedPathRopeCoverage) {
  using K = RopeConfig::Kind;
  struct Case {
    RopeConfig rope;
    bool fused;
  };
  const Case cases[] = {{Rope(K::kNormal, 64), true},  {Rope(K::kNormal, 16), true},
                        {Rope(K::kNormal, 12), false}, {Rope(K::kNeox, 64), true},
                        {Rope(K::kNeox, 16), true},    {Rope(K::kNeox, 24), false},
                        {Rope(K::kNeox, 8), false}};
  SectionLayout l;
  l.tokens = 9;
  l.kv_heads = 2;
  l.head_dim = 64;
  l.group_tokens = 2;
  l.recent_begin = l.tokens;
  std::mt19937_64 rng(5);
  std::vector<float> rows(size_t{l.tokens} * l.channels());
  for (float& v : rows) v = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 300.0f;
  std::vector<uint8_t> payload;
  uint32_t side = 0;
  SectionAnalysis(l, rows).Encode(0.1f, true, &payload, &side);
  for (const Case& c : cases) {
    const RopeTable table(c.rope, 7, l.tokens);
    const SectionOut scalar = DecodeSection(l, payload, false, {}, &table);
    const SectionOut vec = DecodeSection(l, payload, true, {}, &table);
    ASSERT_TRUE(scalar.ok && vec.ok);
    EXPECT_EQ(vec.fused, c.fused ? 3u : 0u) << int(c.rope.kind) << "/" << c.rope.dims;
    EXPECT_EQ(scalar.f16, vec.f16) << int(c.rope.kind) << "/" << c.rope.dims;
    EXPECT_EQ(scalar.bf16, vec.bf16) << int(c.rope.kind) << "/" << c.rope.dims;
    EXPECT_EQ(0, std::memcmp(scalar.f32.data(), vec.f32.data(), vec.f32.size() * sizeof(float)));
  }
}

// Section payloads coded with a model profile as `profile train` makes it by
// default (profile tables, channel classes, lloyd codebooks, key and value
// head transforms, keys with RoPE), at a fine and a coarse step, intact and
// with a byte flipped: the fused schedule takes them and gives the scalar
// reference's verdict and bytes in every dtype. (Whole containers of every
// feature combination: schedule_parity_test.cc.)
TEST_F(SimdParity, ProfileSectionsDecodeIdenticallyOnTheFusedPath) {
  using K = RopeConfig::Kind;
  struct Case {
    RopeConfig rope;
    uint32_t group_tokens;
    bool value_classes;
  };
  const Case cases[] = {
      {Rope(K::kNormal, 64), 0, false},  // the default quality path (G = 2)
      {Rope(K::kNeox, 64), 3, true},     // groups of 3, V classes too
      {RopeConfig{}, 1, false},          // no deltas, no RoPE
      {Rope(K::kNormal, 40), 0, false},  // RoPE dims across 8-dim blocks
  };
  const KVShape train_shape{2, 3, 64, 512};
  for (const Case& c : cases) {
    const KVTensor kv = *SyntheticKV(train_shape, DType::kF16, 77);
    CodecConfig cfg;
    cfg.codec = "cachegen";
    cfg.rope = c.rope;
    cfg.group_tokens = c.group_tokens;
    cfg.quantizer = CodecConfig::Quantizer::kLloyd;
    ProfileTrainOptions o;
    o.value_transform = true;
    o.value_channel_classes = c.value_classes;
    const KVTensor train = kv.Slice(0, 256);
    const KVView views[] = {train.view()};
    auto prof = Profile::Train(views, cfg, o);
    ASSERT_TRUE(prof.ok()) << prof.status().ToString();
    const KVTensor held_out = kv.Slice(256, 256);
    const std::string what = "rope " + std::to_string(int(c.rope.kind)) + "/" + std::to_string(c.rope.dims) + " G " +
                             std::to_string(c.group_tokens);

    // Section payloads of the profile's K and V sections of layer 1, intact
    // and with flipped bytes: the same verdict and output on both paths.
    std::optional<RopeTable> rope_table;
    if (c.rope.kind != K::kNone) rope_table.emplace(c.rope, 256, 256);
    std::mt19937_64 rng(3);
    int fused_sections = 0;
    for (uint32_t section : {2u, 3u}) {
      SectionLayout l;
      l.tokens = 256;
      l.kv_heads = train_shape.kv_heads;
      l.head_dim = train_shape.head_dim;
      l.group_tokens = (*prof)->data().group_tokens;
      l.recent_begin = l.tokens;
      l.profile = &(*prof)->data();
      l.section = section;
      l.lloyd = true;
      l.SetProfileTransform();
      ASSERT_NE(l.transform, nullptr);
      std::vector<float> rows(size_t{l.tokens} * l.channels());
      for (uint32_t t = 0; t < l.tokens; ++t)
        for (uint32_t h = 0; h < l.kv_heads; ++h)
          for (uint32_t d = 0; d < l.head_dim; ++d)
            rows[(size_t{t} * l.kv_heads + h) * l.head_dim + d] =
                held_out.view().Get(1, section % 2 ? KV::kValue : KV::kKey, t, h, d);
      std::vector<float> coded(rows.size());
      for (uint32_t t = 0; t < l.tokens; ++t)
        for (uint32_t h = 0; h < l.kv_heads; ++h) {
          const size_t at = (size_t{t} * l.kv_heads + h) * l.head_dim;
          HeadToCoding(l.transform + size_t{h} * l.head_dim * l.head_dim, &rows[at], &coded[at], l.head_dim);
        }
      const SectionAnalysis a(l, coded);
      const RopeTable* rope = section % 2 == 0 && rope_table ? &*rope_table : nullptr;
      for (float step : {0.25f, 1.0f}) {
        std::vector<uint8_t> payload;
        uint32_t side = 0;
        a.Encode(step, c.group_tokens != 1, &payload, &side);
        for (int variant = 0; variant < 25; ++variant) {
          std::vector<uint8_t> bytes_v = payload;
          if (variant > 0) bytes_v[rng() % bytes_v.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
          const SectionOut scalar = DecodeSection(l, bytes_v, false, {}, rope);
          const SectionOut vec = DecodeSection(l, bytes_v, true, {}, rope);
          const std::string at = what + " section " + std::to_string(section) + " step " + std::to_string(step) +
                                 " variant " + std::to_string(variant);
          ASSERT_EQ(scalar.ok, vec.ok) << at;
          if (variant == 0) {
            ASSERT_TRUE(vec.ok) << at;
            fused_sections += vec.fused > 0;
          }
          if (!vec.ok) continue;
          ASSERT_EQ(scalar.f16, vec.f16) << at;
          ASSERT_EQ(scalar.bf16, vec.bf16) << at;
          ASSERT_EQ(0, std::memcmp(scalar.f32.data(), vec.f32.data(), vec.f32.size() * sizeof(float))) << at;
        }
      }
    }
    EXPECT_GT(fused_sections, 0) << what;
  }
}

// The lloyd quantizer's row kernel: the AVX2 form chooses the scalar form's
// symbols, levels and reconstructions bit for bit, for every codebook size,
// row lengths around the 8-lane blocks, values far outside the codebook,
// zeros of both signs and exact ties between candidates (integer levels,
// zero costs: the smaller magnitude wins). The choice itself is checked in
// SectionKernels.LloydChoiceIsTheLeastCost.
TEST_F(SimdParity, LloydRowMatchesScalar) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (uint32_t M = 1; M <= kMaxCodebookLevels; ++M)
    for (uint32_t n : {1u, 7u, 8u, 13u, 64u}) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool ties = variant == 3;
        std::vector<float> levels(2 * M + 1), cost(3 * (2 * M + 3));
        levels[0] = 0;
        for (uint32_t u = 1; u <= 2 * M; ++u)
          levels[u] = static_cast<float>(UnZigZag(u)) + (ties ? 0.0f : 0.4f * unit(rng));
        for (float& c : cost) c = ties ? 0.0f : 0.3f * std::abs(unit(rng));
        // Each channel takes one of three rate terms' thresholds.
        std::vector<float> unit_thr(3 * 2 * (M + 1)), thr(2 * (M + 1) * size_t{n});
        for (uint32_t unit = 0; unit < 3; ++unit)
          LloydThresholds(levels.data(), M, &cost[unit * (2 * M + 3)], &unit_thr[unit * 2 * (M + 1)]);
        for (uint32_t c = 0; c < n; ++c) {
          const uint32_t unit = rng() % 3;
          for (uint32_t i = 0; i < 2 * (M + 1); ++i) thr[i * n + c] = unit_thr[unit * 2 * (M + 1) + i];
        }
        std::vector<float> row(n), pred(n), st(n), inv(n);
        for (uint32_t c = 0; c < n; ++c) {
          st[c] = 0.05f + std::abs(unit(rng));
          inv[c] = 1.0f / st[c];
          pred[c] = unit(rng);
          const float steps = ties ? float(int(rng() % (2 * M + 4)) - int(M + 2)) + 0.5f
                              : variant == 1 ? 1000.0f * unit(rng)
                                             : float(M + 2) * unit(rng);
          row[c] = rng() % 16 == 0 ? pred[c] : pred[c] + steps * st[c];
          if (variant == 2 && c % 5 == 0) row[c] = -0.0f, pred[c] = 0.0f;
        }
        const LloydRowInput in{row.data(), pred.data(), st.data(), inv.data(), n, levels.data(), M, thr.data(), n};
        std::vector<int32_t> q0(n), q1(n);
        std::vector<float> rec0(n), rec1(n), lev0(n), lev1(n);
        LloydRowScalar(in, q0.data(), rec0.data(), lev0.data());
        LloydRow(in, q1.data(), rec1.data(), lev1.data());
        const std::string at = "M " + std::to_string(M) + " n " + std::to_string(n) + " variant " +
                               std::to_string(variant);
        ASSERT_EQ(q0, q1) << at;
        ASSERT_EQ(0, std::memcmp(rec0.data(), rec1.data(), n * sizeof(float))) << at;
        ASSERT_EQ(0, std::memcmp(lev0.data(), lev1.data(), n * sizeof(float))) << at;
      }
    }
}

// Spreading shared rows to channels (the lloyd thresholds): the AVX2 gathers
// give the scalar copy, tails included.
TEST_F(SimdParity, GatherRowsMatchesScalar) {
  std::mt19937 rng(5);
  std::vector<float> table(64);
  for (float& v : table) v = float(rng() % 1000) - 500.0f;
  for (uint32_t n : {1u, 7u, 8u, 13u, 64u})
    for (uint32_t rows : {1u, 3u, 18u}) {
      std::vector<int32_t> at(n);
      for (int32_t& a : at) a = static_cast<int32_t>(rng() % (table.size() - rows + 1));
      std::vector<float> slow(size_t{n} * rows), fast(slow.size());
      simd::SetEnabled(false);
      GatherRows(table.data(), at.data(), n, rows, slow.data());
      simd::SetEnabled(true);
      GatherRows(table.data(), at.data(), n, rows, fast.data());
      EXPECT_EQ(slow, fast) << "n " << n << " rows " << rows;
      EXPECT_EQ(slow[size_t{rows - 1} * n + n - 1], table[at[n - 1] + rows - 1]);
    }
}

// A profile's head transforms: the AVX2 kernel (registers of 8 outputs, 4 at a
// time) and the AVX-512 one (16 outputs) give the scalar loop's bits (a chain
// of fused multiply-adds per output) for every head dim, tails included.
TEST_F(SimdParity, HeadTransformMatchesScalar) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (uint32_t d : {1u, 7u, 8u, 24u, 32u, 40u, 64u, 72u, 128u, 256u}) {
    std::vector<float> a(size_t{d} * d), in(d), fast(d), slow(d);
    for (float& v : a) v = normal(rng);
    for (float& v : in) v = normal(rng) * 100;
    simd::SetEnabled(false);
    TransposeTimes(a.data(), in.data(), slow.data(), d);
    simd::SetEnabled(true);
    for (bool avx512 : {false, true}) {
      simd::SetAvx512Enabled(avx512);
      TransposeTimes(a.data(), in.data(), fast.data(), d);
      EXPECT_EQ(std::memcmp(fast.data(), slow.data(), d * sizeof(float)), 0) << "d " << d << " avx512 " << avx512;
    }
    simd::SetAvx512Enabled(true);
    // Several rows at once, packed or strided (the encoder's rows of one head
    // among a token's heads): each row the single-row bits, the gaps between
    // rows left as they were.
    for (uint32_t rows : {1u, 2u, 3u, 4u, 5u, 9u})
      for (size_t stride : {size_t{d}, size_t{d} * 3 + 1}) {
        std::vector<float> many(rows * stride), outs(rows * stride, -7.0f);
        for (float& v : many) v = normal(rng) * 10;
        for (bool avx512 : {false, true}) {
          simd::SetAvx512Enabled(avx512);
          TransposeTimesRows(a.data(), many.data(), outs.data(), d, rows, stride);
          for (uint32_t i = 0; i < rows; ++i) {
            simd::SetEnabled(false);
            TransposeTimes(a.data(), many.data() + i * stride, slow.data(), d);
            simd::SetEnabled(true);
            EXPECT_EQ(std::memcmp(outs.data() + i * stride, slow.data(), d * sizeof(float)), 0)
                << "d " << d << " rows " << rows << " stride " << stride << " row " << i << " avx512 " << avx512;
          }
          for (size_t at = 0; at < outs.size(); ++at)
            if (at % stride >= d) {
              ASSERT_EQ(outs[at], -7.0f) << "d " << d << " stride " << stride << " at " << at;
            }
        }
        simd::SetAvx512Enabled(true);
      }
    TransposeTimes(a.data(), in.data(), fast.data(), d);
    simd::SetEnabled(false);
    TransposeTimes(a.data(), in.data(), slow.data(), d);
    simd::SetEnabled(true);
    double want = 0;  // and it is A^T in: output 0 against a double sum
    for (uint32_t r = 0; r < d; ++r) want += double(a[size_t{r} * d]) * in[r];
    EXPECT_NEAR(slow[0], want, 1e-3 * (1 + std::abs(want))) << "d " << d;
  }
}

// RoPE redone (decoder) and undone (encoder) on one head: the AVX2 rotation
// gives the scalar loop's bits, normal and NeoX, whole and partial dims.
TEST_F(SimdParity, RopeApplyMatchesScalar) {
  using K = RopeConfig::Kind;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  for (const RopeConfig& rope : {Rope(K::kNormal, 64), Rope(K::kNormal, 40), Rope(K::kNormal, 12),
                                 Rope(K::kNeox, 64), Rope(K::kNeox, 32), Rope(K::kNeox, 24)}) {
    const RopeTable table(rope, 1000, 9);
    for (bool inverse : {false, true})
      for (uint32_t t = 0; t < 9; ++t) {
        std::vector<float> x(64);
        for (float& v : x) v = normal(rng) * 10;
        std::vector<float> fast = x, slow = x;
        simd::SetEnabled(false);
        table.Apply(t, slow.data(), inverse);
        simd::SetEnabled(true);
        table.Apply(t, fast.data(), inverse);
        ASSERT_EQ(0, std::memcmp(fast.data(), slow.data(), 64 * sizeof(float)))
            << int(rope.kind) << "/" << rope.dims << " inverse " << inverse;
      }
  }
}

// Paged output (rows addressed through a page table): the same values as a
// contiguous view.
TEST_F(SimdParity, SectionIntoPagedView) {
  SectionLayout l;
  l.tokens = 50;
  l.kv_heads = 4;
  l.head_dim = 64;
  l.group_tokens = 2;
  std::mt19937_64 rng(8);
  std::vector<float> rows(size_t{l.tokens} * l.channels());
  for (float& v : rows) v = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 300.0f;
  std::vector<uint8_t> payload;
  uint32_t side = 0;
  SectionAnalysis(l, rows).Encode(0.1f, true, &payload, &side);
  // Pages of 4 tokens in reverse order.
  const uint32_t pages = (l.tokens + 3) / 4;
  std::vector<int64_t> offsets(pages);
  for (uint32_t p = 0; p < pages; ++p) offsets[p] = int64_t{pages - 1 - p} * 4 * l.channels();
  const SectionOut flat = DecodeSection(l, payload, true);
  const SectionOut paged = DecodeSection(l, payload, true, KVPaging{4, offsets});
  ASSERT_TRUE(flat.ok && paged.ok);
  const size_t row = size_t{l.channels()} * 2;
  for (uint32_t t = 0; t < l.tokens; ++t) {
    const size_t at = size_t(offsets[t / 4]) * 2 + (t % 4) * row;
    ASSERT_EQ(0, std::memcmp(flat.f16.data() + t * row, paged.f16.data() + at, row)) << "token " << t;
  }
}

}  // namespace
}  // namespace cachegen
