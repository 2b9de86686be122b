// The C API: thin wrappers over Encoder/Decoder that turn Status into codes.
#include "cachegen/cachegen.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "cachegen/codec.h"
#include "cachegen/profile.h"

namespace {

using cachegen::DType;
using cachegen::Status;

int Fail(const Status& s, char* err, size_t err_len) {
  if (err && err_len > 0) {
    const std::string& m = s.message();
    const size_t n = std::min(m.size(), err_len - 1);
    std::memcpy(err, m.data(), n);
    err[n] = '\0';
  }
  return static_cast<int>(s.code());
}

int Ok(char* err, size_t err_len) {
  if (err && err_len > 0) err[0] = '\0';
  return CG_OK;
}

bool ValidDType(int d) { return d == CG_F32 || d == CG_F16 || d == CG_BF16; }

// Runs body, turning any exception into a status: none may cross into C.
template <typename Body>
int Guarded(char* err, size_t err_len, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(Status::Internal("out of memory"), err, err_len);
  } catch (const std::exception& e) {
    return Fail(Status::Internal(std::string("unexpected exception: ") + e.what()), err, err_len);
  } catch (...) {
    return Fail(Status::Internal("unexpected exception"), err, err_len);
  }
}

}  // namespace

// The C handle of a profile: the shared, immutable C++ object (and a set of
// it, what a decoder is given).
struct cg_profile {
  std::shared_ptr<const cachegen::Profile> profile;
  cachegen::ProfileSet set;
  explicit cg_profile(std::shared_ptr<const cachegen::Profile> p) : profile(p), set(std::move(p)) {}
};

