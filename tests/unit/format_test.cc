// Frame and container serialization: round trips and every validation rule.
#include <gtest/gtest.h>

#include <cstring>

#include "cachegen/codec.h"
#include "common/checksum.h"
#include "format/container.h"
#include "format/frame.h"

namespace cachegen {
namespace {

FrameHeader SmallHeader(uint32_t layers = 2) {
  FrameHeader h;
  h.codec = CodecId::kFp16;
  h.dtype = DType::kBF16;
  h.level = 1;
  h.shape = {layers, 2, 4, 3};
  h.token_start = 10;
  h.context_tokens = 20;
  h.params = {1, 2, 3};
  return h;
}

std::vector<EncodedSection> Sections(uint32_t layers) {
  std::vector<EncodedSection> s(2 * layers);
  for (size_t i = 0; i < s.size(); ++i) {
    s[i].bytes.assign(5 + i, static_cast<uint8_t>(i));
    s[i].side_bytes = static_cast<uint32_t>(i % 3);
  }
  return s;
}

template <typename T>
void Put(std::vector<uint8_t>& b, size_t pos, T v) {
  std::memcpy(&b[pos], &v, sizeof v);
}

template <typename T>
T Get(const std::vector<uint8_t>& b, size_t pos) {
  T v;
  std::memcpy(&v, &b[pos], sizeof v);
  return v;
}

// Recomputes a frame's header checksum after a test tampered with the header.
void ResealFrame(std::vector<uint8_t>& f, uint64_t header_bytes) {
  Put<uint64_t>(f, header_bytes - 8, Checksum64(std::span(f).first(header_bytes - 8)));
}

constexpr size_t kFrameFixed = 40;  // bytes before params
constexpr size_t kEntry = 24;

TEST(Frame, RoundTrip) {
  const FrameHeader h = SmallHeader();
  const auto sections = Sections(2);
  const auto f = WriteFrame(h, sections);
  auto p = ParseFrame(f);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->header.codec, h.codec);
  EXPECT_EQ(p->header.dtype, h.dtype);
  EXPECT_EQ(p->header.level, h.level);
  EXPECT_EQ(p->header.shape, h.shape);
  EXPECT_EQ(p->header.token_start, 10u);
  EXPECT_EQ(p->header.context_tokens, 20u);
  EXPECT_EQ(p->header.params, h.params);
  EXPECT_EQ(p->header_bytes, kFrameFixed + 3 + 4 * kEntry + 8);
  ASSERT_EQ(p->sections.size(), 4u);
  for (uint32_t l = 0; l < 2; ++l)
    for (KV kv : {KV::kKey, KV::kValue}) {
      auto payload = SectionPayload(*p, f, l, kv);
      ASSERT_TRUE(payload.ok());
      const auto& want = sections[2 * l + static_cast<uint8_t>(kv)];
      EXPECT_EQ(std::vector<uint8_t>(payload->begin(), payload->end()), want.bytes);
      EXPECT_EQ(p->sections[2 * l + static_cast<uint8_t>(kv)].side_bytes, want.side_bytes);
    }
  EXPECT_FALSE(SectionPayload(*p, f, 2, KV::kKey).ok());
}

TEST(Frame, EmptySectionsAllowed) {
  FrameHeader h = SmallHeader(1);
  h.params.clear();
  std::vector<EncodedSection> s(2);
  const auto f = WriteFrame(h, s);
  auto p = ParseFrame(f);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->header_bytes, f.size());
}

