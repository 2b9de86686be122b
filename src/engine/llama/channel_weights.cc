#include "engine/llama/channel_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include <ggml.h>
#include <gguf.h>

#include "codec/cachegen/rope.h"

namespace cachegen::engine {
namespace {

// One row of tensor t (ne[0] values) as f32.
Status RowToFloat(const ggml_tensor* t, const void* row, float* out) {
  if (t->type == GGML_TYPE_F32) {
    std::copy_n(static_cast<const float*>(row), t->ne[0], out);
    return Status::Ok();
  }
  const ggml_type_traits* tr = ggml_get_type_traits(t->type);
  if (!tr || !tr->to_float) return Status::Unsupported(std::string("tensor type ") + ggml_type_name(t->type));
  tr->to_float(row, out, t->ne[0]);
  return Status::Ok();
}

// Queries per layer are subsampled so that one layer of one window costs at
// most about this many multiply-adds (production head dims make the K term's
// D x D form the largest cost).
constexpr double kWorkPerLayer = 4e8;

}  // namespace

Result<std::vector<std::vector<float>>> AttentionOutputGrams(const std::string& path, const LlamaModelInfo& info) {
  ggml_context* meta = nullptr;
  gguf_context* g = gguf_init_from_file(path.c_str(), gguf_init_params{/*no_alloc=*/true, &meta});
  if (!g) return Status::InvalidArgument(path + ": not a readable GGUF file");
  std::unique_ptr<gguf_context, void (*)(gguf_context*)> g_owner(g, gguf_free);
  std::unique_ptr<ggml_context, void (*)(ggml_context*)> meta_owner(meta, ggml_free);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) return Status::IOError(path + ": cannot open");
  const uint32_t H = info.heads, D = info.head_dim, HD = H * D;
  std::vector<std::vector<float>> grams(info.layers, std::vector<float>(size_t{H} * D * D, 0));
  std::vector<uint8_t> raw;
  std::vector<float> row(HD);
  for (uint32_t l = 0; l < info.layers; ++l) {
    const std::string name = "blk." + std::to_string(l) + ".attn_output.weight";
    const int64_t id = gguf_find_tensor(g, name.c_str());
    const ggml_tensor* t = ggml_get_tensor(meta, name.c_str());
    if (id < 0 || !t) return Status::Unsupported(path + ": no tensor " + name);
    if (t->ne[0] != HD || t->ne[2] != 1 || t->ne[3] != 1)
      return Status::Unsupported(path + ": " + name + " is not [heads * head_dim, embd]");
    const size_t row_bytes = ggml_row_size(t->type, t->ne[0]);
    raw.resize(row_bytes);
    if (fseeko(f.get(), static_cast<off_t>(gguf_get_data_offset(g) + gguf_get_tensor_offset(g, id)), SEEK_SET) != 0)
      return Status::IOError(path + ": seek failed");
    float* gram = grams[l].data();
    for (int64_t r = 0; r < t->ne[1]; ++r) {
      if (std::fread(raw.data(), 1, row_bytes, f.get()) != row_bytes) return Status::IOError(path + ": short read");
      CG_RETURN_IF_ERROR(RowToFloat(t, raw.data(), row.data()));
      for (uint32_t j = 0; j < H; ++j) {
        const float* x = &row[size_t{j} * D];
        float* gj = gram + size_t{j} * D * D;
        for (uint32_t a = 0; a < D; ++a)
          for (uint32_t b = 0; b < D; ++b) gj[a * D + b] += x[a] * x[b];
      }
    }
  }
  return grams;
}

ChannelWeightAccumulator::ChannelWeightAccumulator(const LlamaModelInfo& info, const RopeConfig& coding_rope,
                                                   std::vector<std::vector<float>> grams)
    : info_(info), rope_(coding_rope), grams_(std::move(grams)), queries_(info.layers) {}

void ChannelWeightAccumulator::ObserveQueries(uint32_t layer, int32_t pos0, std::span<const float> q) {
  if (layer >= queries_.size() || pos0 < 0) return;
  std::vector<float>& dst = queries_[layer];
  const size_t at = size_t(pos0) * info_.heads * info_.head_dim;
  if (dst.size() < at + q.size()) dst.resize(at + q.size());
  std::copy(q.begin(), q.end(), dst.begin() + at);
}

// One layer's keys and values of the window, [token][kv_head * D + d].
struct ChannelWeightAccumulator::LayerRows {
  uint32_t tokens = 0, channels = 0;
  std::vector<float> keys, values;
  const float* Key(uint32_t n, uint32_t h, uint32_t D) const { return &keys[size_t{n} * channels + size_t{h} * D]; }
  const float* Value(uint32_t n, uint32_t h, uint32_t D) const { return &values[size_t{n} * channels + size_t{h} * D]; }
};