extern "C" {

const char* cg_version(void) { return CACHEGEN_VERSION; }

void cg_config_default(cg_config* cfg) {
  if (!cfg) return;
  const cachegen::CodecConfig d;
  cfg->codec = nullptr;
  cfg->bits_per_value = d.bits_per_value;
  cfg->snr_db = d.snr_db;
  cfg->max_rel_error = d.max_rel_error;
  cfg->levels = d.levels;
  cfg->chunk_tokens = d.chunk_tokens;
  cfg->threads = d.threads;
  cfg->token_start = 0;
  cfg->profile = nullptr;
  cfg->max_kl = d.max_kl;
}

int cg_profile_load(const uint8_t* bytes, size_t len, cg_profile** out, char* err, size_t err_len) {
  if (out) *out = nullptr;
  if (!bytes || !out) return Fail(Status::InvalidArgument("null argument"), err, err_len);
  return Guarded(err, err_len, [&] {
    auto p = cachegen::Profile::Parse({bytes, len});
    if (!p.ok()) return Fail(p.status(), err, err_len);
    *out = new cg_profile(std::move(*p));
    return Ok(err, err_len);
  });
}

uint64_t cg_profile_id(const cg_profile* profile) { return profile ? profile->profile->id() : 0; }

void cg_profile_free(cg_profile* profile) { delete profile; }

int cg_encode(const void* data, int dtype, uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
              uint32_t tokens, const cg_config* cfg, uint8_t** out, size_t* out_len, char* err,
              size_t err_len) {
  if (out) *out = nullptr;
  if (out_len) *out_len = 0;
  if (!data || !out || !out_len) return Fail(Status::InvalidArgument("null argument"), err, err_len);
  if (!ValidDType(dtype)) return Fail(Status::InvalidArgument("unknown dtype"), err, err_len);
  cg_config c;
  cg_config_default(&c);
  if (cfg) c = *cfg;
  cachegen::CodecConfig config;
  if (c.codec) config.codec = c.codec;
  config.bits_per_value = c.bits_per_value;
  config.snr_db = c.snr_db;
  config.max_rel_error = c.max_rel_error;
  config.levels = c.levels == 0 ? 1 : c.levels;
  config.chunk_tokens = c.chunk_tokens;
  config.threads = c.threads;
  config.max_kl = c.max_kl;
  if (c.profile) {
    config.profile = c.profile->profile;
    config.quantizer = config.profile->quantizer().value_or(config.quantizer);
  }
  return Guarded(err, err_len, [&] {
    auto enc = cachegen::Encoder::Create(config);
    if (!enc.ok()) return Fail(enc.status(), err, err_len);
    const cachegen::KVShape shape{layers, kv_heads, head_dim, tokens};
    if (Status s = shape.Validate(); !s.ok()) return Fail(s, err, err_len);
    const cachegen::KVView view(const_cast<void*>(data), static_cast<DType>(dtype), shape,
                                cachegen::ContiguousStrides(shape));
    auto bytes = enc->Encode(view, nullptr, c.token_start);
    if (!bytes.ok()) return Fail(bytes.status(), err, err_len);
    auto* buf = static_cast<uint8_t*>(std::malloc(bytes->size()));
    if (!buf) return Fail(Status::Internal("out of memory"), err, err_len);
    std::memcpy(buf, bytes->data(), bytes->size());
    *out = buf;
    *out_len = bytes->size();
    return Ok(err, err_len);
  });
}

int cg_inspect(const uint8_t* container, size_t len, cg_info* info, char* err, size_t err_len) {
  if (!container || !info) return Fail(Status::InvalidArgument("null argument"), err, err_len);
  return Guarded(err, err_len, [&] {
    auto dec = cachegen::Decoder::Open({container, len});
    if (!dec.ok()) return Fail(dec.status(), err, err_len);
    const cachegen::ContainerInfo& ci = dec->info();
    std::memset(info, 0, sizeof *info);
    std::strncpy(info->codec, ci.codec.c_str(), sizeof info->codec - 1);
    info->dtype = static_cast<int>(ci.dtype);
    info->layers = ci.shape.layers;
    info->kv_heads = ci.shape.kv_heads;
    info->head_dim = ci.shape.head_dim;
    info->tokens = ci.shape.tokens;
    info->token_start = ci.token_start;
    info->levels = ci.levels;
    info->chunk_tokens = ci.chunk_tokens;
    info->chunks = static_cast<uint32_t>(ci.chunks.size());
    info->bytes = ci.bytes;
    return Ok(err, err_len);
  });
}

int cg_decode(const uint8_t* container, size_t len, uint32_t level, int dtype, void* out, size_t out_len,
              uint32_t threads, char* err, size_t err_len) {
  return cg_decode_using_profile(container, len, nullptr, level, dtype, out, out_len, threads, err, err_len);
}

int cg_decode_using_profile(const uint8_t* container, size_t len, const cg_profile* profile, uint32_t level,
                            int dtype, void* out, size_t out_len, uint32_t threads, char* err, size_t err_len) {
  if (!container || !out) return Fail(Status::InvalidArgument("null argument"), err, err_len);
  if (!ValidDType(dtype)) return Fail(Status::InvalidArgument("unknown dtype"), err, err_len);
  return Guarded(err, err_len, [&] {
    auto dec = cachegen::Decoder::Open({container, len}, profile ? &profile->set : nullptr);
    if (!dec.ok()) return Fail(dec.status(), err, err_len);
    const cachegen::KVShape& shape = dec->info().shape;
    const uint64_t need = shape.values() * cachegen::DTypeSize(static_cast<DType>(dtype));
    if (need != out_len)
      return Fail(Status::InvalidArgument("output buffer is " + std::to_string(out_len) + " bytes, need " +
                                          std::to_string(need)),
                  err, err_len);
    const cachegen::KVView view(out, static_cast<DType>(dtype), shape, cachegen::ContiguousStrides(shape));
    if (Status s = dec->Decode(view, level, threads); !s.ok()) return Fail(s, err, err_len);
    return Ok(err, err_len);
  });
}

void cg_free(void* p) { std::free(p); }

}  // extern "C"