// Binding a frame to its chunk key: version 2, the key in the header, the
// payloads and their checksums unchanged; version 1 without it; rebinding
// replaces the key. Every byte of the bound header is covered by its checksum.
TEST(Frame, BindingAddsTheChunkKeyAndKeepsThePayloads) {
  const auto f = WriteFrame(SmallHeader(), Sections(2));
  auto unbound = ParseFrame(f);
  ASSERT_TRUE(unbound.ok());
  EXPECT_FALSE(unbound->header.chunk_key);
  EXPECT_EQ(Get<uint16_t>(f, 4), kUnboundFormatVersion);
  const ChunkKey key = *ChunkKey::FromHex("00112233445566778899aabbccddeeff");
  auto bound = BindFrame(f, key);
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ(bound->size(), f.size() + 16);
  EXPECT_EQ(Get<uint16_t>(*bound, 4), kFormatVersion);
  auto p = ParseFrame(*bound);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE(p->header.chunk_key);
  EXPECT_EQ(*p->header.chunk_key, key);
  EXPECT_EQ(p->header_bytes, unbound->header_bytes + 16);
  EXPECT_TRUE(std::equal(f.begin() + static_cast<long>(unbound->header_bytes), f.end(),
                         bound->begin() + static_cast<long>(p->header_bytes)));
  for (uint32_t l = 0; l < 2; ++l)
    for (KV kv : {KV::kKey, KV::kValue}) EXPECT_TRUE(SectionPayload(*p, *bound, l, kv).ok());
  const ChunkKey other = *ChunkKey::FromHex("ffeeddccbbaa99887766554433221100");
  auto rebound = BindFrame(*bound, other);
  ASSERT_TRUE(rebound.ok());
  EXPECT_EQ(rebound->size(), bound->size());
  EXPECT_EQ(*ParseFrame(*rebound)->header.chunk_key, other);
  for (uint64_t i = 40; i < 56; ++i) {
    auto flipped = *bound;
    flipped[i] ^= 1;
    EXPECT_EQ(ParseFrame(flipped).status().code(), StatusCode::kCorrupt) << i;
  }
}

TEST(Frame, BadMagicAndVersion) {
  auto f = WriteFrame(SmallHeader(), Sections(2));
  auto bad = f;
  bad[0] ^= 1;
  EXPECT_EQ(ParseFrame(bad).status().code(), StatusCode::kCorrupt);
  bad = f;
  Put<uint16_t>(bad, 4, 3);
  auto r = ParseFrame(bad);
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("version 3"), std::string::npos);
  bad = f;
  Put<uint16_t>(bad, 4, 0);
  EXPECT_EQ(ParseFrame(bad).status().code(), StatusCode::kCorrupt);
}

TEST(Frame, HeaderChecksumAndFields) {
  const auto f = WriteFrame(SmallHeader(), Sections(2));
  const uint64_t hb = ParseFrame(f)->header_bytes;
  auto bad = f;
  bad[20] ^= 1;  // tokens field, not resealed
  auto r = ParseFrame(bad);
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("checksum"), std::string::npos);

  struct Case {
    size_t pos;
    int width;
    uint64_t value;
  } cases[] = {
      {6, 2, 1},            // flags
      {9, 1, 9},            // dtype
      {10, 1, 8},           // level
      {11, 1, 1},           // reserved
      {16, 4, 0},           // kv_heads = 0
      {20, 4, 1u << 30},    // tokens too large for the shape limits
      {24, 4, 0xffffffff},  // token_start + tokens overflows
  };
  for (const Case& c : cases) {
    bad = f;
    if (c.width == 1) bad[c.pos] = static_cast<uint8_t>(c.value);
    if (c.width == 2) Put<uint16_t>(bad, c.pos, static_cast<uint16_t>(c.value));
    if (c.width == 4) Put<uint32_t>(bad, c.pos, static_cast<uint32_t>(c.value));
    ResealFrame(bad, hb);
    EXPECT_EQ(ParseFrame(bad).status().code(), StatusCode::kCorrupt) << "field at " << c.pos;
  }
}