// Query m of query head j (KV head h): its attention over keys 0..m, output,
// and each key's K term, folded into wk (h's D x D block). Returns sum_n a^2.
double ChannelWeightAccumulator::AddQuery(const LayerRows& rows, const float* qm, uint32_t m, uint32_t h,
                                          const float* gram, const RopeTable* rope, double* wk) {
  const uint32_t D = info_.head_dim;
  const double scale = 1.0 / std::sqrt(double(D));  // llama.cpp's kq_scale
  std::vector<double>& a = scratch_.a;
  std::vector<double>& o = scratch_.o;
  std::vector<double>& diff = scratch_.diff;
  std::vector<float>& u = scratch_.u;
  a.resize(m + 1);
  double top = -1e300, total = 0;
  for (uint32_t n = 0; n <= m; ++n) {
    const float* k = rows.Key(n, h, D);
    double dot = 0;
    for (uint32_t d = 0; d < D; ++d) dot += double(qm[d]) * k[d];
    top = std::max(top, a[n] = dot * scale);
  }
  for (uint32_t n = 0; n <= m; ++n) total += (a[n] = std::exp(a[n] - top));
  o.assign(D, 0.0);
  for (uint32_t n = 0; n <= m; ++n) {
    a[n] /= total;
    const float* v = rows.Value(n, h, D);
    for (uint32_t d = 0; d < D; ++d) o[d] += a[n] * v[d];
  }
  double sum_a2 = 0;
  diff.resize(D);
  u.resize(D);
  for (uint32_t n = 0; n <= m; ++n) {
    const double a2 = a[n] * a[n];
    sum_a2 += a2;
    const float* v = rows.Value(n, h, D);
    for (uint32_t d = 0; d < D; ++d) diff[d] = v[d] - o[d];
    double spread = 0;  // |W_j (v_n - o)|^2
    for (uint32_t r = 0; r < D; ++r) {
      double row = 0;
      for (uint32_t c = 0; c < D; ++c) row += double(gram[r * D + c]) * diff[c];
      spread += diff[r] * row;
    }
    std::copy(qm, qm + D, u.begin());
    if (rope) rope->Apply(n, u.data(), /*inverse=*/true);
    const double f = a2 * spread;
    for (uint32_t r = 0; r < D; ++r)
      for (uint32_t c = 0; c < D; ++c) wk[size_t{r} * D + c] += f * double(u[r]) * u[c];
  }
  return sum_a2;
}

Status ChannelWeightAccumulator::AddWindow(const KVView& kv) {
  const KVShape& s = kv.shape();
  const uint32_t H = info_.heads, HK = info_.kv_heads, D = info_.head_dim, T = s.tokens, C = HK * D;
  if (s.layers != info_.layers || s.kv_heads != HK || s.head_dim != D || H == 0 || H % HK != 0 ||
      grams_.size() != info_.layers)
    return Status::InvalidArgument("channel weights: KV shape " + s.ToString() + " differs from the model's");
  const RopeTable* rope = rope_.kind != RopeConfig::Kind::kNone ? &CachedRopeTable(rope_, 0, T) : nullptr;
  if (weights_.empty()) weights_.assign(size_t{info_.layers} * 2, std::vector<double>(size_t{HK} * D * D, 0));
  const double work = 0.5 * double(T) * T * H * (2.0 * D * D + 4 * D);
  const uint32_t stride = static_cast<uint32_t>(std::max(1.0, std::ceil(work / kWorkPerLayer)));
  LayerRows rows{T, C, std::vector<float>(size_t{T} * C), std::vector<float>(size_t{T} * C)};
  for (uint32_t l = 0; l < info_.layers; ++l) {
    const std::vector<float>& q = queries_[l];
    if (q.size() < size_t{T} * H * D)
      return Status::Internal("channel weights: queries of layer " + std::to_string(l) + " were not observed");
    for (uint32_t t = 0; t < T; ++t) {
      kv.ReadRow(l, KV::kKey, t, &rows.keys[size_t{t} * C]);
      kv.ReadRow(l, KV::kValue, t, &rows.values[size_t{t} * C]);
    }
    for (uint32_t j = 0; j < H; ++j) {
      const uint32_t h = j / (H / HK);
      const float* gram = &grams_[l][size_t{j} * D * D];
      double* wk = &weights_[2 * l][size_t{h} * D * D];
      double sum_a2 = 0;
      for (uint32_t m = stride - 1; m < T; m += stride)
        sum_a2 += AddQuery(rows, &q[(size_t{m} * H + j) * D], m, h, gram, rope, wk);
      double* wv = &weights_[2 * l + 1][size_t{h} * D * D];
      for (size_t i = 0; i < size_t{D} * D; ++i) wv[i] += sum_a2 * gram[i];
    }
  }
  for (auto& q : queries_) q.clear();
  return Status::Ok();
}

}  // namespace cachegen::engine
