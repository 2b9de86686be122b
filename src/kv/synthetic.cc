// Synthetic KV generator; see synthetic.h for the model.
#include "kv/synthetic.h"

#include <cmath>
#include <random>
#include <vector>

namespace cachegen {
namespace {

// Deterministic uniform in (0, 1) and standard normal (Box-Muller, both outputs used).
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform() { return (static_cast<double>(gen_() >> 11) + 0.5) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  double Normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(Uniform()));
    const double a = 6.283185307179586 * Uniform();
    spare_ = r * std::sin(a);
    have_spare_ = true;
    return r * std::cos(a);
  }

 private:
  std::mt19937_64 gen_;
  bool have_spare_ = false;
  double spare_ = 0;
};

}  // namespace

Result<KVTensor> SyntheticKV(const KVShape& shape, DType dtype, uint64_t seed, const SyntheticOptions& o) {
  CG_RETURN_IF_ERROR(shape.Validate());
  const uint32_t H = shape.kv_heads, D = shape.head_dim, T = shape.tokens;
  if (o.rope && D % 2 != 0) return Status::InvalidArgument("synthetic KV with RoPE needs an even head_dim");
  const uint64_t C = shape.channels();
  KVTensor out(shape, dtype);
  const KVView view = out.view();
  Rng rng(seed);

  // RoPE inverse frequencies for pair index i in [0, D/2).
  std::vector<double> inv_freq(D / 2);
  for (uint32_t i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(o.rope_base, -2.0 * i / D);

  std::vector<double> mean(C), scale(C), rho(C), state(C);
  std::vector<float> row(C);
  for (uint32_t l = 0; l < shape.layers; ++l) {
    // Deeper layers tend to have larger activations; add per-layer jitter.
    const double layer_scale = (0.5 + 1.5 * l / std::max(1u, shape.layers - 1)) * rng.Uniform(0.7, 1.3);

    // ---- keys
    for (uint64_t c = 0; c < C; ++c) {
      mean[c] = 0.1 * rng.Normal();
      scale[c] = layer_scale * rng.Uniform(0.5, 1.5);
      rho[c] = rng.Uniform(o.key_rho_min, o.key_rho_max);
      state[c] = rng.Normal();
    }
    for (uint32_t h = 0; h < H; ++h)
      for (uint32_t k = 0; k < std::min(o.outlier_channels_per_head, D); ++k) {
        const uint64_t c = uint64_t{h} * D + static_cast<uint64_t>(rng.Uniform() * D) % D;
        scale[c] = layer_scale * o.outlier_scale * rng.Uniform(0.8, 1.2);
        mean[c] = scale[c] * (rng.Uniform() < 0.5 ? -1.0 : 1.0) * rng.Uniform(0.5, 1.5);
      }
    for (uint32_t t = 0; t < T; ++t) {
      for (uint64_t c = 0; c < C; ++c) {
        if (t > 0) state[c] = rho[c] * state[c] + std::sqrt(1 - rho[c] * rho[c]) * rng.Normal();
        row[c] = static_cast<float>(mean[c] + scale[c] * state[c]);
      }
      if (o.rope) {
        const double pos = static_cast<double>(o.token_start) + t;
        for (uint32_t h = 0; h < H; ++h) {
          float* x = row.data() + uint64_t{h} * D;
          for (uint32_t i = 0; i < D / 2; ++i) {
            const double a = pos * inv_freq[i];
            const double cs = std::cos(a), sn = std::sin(a);
            const double x0 = x[i], x1 = x[i + D / 2];
            x[i] = static_cast<float>(x0 * cs - x1 * sn);
            x[i + D / 2] = static_cast<float>(x0 * sn + x1 * cs);
          }
        }
      }
      view.WriteRow(l, KV::kKey, t, row.data());
    }

    // ---- values
    for (uint64_t c = 0; c < C; ++c) {
      scale[c] = 0.5 * layer_scale * rng.Uniform(0.5, 1.5);
      rho[c] = rng.Uniform(o.value_rho_min, o.value_rho_max);
      state[c] = rng.Normal();
    }
    double token_state = rng.Normal();
    for (uint32_t t = 0; t < T; ++t) {
      if (t > 0) token_state = 0.7 * token_state + std::sqrt(1 - 0.49) * rng.Normal();
      const double token_scale = std::exp(0.3 * token_state);
      for (uint64_t c = 0; c < C; ++c) {
        if (t > 0) state[c] = rho[c] * state[c] + std::sqrt(1 - rho[c] * rho[c]) * rng.Normal();
        row[c] = static_cast<float>(token_scale * scale[c] * state[c]);
      }
      view.WriteRow(l, KV::kValue, t, row.data());
    }
  }
  return out;
}

}  // namespace cachegen