TEST(Frame, SizesBoundedBeforeUse) {
  const auto f = WriteFrame(SmallHeader(), Sections(2));
  auto bad = f;
  Put<uint32_t>(bad, 36, 1u << 20);  // params_len over the limit
  EXPECT_EQ(ParseFrame(bad).status().code(), StatusCode::kCorrupt);
  bad = f;
  Put<uint32_t>(bad, 36, 1000);  // params_len past the end
  EXPECT_EQ(ParseFrame(bad).status().code(), StatusCode::kCorrupt);
  bad = f;
  Put<uint32_t>(bad, 12, 4000);  // section table past the end
  EXPECT_EQ(ParseFrame(bad).status().code(), StatusCode::kCorrupt);
  bad = f;
  Put<uint32_t>(bad, 12, 0);
  EXPECT_EQ(ParseFrame(bad).status().code(), StatusCode::kCorrupt);
  for (size_t n = 0; n < f.size(); ++n)
    EXPECT_FALSE(ParseFrame(std::span(f).first(n)).ok()) << "truncated at " << n;
  bad = f;
  bad.push_back(0);
  EXPECT_FALSE(ParseFrame(bad).ok());
}

TEST(Frame, SectionTableRules) {
  const auto f = WriteFrame(SmallHeader(), Sections(2));
  const uint64_t hb = ParseFrame(f)->header_bytes;
  const size_t table = kFrameFixed + 3;
  auto tamper = [&](size_t entry, size_t field_off, auto value) {
    auto bad = f;
    Put(bad, table + entry * kEntry + field_off, value);
    ResealFrame(bad, hb);
    return ParseFrame(bad).status();
  };
  EXPECT_EQ(tamper(0, 0, uint64_t{hb + 1}).code(), StatusCode::kCorrupt);  // first offset
  EXPECT_EQ(tamper(1, 0, uint64_t{hb}).code(), StatusCode::kCorrupt);      // overlap
  EXPECT_EQ(tamper(2, 8, uint32_t{100000}).code(), StatusCode::kCorrupt);  // past end
  EXPECT_EQ(tamper(3, 8, uint32_t{1}).code(), StatusCode::kCorrupt);       // frame longer than sections
  EXPECT_EQ(tamper(1, 12, uint32_t{7}).code(), StatusCode::kCorrupt);      // side > size
  // A payload checksum mismatch is found by SectionPayload and names the section.
  auto bad = f;
  bad.back() ^= 1;
  auto p = ParseFrame(bad);
  ASSERT_TRUE(p.ok());
  auto s = SectionPayload(*p, bad, 1, KV::kValue);
  EXPECT_EQ(s.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(s.status().message().find("layer 1 V"), std::string::npos);
  EXPECT_TRUE(SectionPayload(*p, bad, 1, KV::kKey).ok());
}

// A container of `chunks` chunks over `tokens` tokens with fake frames.
ContainerInfo SmallInfo(uint32_t tokens, uint32_t chunk_tokens, uint32_t levels) {
  ContainerInfo info;
  info.codec = "fp16";
  info.dtype = DType::kF16;
  info.shape = {2, 2, 4, tokens};
  info.token_start = 7;
  info.levels = levels;
  info.chunk_tokens = chunk_tokens;
  return info;
}

std::vector<std::vector<std::vector<uint8_t>>> FakeFrames(uint32_t chunks, uint32_t levels) {
  std::vector<std::vector<std::vector<uint8_t>>> f(chunks);
  for (uint32_t c = 0; c < chunks; ++c)
    for (uint32_t l = 0; l < levels; ++l) f[c].push_back(std::vector<uint8_t>(3 + c + l, uint8_t(c * 8 + l)));
  return f;
}

constexpr size_t kContainerFixed = 40;

void ResealContainer(std::vector<uint8_t>& b, uint32_t chunks, uint32_t levels) {
  const size_t n = kContainerFixed + chunks * (8 + 16 * size_t{levels});
  Put<uint64_t>(b, n, Checksum64(std::span(b).first(n)));
}

TEST(Container, RoundTrip) {
  const auto frames = FakeFrames(3, 2);
  const auto bytes = WriteContainer(SmallInfo(40, 16, 2), frames);
  auto info = ParseContainer(bytes);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->codec, "fp16");
  EXPECT_EQ(info->shape, (KVShape{2, 2, 4, 40}));
  EXPECT_EQ(info->token_start, 7u);
  EXPECT_EQ(info->levels, 2u);
  EXPECT_EQ(info->chunk_tokens, 16u);
  EXPECT_EQ(info->bytes, bytes.size());
  ASSERT_EQ(info->chunks.size(), 3u);
  const uint32_t starts[] = {7, 23, 39}, counts[] = {16, 16, 8};
  for (uint32_t c = 0; c < 3; ++c) {
    EXPECT_EQ(info->chunks[c].token_start, starts[c]);
    EXPECT_EQ(info->chunks[c].tokens, counts[c]);
    for (uint32_t l = 0; l < 2; ++l) {
      const auto& e = info->chunks[c];
      std::vector<uint8_t> got(bytes.begin() + e.frame_offset[l], bytes.begin() + e.frame_offset[l] + e.frame_size[l]);
      EXPECT_EQ(got, frames[c][l]);
    }
  }
}

