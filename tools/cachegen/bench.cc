// `cachegen bench` and `cachegen demo`: every codec on the same KV, with
// memcpy and zstd decode speed measured in the same run as references.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zstd.h>

#include "cachegen/cli.h"
#include "cachegen/codec.h"
#include "cachegen/profile.h"
#include "common/parallel.h"

namespace cachegen::cli {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median seconds of `reps` runs of fn (fn returns a Status; the first failure wins).
template <typename Fn>
Result<double> TimeMedian(uint32_t reps, Fn&& fn) {
  std::vector<double> t;
  for (uint32_t r = 0; r < std::max(reps, 1u); ++r) {
    const auto a = std::chrono::steady_clock::now();
    Status st = fn();
    const auto b = std::chrono::steady_clock::now();
    if (!st.ok()) return st;
    t.push_back(Seconds(a, b));
  }
  return Median(t);
}

// zstd -3 over the input's fp16 bytes, compressed and decompressed as the references.
struct ZstdRef {
  std::vector<uint8_t> frame;
  const uint8_t* raw = nullptr;
  size_t raw_bytes = 0;
  std::vector<uint8_t>* dst = nullptr;
  std::vector<uint8_t>* scratch = nullptr;  // ZSTD_compressBound bytes
  Status Compress() const {
    const size_t n = ZSTD_compress(scratch->data(), scratch->size(), raw, raw_bytes, 3);
    if (ZSTD_isError(n)) return Status::Internal(std::string("zstd: ") + ZSTD_getErrorName(n));
    return Status::Ok();
  }
  Status Decompress() const {
    const size_t n = ZSTD_decompress(dst->data(), dst->size(), frame.data(), frame.size());
    if (ZSTD_isError(n) || n != raw_bytes) return Status::Internal("zstd decompress failed");
    return Status::Ok();
  }
};

struct ScalingPoint {
  uint32_t threads = 0;
  double decode_mb_s = 0, speedup = 0;
};

struct CodecResult {
  std::string name;
  std::string status = "ok";  // "ok", "unavailable", "error"
  std::string message;
  double bits_per_value = 0, ratio_vs_fp16 = 0;
  Quality q;
  double encode_mb_s = 0, encode_mb_s_mt = 0, decode_mb_s = 0, decode_mb_s_mt = 0, decode_vs_zstd = 0;
  double decode_vs_zstd_best = 0;  // fastest zstd rep / fastest decode rep
  double encode_vs_zstd = 0;       // median per-rep one-thread encode speed / zstd -3 compression speed
  std::vector<ScalingPoint> scaling;  // --thread-scaling
};

nlohmann::json Num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// `profile` (cachegen only; may be null): encode with it and its quantizer.
Status BenchOne(const KVTensor& input, const std::string& codec, const std::shared_ptr<const Profile>& profile,
                const BenchOptions& o, double mb, const ZstdRef& zstd, CodecResult* r) {
  CodecConfig cfg;
  cfg.codec = codec;
  cfg.chunk_tokens = o.chunk_tokens;
  if (codec == "cachegen") {
    if (o.bits > 0) cfg.bits_per_value = o.bits;
    cfg.levels = o.levels;
    cfg.rope = o.rope;
    cfg.group_tokens = o.group_tokens;
    cfg.profile = profile;
    if (profile) cfg.quantizer = profile->quantizer().value_or(cfg.quantizer);
  }
  cfg.threads = 1;
  CG_ASSIGN_OR_RETURN(Encoder enc1, Encoder::Create(cfg));
  cfg.threads = o.threads;
  CG_ASSIGN_OR_RETURN(Encoder encn, Encoder::Create(cfg));

  // One-thread encode, each rep right after a zstd -3 compression of the
  // same bytes: encode_vs_zstd is the median of the per-rep ratios.
  std::vector<uint8_t> bytes;
  std::vector<double> t_enc_reps, enc_ratios;
  for (uint32_t rep = 0; rep < std::max(o.reps, 1u); ++rep) {
    CG_ASSIGN_OR_RETURN(double tz, TimeMedian(1, [&] { return zstd.Compress(); }));
    CG_ASSIGN_OR_RETURN(double te, TimeMedian(1, [&]() -> Status {
                          CG_ASSIGN_OR_RETURN(bytes, enc1.Encode(input.view()));
                          return Status::Ok();
                        }));
    t_enc_reps.push_back(te);
    enc_ratios.push_back(tz / te);
  }
  const double t_enc = Median(t_enc_reps);
  r->encode_vs_zstd = Median(enc_ratios);
  CG_ASSIGN_OR_RETURN(double t_enc_mt, TimeMedian(o.reps, [&]() -> Status {
                        CG_ASSIGN_OR_RETURN(bytes, encn.Encode(input.view()));
                        return Status::Ok();
                      }));
  const ProfileSet profiles(profile);
  CG_ASSIGN_OR_RETURN(Decoder dec, Decoder::Open(bytes, &profiles));
  KVTensor out(input.shape(), o.out_dtype);
  // One-thread decode, each rep right after a zstd decode of the same data:
  // decode_vs_zstd is the median of the per-rep ratios, so a load change on a
  // shared machine hits both sides of a ratio alike.
  // The ratio of the fastest reps as well: on a loaded machine the fastest
  // rep of each is the one least disturbed.
  std::vector<double> t_dec_reps, t_zstd_reps, ratios;
  for (uint32_t rep = 0; rep < std::max(o.reps, 1u); ++rep) {
    CG_ASSIGN_OR_RETURN(double tz, TimeMedian(1, [&] { return zstd.Decompress(); }));
    CG_ASSIGN_OR_RETURN(double td, TimeMedian(1, [&] { return dec.Decode(out.view(), 0, 1); }));
    t_dec_reps.push_back(td);
    t_zstd_reps.push_back(tz);
    ratios.push_back(tz / td);
  }
  const double t_dec = Median(t_dec_reps);
  r->decode_vs_zstd = Median(ratios);
  r->decode_vs_zstd_best = *std::min_element(t_zstd_reps.begin(), t_zstd_reps.end()) /
                           *std::min_element(t_dec_reps.begin(), t_dec_reps.end());
  CG_ASSIGN_OR_RETURN(double t_dec_mt, TimeMedian(o.reps, [&] { return dec.Decode(out.view(), 0, o.threads); }));
  if (o.thread_scaling) {
    const uint32_t max_threads = ResolveThreads(o.threads);
    for (uint32_t t = 1; t <= max_threads; ++t) {
      CG_ASSIGN_OR_RETURN(double secs, TimeMedian(o.reps, [&] { return dec.Decode(out.view(), 0, t); }));
      const double mb_s = mb / secs;
      r->scaling.push_back({t, mb_s, r->scaling.empty() ? 1.0 : mb_s / r->scaling[0].decode_mb_s});
    }
  }

  const double values = static_cast<double>(input.shape().values());
  r->bits_per_value = static_cast<double>(bytes.size()) * 8.0 / values;
  r->ratio_vs_fp16 = 16.0 / r->bits_per_value;
  r->q = Compare(input, out);
  r->encode_mb_s = mb / t_enc;
  r->encode_mb_s_mt = mb / t_enc_mt;
  r->decode_mb_s = mb / t_dec;
  r->decode_mb_s_mt = mb / t_dec_mt;
  return Status::Ok();
}

}  // namespace

