// cachegen decode throughput of frames encoded with a model profile, with
// and without channel classes (docs/results/eval.md "Channel classes"): classes
// move a K section's streams from the lockstep/AVX2 group decoders to the
// per-symbol table decoder (rans::DecodeStreamWithTables). Synthetic KV of
// a production head size (8 layers, 8 KV heads, 64 dims, 1024 tokens,
// 256-token chunks), profile trained on three other slices of the same
// generator, 2 bits/value, one thread, decoded to f16. Reports fp16 bytes/s.
#include <benchmark/benchmark.h>

#include "cachegen/codec.h"
#include "cachegen/profile.h"
#include "kv/synthetic.h"

namespace {

using namespace cachegen;

void BM_DecodeWithProfile(benchmark::State& state) {
  const bool classes = state.range(0) != 0, transforms = state.range(1) != 0;
  const KVShape shape{8, 8, 64, 1024};
  KVShape whole = shape;
  whole.tokens = shape.tokens * 4;
  const KVTensor kv = *SyntheticKV(whole, DType::kF16, 7);
  std::vector<KVTensor> train;
  std::vector<KVView> views;
  for (uint32_t i = 1; i < 4; ++i) train.push_back(kv.Slice(i * shape.tokens, shape.tokens));
  for (const KVTensor& t : train) views.push_back(t.view());
  ProfileTrainOptions options;
  options.key_channel_classes = classes;
  options.key_transform = transforms;
  auto profile = Profile::Train(views, CodecConfig{}, options);
  if (!profile.ok()) return state.SkipWithError(profile.status().ToString().c_str());
  const ProfileSet profiles(*profile);
  CodecConfig cfg;
  cfg.bits_per_value = 2;
  cfg.profile = *profile;
  const KVTensor context = kv.Slice(0, shape.tokens);
  auto bytes = Encoder::Create(cfg)->Encode(context.view());
  if (!bytes.ok()) return state.SkipWithError(bytes.status().ToString().c_str());
  auto decoder = Decoder::Open(*bytes, &profiles);
  if (!decoder.ok()) return state.SkipWithError(decoder.status().ToString().c_str());
  KVTensor out(shape, DType::kF16);
  for (auto _ : state) {
    const Status st = decoder->Decode(out.view(), 0, /*threads=*/1);
    if (!st.ok()) return state.SkipWithError(st.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * shape.values() * 2));
  state.counters["bits_per_value"] = double(bytes->size()) * 8 / double(shape.values());
}
BENCHMARK(BM_DecodeWithProfile)
    ->ArgNames({"classes", "key_transform"})
    ->Args({0, 1})
    ->Args({1, 1})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Unit(benchmark::kMillisecond);

}  // namespace
