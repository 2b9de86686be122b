// The decode fuzzer's model profiles, shared with the parity harness that
// replays its corpus (tests/unit/schedule_parity_test.cc): trained
// deterministically at start-up, so that frames in the corpus referencing
// them decode on the profile paths wherever they are replayed.
#pragma once

#include <memory>
#include <random>

#include "cachegen/codec.h"
#include "cachegen/kv.h"
#include "cachegen/profile.h"

namespace cachegen::fuzz {

// Values whose channels differ in scale (so profiles learn channel classes).
inline KVTensor RandomKV(const KVShape& shape, std::mt19937& rng) {
  KVTensor t(shape, DType::kF32);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto* p = reinterpret_cast<float*>(t.data());
  for (uint64_t i = 0; i < shape.values(); ++i) p[i] = n(rng) * (1 + float(i % shape.head_dim));
  return t;
}

// Model profiles of one shape (key transforms and channel classes, one per
// quantizer), registered so that frames referencing them decode: their
// sections take the profile paths (table-form streams, class tables).
struct FuzzProfiles {
  KVShape shape{2, 2, 8, 48};
  std::shared_ptr<const Profile> by_quantizer[2];
  ProfileSet set;  // what every decode is given
  FuzzProfiles() {
    std::mt19937 rng(7);
    const KVTensor t = RandomKV(shape, rng);
    const KVView view = t.view();
    for (int q = 0; q < 2; ++q) {
      CodecConfig cfg;
      cfg.quantizer = q ? CodecConfig::Quantizer::kLloyd : CodecConfig::Quantizer::kUniform;
      auto p = Profile::Train({&view, 1}, cfg);
      if (!p.ok()) continue;
      set.Add(*p);
      by_quantizer[q] = *p;
    }
  }
};
inline const FuzzProfiles& Profiles() {
  static const FuzzProfiles p;
  return p;
}

}  // namespace cachegen::fuzz