Status RunBench(const KVTensor& input, const std::string& input_name, const BenchOptions& o) {
  const KVTensor f16 = input.dtype() == DType::kF16 ? KVTensor() : input.Converted(DType::kF16);
  const KVTensor& half = input.dtype() == DType::kF16 ? input : f16;
  const double mb = static_cast<double>(half.size_bytes()) / 1e6;
  const uint32_t reps = std::max(o.reps, 1u);

  // References on the same fp16 bytes: memcpy and zstd -3 decompression (single thread).
  std::vector<uint8_t> copy(half.size_bytes());
  CG_ASSIGN_OR_RETURN(double t_memcpy, TimeMedian(reps * 3, [&] {
                        std::memcpy(copy.data(), half.data(), half.size_bytes());
                        return Status::Ok();
                      }));
  ZstdRef zref;
  zref.raw = static_cast<const uint8_t*>(half.data());
  zref.raw_bytes = half.size_bytes();
  zref.dst = &copy;
  std::vector<uint8_t> zscratch(ZSTD_compressBound(half.size_bytes()));
  zref.scratch = &zscratch;
  zref.frame.resize(ZSTD_compressBound(half.size_bytes()));
  const size_t zn = ZSTD_compress(zref.frame.data(), zref.frame.size(), half.data(), half.size_bytes(), 3);
  if (ZSTD_isError(zn)) return Status::Internal(std::string("zstd: ") + ZSTD_getErrorName(zn));
  zref.frame.resize(zn);
  CG_ASSIGN_OR_RETURN(double t_zstd, TimeMedian(reps, [&] { return zref.Decompress(); }));
  CG_ASSIGN_OR_RETURN(double t_zstd_c, TimeMedian(reps, [&] { return zref.Compress(); }));
  const double memcpy_mb_s = mb / t_memcpy, zstd_mb_s = mb / t_zstd, zstd_c_mb_s = mb / t_zstd_c;

  std::vector<std::string> names = o.codecs.empty() ? CodecNames() : o.codecs;
  std::vector<CodecResult> results;
  bool failed = false;
  for (const std::string& name : names) {
    for (const bool with_profile : {false, true}) {
      if (with_profile && (name != "cachegen" || !o.profile)) continue;
      CodecResult r;
      r.name = with_profile ? name + "+prof" : name;
      Status st = BenchOne(half, name, with_profile ? o.profile : nullptr, o, mb, zref, &r);
      if (!st.ok()) {
        r.status = st.code() == StatusCode::kUnsupported ? "unavailable" : "error";
        r.message = st.message();
        failed |= st.code() != StatusCode::kUnsupported;
      }
      results.push_back(std::move(r));
    }
  }

  const KVShape& s = input.shape();
  if (o.json) {
    nlohmann::json j;
    j["codecs"] = nlohmann::json::array();
    for (const CodecResult& r : results) {
      nlohmann::json c = {{"name", r.name}, {"status", r.status}};
      if (r.status == "ok") {
        c["bits_per_value"] = Num(r.bits_per_value);
        c["ratio_vs_fp16"] = Num(r.ratio_vs_fp16);
        c["snr_db_k"] = Num(r.q.snr_db_k);
        c["snr_db_v"] = Num(r.q.snr_db_v);
        c["max_err_k"] = Num(r.q.max_err_k);
        c["max_err_v"] = Num(r.q.max_err_v);
        c["encode_mb_s"] = Num(r.encode_mb_s);
        c["encode_mb_s_mt"] = Num(r.encode_mb_s_mt);
        c["encode_vs_zstd"] = Num(r.encode_vs_zstd);
        c["decode_mb_s"] = Num(r.decode_mb_s);
        c["decode_mb_s_mt"] = Num(r.decode_mb_s_mt);
        c["decode_vs_zstd"] = Num(r.decode_vs_zstd);
        c["decode_vs_zstd_best"] = Num(r.decode_vs_zstd_best);
        if (o.thread_scaling) {
          c["thread_scaling"] = nlohmann::json::array();
          for (const ScalingPoint& p : r.scaling)
            c["thread_scaling"].push_back(
                {{"threads", p.threads}, {"decode_mb_s", Num(p.decode_mb_s)}, {"speedup", Num(p.speedup)}});
        }
      } else {
        c["message"] = r.message;
      }
      j["codecs"].push_back(std::move(c));
    }
    j["reference"] = {{"memcpy_mb_s", Num(memcpy_mb_s)}, {"zstd_decode_mb_s", Num(zstd_mb_s)},
                      {"zstd_compress_mb_s", Num(zstd_c_mb_s)},
                      {"zstd_bits_per_value", Num(static_cast<double>(zn) * 8.0 / static_cast<double>(s.values()))}};
    j["input"] = {{"name", input_name},       {"layers", s.layers}, {"kv_heads", s.kv_heads},
                  {"head_dim", s.head_dim},   {"tokens", s.tokens}, {"dtype", DTypeName(input.dtype())},
                  {"values", s.values()},     {"reps", reps},       {"chunk_tokens", o.chunk_tokens},
                  {"levels", o.levels},
                  {"threads", ResolveThreads(o.threads)}};
    std::puts(j.dump(2).c_str());
  } else {
    std::printf("input: %s (%s, %s, %.1f MB as fp16), median of %u reps, %u threads for _mt%s\n", input_name.c_str(),
                s.ToString().c_str(), DTypeName(input.dtype()), mb, reps, ResolveThreads(o.threads),
                o.levels > 1 ? fmt::format(", cachegen {} levels", o.levels).c_str() : "");
    std::printf("%-13s %6s %6s %8s %8s %9s %9s %8s %9s %6s %8s %9s %7s %7s\n", "codec", "bits", "ratio", "snrK_dB",
                "snrV_dB", "maxerrK", "maxerrV", "encMB/s", "encMB/smt", "encVsZ", "decMB/s", "decMB/smt", "vsZstd",
                "vsZbest");
    for (const CodecResult& r : results) {
      if (r.status != "ok") {
        std::printf("%-13s %s: %s\n", r.name.c_str(), r.status.c_str(), r.message.c_str());
        continue;
      }
      auto snr = [](double v) { return std::isfinite(v) ? fmt::format("{:.2f}", v) : std::string("exact"); };
      std::printf("%-13s %6.3f %6.2f %8s %8s %9.4g %9.4g %8.0f %9.0f %6.2f %8.0f %9.0f %7.2f %7.2f\n", r.name.c_str(),
                  r.bits_per_value, r.ratio_vs_fp16, snr(r.q.snr_db_k).c_str(), snr(r.q.snr_db_v).c_str(),
                  r.q.max_err_k, r.q.max_err_v, r.encode_mb_s, r.encode_mb_s_mt, r.encode_vs_zstd, r.decode_mb_s,
                  r.decode_mb_s_mt, r.decode_vs_zstd, r.decode_vs_zstd_best);
    }
    for (const CodecResult& r : results) {
      if (r.status != "ok" || r.scaling.empty()) continue;
      std::printf("%s decode threads:", r.name.c_str());
      for (const ScalingPoint& p : r.scaling) std::printf(" %u: %.0f MB/s (%.2fx)", p.threads, p.decode_mb_s, p.speedup);
      std::printf("\n");
    }
    std::printf("reference: memcpy %.0f MB/s, zstd -3 compress %.0f MB/s, decode %.0f MB/s (%.3f bits/value)\n",
                memcpy_mb_s, zstd_c_mb_s, zstd_mb_s, static_cast<double>(zn) * 8.0 / static_cast<double>(s.values()));
    std::printf("MB = 1e6 bytes of fp16 input/output; bits include all headers and side information; encVsZ and\n"
                "vsZstd = medians of per-rep ratios of one-thread encode (decode) speed to a zstd -3 compression\n"
                "(decompression) run right before it; vsZbest = the same reps' fastest zstd decode time over their\n"
                "fastest decode time\n");
  }
  if (failed) return Status::Internal("some codecs failed (see above)");
  return Status::Ok();
}

}  // namespace cachegen::cli
