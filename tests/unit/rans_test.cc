// rANS stream tests: round trips, compression vs entropy, estimate accuracy,
// and hostile input (every byte flip, every truncation, garbage tables).
#include "codec/rans.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include "common/simd.h"

namespace cachegen::rans {
namespace {

std::vector<uint8_t> Encode(const std::vector<uint32_t>& v, uint32_t lanes = kDefaultLanes) {
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  EncodeStream(v, w, {lanes});
  return buf;
}

void RoundTrip(const std::vector<uint32_t>& v, uint32_t lanes = kDefaultLanes) {
  std::vector<uint8_t> buf = Encode(v, lanes);
  buf.push_back(0xAB);  // trailing byte must not be consumed
  ByteReader r(buf);
  std::vector<uint32_t> out(v.size(), 12345);
  Status st = DecodeStream(r, out);
  ASSERT_TRUE(st.ok()) << st.message() << " lanes=" << lanes << " n=" << v.size();
  ASSERT_EQ(r.remaining(), 1u);
  ASSERT_EQ(out, v) << "lanes=" << lanes;
}

std::vector<uint32_t> Geometric(size_t n, double p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::geometric_distribution<uint32_t> d(p);
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint64_t> Histogram(const std::vector<uint32_t>& v) {
  uint32_t mx = 0;
  for (uint32_t x : v) mx = std::max(mx, x);
  std::vector<uint64_t> h(v.empty() ? 0 : mx + 1);
  for (uint32_t x : v) ++h[x];
  return h;
}

double EntropyBytes(const std::vector<uint32_t>& v) {
  std::map<uint32_t, uint64_t> c;
  for (uint32_t x : v) ++c[x];
  double bits = 0;
  for (auto& [k, n] : c) bits -= static_cast<double>(n) * std::log2(static_cast<double>(n) / v.size());
  return bits / 8;
}

TEST(Rans, Empty) {
  RoundTrip({});
  EXPECT_EQ(Encode({}).size(), 1u);
  EXPECT_EQ(EstimateStreamBytes({}), 1u);
}

TEST(Rans, SingleSymbolAndConstant) {
  RoundTrip({7});
  RoundTrip({0});
  RoundTrip({0xffffffffu});
  RoundTrip(std::vector<uint32_t>(100000, 3));
  EXPECT_LE(Encode(std::vector<uint32_t>(100000, 3)).size(), 2u);
}

TEST(Rans, Geometric) {
  for (double p : {0.05, 0.3, 0.5, 0.9, 0.99}) RoundTrip(Geometric(10007, p, 1));
}

TEST(Rans, Uniform) {
  std::mt19937 rng(2);
  for (uint32_t range : {2u, 3u, 17u, 255u, 256u, 300u, 1000u, 70000u}) {
    std::vector<uint32_t> v(5000);
    for (auto& x : v) x = rng() % range;
    RoundTrip(v);
  }
}

TEST(Rans, HugeValuesNeedEscapes) {
  std::mt19937 rng(3);
  std::vector<uint32_t> v(20000);
  for (auto& x : v) {
    const uint32_t r = rng() % 100;
    x = r < 90 ? rng() % 4 : (r < 95 ? rng() : 0xffffffffu - rng() % 3);
  }
  RoundTrip(v);
  // All values escape (two distinct, both huge).
  RoundTrip({0x80000000u, 0x80000001u, 0x80000000u});
  RoundTrip({0xffffffffu, 0xfffffffeu});
}

TEST(Rans, AllLaneCountsSmallInputs) {
  std::mt19937 rng(4);
  for (uint32_t lanes = 1; lanes <= kMaxLanes; ++lanes) {
    for (size_t n : {0, 1, 2, 3, 5, 31, 33, 64, 100, 257, 1000, 4099}) {
      std::vector<uint32_t> v(n);
      for (auto& x : v) x = (rng() % 10 == 0) ? rng() % 1000 : rng() % 3;
      RoundTrip(v, lanes);
    }
  }
}

// Very skewed streams read few words, so most blocks run from the padded
// copy of the payload's end.
TEST(Rans, LowEntropyLong) {
  std::mt19937 rng(14);
  std::vector<uint32_t> v(300000, 0);
  for (int k = 0; k < 200; ++k) v[rng() % v.size()] = 1 + rng() % 3;
  for (uint32_t lanes : {1u, 7u, 8u, 32u}) RoundTrip(v, lanes);
}

TEST(Rans, LargeAllLanes) {
  const auto v = Geometric(200003, 0.4, 5);
  for (uint32_t lanes = 1; lanes <= kMaxLanes; ++lanes) RoundTrip(v, lanes);
}

TEST(Rans, CloseToEntropy) {
  const auto v = Geometric(1 << 20, 0.5, 6);
  const double h = EntropyBytes(v);
  const size_t actual = Encode(v).size();
  const uint64_t est = EstimateStreamBytes(Histogram(v));
  std::printf("1M geometric(0.5): entropy %.0f B, coded %zu B (+%.3f%%), estimate %llu B\n", h, actual,
              100.0 * (static_cast<double>(actual) / h - 1), static_cast<unsigned long long>(est));
  EXPECT_LT(static_cast<double>(actual), h * 1.01 + 200) << "entropy " << h;
  EXPECT_GT(static_cast<double>(actual), h * 0.99);
}

TEST(Rans, EstimateMatchesActual) {
  std::mt19937 rng(7);
  std::vector<std::vector<uint32_t>> cases = {Geometric(1 << 16, 0.5, 8), Geometric(1000, 0.05, 9),
                                              Geometric(100, 0.7, 10), std::vector<uint32_t>(50, 9), {},
                                              {1, 2}};
  std::vector<uint32_t> esc(30000);
  for (auto& x : esc) x = rng() % 10 == 0 ? 100000 + rng() % 50000 : rng() % 5;
  cases.push_back(esc);
  for (const auto& v : cases) {
    for (uint32_t lanes : {1u, 8u, 32u}) {
      const double actual = static_cast<double>(Encode(v, lanes).size());
      const double est = static_cast<double>(EstimateStreamBytes(Histogram(v), {lanes}));
      EXPECT_NEAR(est, actual, 3.0 * lanes + 4 + 0.002 * actual) << "n=" << v.size() << " lanes=" << lanes;
      // From the symbols (exact varint lengths of large values, same plan).
      EXPECT_EQ(EstimateStreamBytes(v, 1.0, {lanes}), EstimateStreamBytes(Histogram(v), {lanes})) << "n=" << v.size();
    }
  }
}

// A sample's estimate scaled up stands for the whole stream: a 1-in-4
// sample of an i.i.d. stream, scaled by 4, lands near the full estimate
// (table and flush bytes counted once).
TEST(Rans, ScaledSampleEstimate) {
  const std::vector<uint32_t> v = Geometric(1 << 16, 0.3, 11);
  std::vector<uint32_t> sample;
  for (size_t i = 0; i < v.size(); i += 4) sample.push_back(v[i]);
  const double full = static_cast<double>(EstimateStreamBytes(v, 1.0));
  EXPECT_NEAR(static_cast<double>(EstimateStreamBytes(sample, 4.0)), full, 0.01 * full);
  FreqTable t = MakeFreqTable(Histogram(v));
  const double with_table = static_cast<double>(EstimateStreamBytesWithTable(Histogram(v), t));
  EXPECT_EQ(static_cast<double>(EstimateStreamBytesWithTable(v, t, 1.0)), with_table);
  EXPECT_NEAR(static_cast<double>(EstimateStreamBytesWithTable(sample, t, 4.0)), with_table, 0.01 * with_table);
}

TEST(Rans, CountSymbolsClampsToLastBin) {
  std::vector<uint64_t> h(4, 0);
  CountSymbols(std::vector<uint32_t>{0, 1, 1, 3, 4, 1000, 2, 2, 2}, h);
  EXPECT_EQ(h, (std::vector<uint64_t>{1, 2, 3, 3}));
}

// single_lane_below_bytes: a stream carrying less coded information than that
// is written with one lane, a longer one with the requested lanes; inline or
// table form; the estimate predicts the same plan, and every stream decodes.
TEST(Rans, ShortStreamsGetOneLane) {
  const EncodeOptions opt{.lanes = 8, .single_lane_below_bytes = 512};
  for (size_t n : {size_t{40}, size_t{700}, size_t{1500}, size_t{3000}, size_t{1} << 16}) {
    const std::vector<uint32_t> v = Geometric(n, 0.5, 30 + n);  // about 2 bits a symbol: 10 B .. 16 KB
    const std::vector<uint64_t> hist = Histogram(v);
    const FreqTable table = MakeFreqTable(hist);
    const uint32_t want_lanes = EntropyBytes(v) < 512 ? 1 : 8;
    for (bool table_form : {false, true}) {
      SCOPED_TRACE("n=" + std::to_string(n) + (table_form ? " table form" : " inline table"));
      std::vector<uint8_t> buf;
      ByteWriter w(&buf);
      uint64_t est = 0;
      if (table_form) {
        EncodeStreamWithTable(v, table, w, opt);
        est = EstimateStreamBytesWithTable(hist, table, opt);
      } else {
        EncodeStream(v, w, opt);
        est = EstimateStreamBytes(hist, opt);
      }
      // A table-form stream decodes as the inline-table stream with the
      // table spliced in after the mode byte.
      std::vector<uint8_t> inline_form = buf;
      if (table_form) {
        ASSERT_EQ(buf[0], kModeTable);
        inline_form.clear();
        ByteWriter iw(&inline_form);
        iw.U8(kModeRans);
        iw.U8(static_cast<uint8_t>(table.escape));
        for (uint32_t s = 0; s <= table.escape; ++s) iw.Varint(table.freq[s]);
        iw.Bytes(std::span<const uint8_t>(buf).subspan(1));
      }
      ByteReader hr(inline_form);
      StreamHeader h;
      ASSERT_TRUE(ParseStreamHeader(hr, v.size(), &h).ok());
      EXPECT_EQ(h.lanes, want_lanes);
      ByteReader dr(inline_form);
      std::vector<uint32_t> out(v.size());
      ASSERT_TRUE(DecodeStream(dr, out).ok());
      EXPECT_EQ(out, v);
      EXPECT_NEAR(static_cast<double>(est), static_cast<double>(buf.size()), 3.0 * h.lanes + 4 + 0.002 * buf.size());
    }
    // One lane instead of 8 saves 7 lanes' flush bytes.
    if (want_lanes == 1 && n >= 8) {
      std::vector<uint8_t> one;
      ByteWriter ow(&one);
      EncodeStream(v, ow, opt);
      EXPECT_LE(one.size() + 7 * 2, Encode(v, 8).size());
    }
  }
}

// Streams coded with a cycle of tables (channel classes): symbol i from a
// distribution of its own position i % 4, each position with its own table
// (different escape thresholds; some values escape). Decode, estimate,
// lanes, and the single-table case writing what EncodeStreamWithTable writes.
struct TableCycle {
  std::vector<FreqTable> tables;
  std::vector<const FreqTable*> cycle;
  std::vector<DecodeTable> decode;
  std::vector<const DecodeTable*> decode_cycle;
};
TableCycle MakeCycle(const std::vector<uint32_t>& v, size_t period) {
  TableCycle t;
  for (size_t p = 0; p < period; ++p) {
    std::vector<uint64_t> hist(p == 0 ? 4 : 40, 0);  // position 0's table escapes from 3 on
    for (size_t i = p; i < v.size(); i += period) ++hist[std::min<size_t>(v[i], hist.size() - 1)];
    t.tables.push_back(MakeFreqTable(hist));
  }
  t.decode.resize(period);
  for (size_t p = 0; p < period; ++p) {
    t.cycle.push_back(&t.tables[p]);
    BuildDecodeTable(t.tables[p], &t.decode[p]);
    t.decode_cycle.push_back(&t.decode[p]);
  }
  return t;
}

std::vector<uint32_t> PositionalSymbols(size_t n, size_t period, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    std::geometric_distribution<uint32_t> d(0.8 / double(1 + i % period));  // position p: mean about p
    v[i] = rng() % 97 == 0 ? 300 + static_cast<uint32_t>(rng() % 100000) : d(rng);
  }
  return v;
}

TEST(Rans, TableCyclesRoundTrip) {
  constexpr size_t kPeriod = 4;
  for (size_t n : {size_t{1}, size_t{7}, size_t{300}, size_t{5000}}) {
    const std::vector<uint32_t> v = PositionalSymbols(n, kPeriod, 40 + n);
    const TableCycle t = MakeCycle(PositionalSymbols(20000, kPeriod, 1), kPeriod);
    for (uint32_t below : {0u, 512u}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " single_lane_below=" + std::to_string(below));
      const EncodeOptions opt{.lanes = 8, .single_lane_below_bytes = below};
      std::vector<uint8_t> buf;
      ByteWriter w(&buf);
      EncodeStreamWithTables(v, t.cycle, w, opt);
      buf.push_back(0xAB);
      ByteReader r(buf);
      std::vector<uint32_t> out(n, 7);
      const Status st = DecodeStreamWithTables(r, t.decode_cycle, out);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(r.remaining(), 1u);
      EXPECT_EQ(out, v);
      const uint64_t est = EstimateStreamBytesWithTables(v, t.cycle, 1.0, opt);
      EXPECT_NEAR(double(est), double(buf.size() - 1), 3.0 * 8 + 4 + 0.002 * buf.size());
      // Coded with the cycle, the symbols take less than with one table for all.
      if (n >= 300) {
        std::vector<uint64_t> hist(40, 0);
        for (uint32_t x : PositionalSymbols(20000, kPeriod, 1)) ++hist[std::min<uint32_t>(x, 39)];
        const FreqTable one = MakeFreqTable(hist);
        std::vector<uint8_t> single;
        ByteWriter sw(&single);
        EncodeStreamWithTable(v, one, sw, opt);
        EXPECT_LT(buf.size() - 1, single.size());
      }
      // Decoding with another cycle fails or differs, never crashes.
      std::vector<const DecodeTable*> shifted(t.decode_cycle.begin() + 1, t.decode_cycle.end());
      shifted.push_back(t.decode_cycle[0]);
      ByteReader r2(buf);
      if (DecodeStreamWithTables(r2, shifted, out).ok() && n > 1) {
        EXPECT_NE(out, v);
      }
    }
  }
  // One table, or one table repeated: the bytes of EncodeStreamWithTable.
  const std::vector<uint32_t> v = PositionalSymbols(3000, kPeriod, 9);
  const TableCycle t = MakeCycle(v, 1);
  std::vector<uint8_t> a, b, c;
  ByteWriter wa(&a), wb(&b), wc(&c);
  EncodeStreamWithTable(v, t.tables[0], wa);
  EncodeStreamWithTables(v, t.cycle, wb);
  const std::vector<const FreqTable*> repeated(5, &t.tables[0]);
  EncodeStreamWithTables(v, repeated, wc);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  // Empty and constant streams keep modes 0 and 1; an inline-table stream is refused.
  const TableCycle t4 = MakeCycle(PositionalSymbols(2000, kPeriod, 2), kPeriod);
  for (const std::vector<uint32_t>& s : {std::vector<uint32_t>{}, std::vector<uint32_t>(9, 2)}) {
    std::vector<uint8_t> e;
    ByteWriter we(&e);
    EncodeStreamWithTables(s, t4.cycle, we);
    EXPECT_EQ(e[0], s.empty() ? kModeEmpty : kModeConstant);
    EXPECT_EQ(EstimateStreamBytesWithTables(s, t4.cycle, 1.0), e.size());
    ByteReader er(e);
    std::vector<uint32_t> out(s.size());
    ASSERT_TRUE(DecodeStreamWithTables(er, t4.decode_cycle, out).ok());
    EXPECT_EQ(out, s);
  }
  const std::vector<uint8_t> inline_table = Encode(v);
  ByteReader ir(inline_table);
  std::vector<uint32_t> out(v.size());
  EXPECT_EQ(DecodeStreamWithTables(ir, t4.decode_cycle, out).code(), StatusCode::kCorrupt);
}

// 8-lane streams whose cycle is a multiple of 8 (8k-dim heads) decode whole
// rounds with AVX2 (a table per lane): the same symbols as the scalar path,
// escapes included, and the same verdict on flipped bytes.
TEST(Rans, TableCycleOf8DecodesTheSameWithAndWithoutSimd) {
  for (size_t period : {size_t{8}, size_t{16}}) {
    const std::vector<uint32_t> v = PositionalSymbols(5003, period, 21 + period);
    const TableCycle t = MakeCycle(PositionalSymbols(20000, period, 2), period);
    std::vector<uint8_t> good;
    ByteWriter w(&good);
    EncodeStreamWithTables(v, t.cycle, w, {.lanes = 8});
    std::vector<uint32_t> simd(v.size()), scalar(v.size());
    auto decode = [&](const std::vector<uint8_t>& bytes, bool use_simd, std::vector<uint32_t>* out) {
      simd::SetEnabled(use_simd);
      ByteReader r(bytes);
      const Status st = DecodeStreamWithTables(r, t.decode_cycle, *out);
      simd::SetEnabled(true);
      return st;
    };
    ASSERT_TRUE(decode(good, true, &simd).ok());
    ASSERT_TRUE(decode(good, false, &scalar).ok());
    EXPECT_EQ(simd, v);
    EXPECT_EQ(scalar, v);
    for (size_t i = 0; i < good.size(); i += 1 + i / 16) {
      auto bad = good;
      bad[i] ^= 0x41;
      const Status a = decode(bad, true, &simd), b = decode(bad, false, &scalar);
      EXPECT_EQ(a.code(), b.code()) << i;
      if (a.ok() && b.ok()) {
        EXPECT_EQ(simd, scalar) << i;
      }
    }
  }
}

// Every flipped byte and truncation of a cycle-coded stream: kCorrupt or a
// clean decode, never a crash or an over-read (ASan).
TEST(Rans, TableCycleCorruptionNeverCrashes) {
  constexpr size_t kPeriod = 4;
  const std::vector<uint32_t> v = PositionalSymbols(300, kPeriod, 5);
  const TableCycle t = MakeCycle(v, kPeriod);
  for (uint32_t below : {0u, 4096u}) {
    std::vector<uint8_t> good;
    ByteWriter w(&good);
    EncodeStreamWithTables(v, t.cycle, w, {.lanes = 8, .single_lane_below_bytes = below});
    std::vector<uint32_t> out(v.size());
    for (size_t i = 0; i < good.size(); ++i)
      for (uint8_t mask : {0x01, 0x80, 0xff}) {
        auto bad = good;
        bad[i] ^= mask;
        ByteReader r(bad);
        const Status st = DecodeStreamWithTables(r, t.decode_cycle, out);
        if (!st.ok()) {
          EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
        }
      }
    for (size_t len = 0; len < good.size(); ++len) {
      std::vector<uint8_t> cut(good.begin(), good.begin() + len);
      ByteReader r(cut);
      EXPECT_FALSE(DecodeStreamWithTables(r, t.decode_cycle, out).ok()) << len;
    }
    for (size_t m : {v.size() + 1, v.size() - 1, v.size() * 10}) {
      ByteReader r(good);
      std::vector<uint32_t> other(m);
      EXPECT_FALSE(DecodeStreamWithTables(r, t.decode_cycle, other).ok()) << m;
    }
  }
}

// Every flipped byte and every truncation of a small stream must decode
// cleanly or fail with kCorrupt; it must never read out of bounds (ASan).
TEST(Rans, CorruptionNeverCrashes) {
  std::mt19937 rng(11);
  std::vector<uint32_t> v(300);
  for (auto& x : v) x = rng() % 20 == 0 ? rng() : rng() % 6;
  for (uint32_t lanes : {1u, 3u, 8u, 32u}) {
    const auto good = Encode(v, lanes);
    std::vector<uint32_t> out(v.size());
    for (size_t i = 0; i < good.size(); ++i) {
      for (uint8_t mask : {0x01, 0x80, 0xff}) {
        auto bad = good;
        bad[i] ^= mask;
        ByteReader r(bad);
        Status st = DecodeStream(r, out);
        if (st.ok()) {
          EXPECT_LE(r.position(), bad.size());
        } else {
          EXPECT_EQ(st.code(), StatusCode::kCorrupt);
        }
      }
    }
    for (size_t len = 0; len < good.size(); ++len) {
      std::vector<uint8_t> cut(good.begin(), good.begin() + len);
      ByteReader r(cut);
      Status st = DecodeStream(r, out);
      EXPECT_FALSE(st.ok()) << "truncated to " << len;
    }
    // Asking for more or fewer symbols than were encoded must fail, not over-read.
    for (size_t m : {v.size() + 1, v.size() - 1, v.size() * 10, size_t{0}}) {
      ByteReader r(good);
      std::vector<uint32_t> other(m);
      EXPECT_FALSE(DecodeStream(r, other).ok()) << m;
    }
  }
}

TEST(Rans, GarbageTableFails) {
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  w.U8(2);   // rANS mode
  w.U8(3);   // E = 3: four frequencies follow
  for (uint32_t f : {1000u, 1000u, 1000u, 1100u}) w.Varint(f);
  w.U8(1);
  w.Varint(0);
  w.Varint(4);
  w.U32(1u << 16);
  ByteReader r(buf);
  std::vector<uint32_t> out(0);
  Status st = DecodeStream(r, out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sums to 4100, expected 4096"), std::string::npos) << st.message();

  std::mt19937 rng(12);
  for (int t = 0; t < 2000; ++t) {
    std::vector<uint8_t> g(rng() % 64);
    for (auto& b : g) b = static_cast<uint8_t>(rng());
    if (!g.empty()) g[0] = static_cast<uint8_t>(rng() % 4);
    ByteReader gr(g);
    std::vector<uint32_t> o(rng() % 100);
    (void)DecodeStream(gr, o);
  }
}

TEST(Rans, ConcatenatedStreams) {
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  const auto a = Geometric(1000, 0.3, 13);
  const std::vector<uint32_t> b(10, 4);
  EncodeStream(a, w);
  EncodeStream(b, w);
  EncodeStream({}, w);
  ByteReader r(buf);
  std::vector<uint32_t> oa(a.size()), ob(b.size()), oc;
  ASSERT_TRUE(DecodeStream(r, oa).ok());
  ASSERT_TRUE(DecodeStream(r, ob).ok());
  ASSERT_TRUE(DecodeStream(r, oc).ok());
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_EQ(oa, a);
  EXPECT_EQ(ob, b);
}

}  // namespace
}  // namespace cachegen::rans