TEST(Container, ValidationRules) {
  const auto good = WriteContainer(SmallInfo(40, 16, 2), FakeFrames(3, 2));
  ASSERT_TRUE(ParseContainer(good).ok());
  auto bad = good;
  bad[1] ^= 1;
  EXPECT_EQ(ParseContainer(bad).status().code(), StatusCode::kCorrupt);
  bad = good;
  Put<uint16_t>(bad, 4, 9);
  EXPECT_EQ(ParseContainer(bad).status().code(), StatusCode::kUnsupported);
  bad = good;
  bad[20] ^= 1;  // not resealed
  EXPECT_NE(ParseContainer(bad).status().message().find("checksum"), std::string::npos);

  struct Case {
    size_t pos;
    int width;
    uint64_t value;
  } cases[] = {
      {6, 2, 1},          // flags
      {8, 1, 99},         // codec id unknown
      {9, 1, 3},          // dtype
      {11, 1, 1},         // reserved
      {12, 4, 0},         // layers
      {24, 4, 0xfffffff0},  // token_start overflows
      {28, 4, 8},         // chunk_tokens inconsistent with count
      {28, 4, 0},         // chunk_tokens zero
      {40, 4, 8},         // chunk 0 token_start
      {44, 4, 15},        // chunk 0 tokens
      {48, 8, 0},         // frame 0 offset
      {56, 8, 4},         // frame 0 size (gap)
      {56, 8, 1u << 30},  // frame 0 size past the end
      {56, 8, 0},         // empty frame
  };
  for (const Case& c : cases) {
    bad = good;
    if (c.width == 1) bad[c.pos] = static_cast<uint8_t>(c.value);
    if (c.width == 2) Put<uint16_t>(bad, c.pos, static_cast<uint16_t>(c.value));
    if (c.width == 4) Put<uint32_t>(bad, c.pos, static_cast<uint32_t>(c.value));
    if (c.width == 8) Put<uint64_t>(bad, c.pos, c.value);
    ResealContainer(bad, 3, 2);
    EXPECT_FALSE(ParseContainer(bad).ok()) << "field at " << c.pos;
  }
  // Level and chunk counts change the index size, so they fail as truncation or bounds.
  for (uint8_t levels : {0, 9, 1, 3}) {
    bad = good;
    bad[10] = levels;
    EXPECT_FALSE(ParseContainer(bad).ok()) << int(levels);
  }
  bad = good;
  Put<uint32_t>(bad, 36, 0xffffffff);  // huge chunk count: rejected before allocating
  EXPECT_EQ(ParseContainer(bad).status().code(), StatusCode::kCorrupt);
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(ParseContainer(std::span(good).first(n)).ok()) << n;
  bad = good;
  bad.push_back(1);
  EXPECT_FALSE(ParseContainer(bad).ok());
}

}  // namespace
}  // namespace cachegen
