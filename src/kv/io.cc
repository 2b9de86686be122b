// KV file formats; see io.h and docs/INPUT-FORMATS.md.
#include "kv/io.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>
#include <sys/stat.h>

namespace cachegen {

static_assert(std::endian::native == std::endian::little, "file formats assume a little-endian host");

namespace {

constexpr char kKvRawMagic[8] = {'C', 'G', 'K', 'V', 'R', 'A', 'W', '1'};
constexpr size_t kKvRawHeader = 32;
constexpr uint64_t kMaxDim = 0xffffffffu;

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  const size_t n = out.size();
  out.resize(n + 4);
  std::memcpy(out.data() + n, &v, 4);
}
void PutU64(std::vector<uint8_t>& out, uint64_t v) {
  const size_t n = out.size();
  out.resize(n + 8);
  std::memcpy(out.data() + n, &v, 8);
}

// Shape from 4 dims, checked against the format limits. `what` names the file kind.
Result<KVShape> MakeShape(uint64_t layers, uint64_t heads, uint64_t dim, uint64_t tokens, const char* what) {
  if (layers > kMaxDim || heads > kMaxDim || dim > kMaxDim || tokens > kMaxDim)
    return Status::InvalidArgument(std::string(what) + ": dimension too large");
  KVShape s;
  s.layers = static_cast<uint32_t>(layers);
  s.kv_heads = static_cast<uint32_t>(heads);
  s.head_dim = static_cast<uint32_t>(dim);
  s.tokens = static_cast<uint32_t>(tokens);
  Status st = s.Validate();
  if (!st.ok()) return Status::InvalidArgument(std::string(what) + ": " + st.message());
  return s;
}

Status CheckFiniteIn(const KVTensor& t, const char* what) {
  Status st = CheckFinite(t.view());
  if (!st.ok()) return Status::InvalidArgument(std::string(what) + ": " + st.message());
  return st;
}

// ---------------------------------------------------------------- .npy

// Minimal parser for the npy header dict, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (32, 2, 512, 8, 128), }
// Only the three keys numpy writes are accepted.
class NpyDictParser {
 public:
  explicit NpyDictParser(std::string_view s) : s_(s) {}

  Status Parse(std::string* descr, bool* fortran, std::vector<uint64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    Skip();
    if (!Eat('{')) return Err("expected '{'");
    for (;;) {
      Skip();
      if (Eat('}')) break;
      std::string key;
      CG_RETURN_IF_ERROR(String(&key));
      Skip();
      if (!Eat(':')) return Err("expected ':'");
      Skip();
      if (key == "descr") {
        CG_RETURN_IF_ERROR(String(descr));
        have_descr = true;
      } else if (key == "fortran_order") {
        if (Word("True")) *fortran = true;
        else if (Word("False")) *fortran = false;
        else return Err("fortran_order must be True or False");
        have_fortran = true;
      } else if (key == "shape") {
        CG_RETURN_IF_ERROR(Tuple(shape));
        have_shape = true;
      } else {
        return Err("unknown header key '" + key + "'");
      }
      Skip();
      if (Eat(',')) continue;
      Skip();
      if (Eat('}')) break;
      return Err("expected ',' or '}'");
    }
    if (!have_descr || !have_fortran || !have_shape) return Err("header lacks descr, fortran_order or shape");
    return Status::Ok();
  }

 private:
  Status Err(const std::string& m) { return Status::InvalidArgument("npy: bad header: " + m); }
  void Skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t')) ++pos_;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Word(std::string_view w) {
    if (s_.substr(pos_, w.size()) == w) {
      pos_ += w.size();
      return true;
    }
    return false;
  }
  Status String(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return Err("expected a string");
    const char q = s_[pos_++];
    const size_t end = s_.find(q, pos_);
    if (end == std::string_view::npos) return Err("unterminated string");
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return Status::Ok();
  }
  Status Tuple(std::vector<uint64_t>* out) {
    if (!Eat('(')) return Err("shape must be a tuple");
    for (;;) {
      Skip();
      if (Eat(')')) return Status::Ok();
      if (out->size() >= 16) return Err("shape has too many dimensions");
      uint64_t v = 0;
      size_t digits = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (++digits > 12) return Err("shape dimension too large");
        v = v * 10 + static_cast<uint64_t>(s_[pos_++] - '0');
      }
      if (digits == 0) return Err("shape dimension must be a non-negative integer");
      out->push_back(v);
      Skip();
      if (Eat(',')) continue;
      Skip();
      if (Eat(')')) return Status::Ok();
      return Err("expected ',' or ')' in shape");
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

Result<KVTensor> ParseNpy(std::span<const uint8_t> b) {
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0)
    return Status::InvalidArgument("npy: not a .npy file (bad magic)");
  const uint8_t major = b[6];
  size_t header_len, header_start;
  if (major == 1) {
    header_len = size_t{b[8]} | (size_t{b[9]} << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) return Status::InvalidArgument("npy: truncated header");
    header_len = LoadU32(b.data() + 8);
    header_start = 12;
  } else {
    return Status::InvalidArgument("npy: unsupported format version " + std::to_string(major));
  }
  if (header_len > b.size() - header_start) return Status::InvalidArgument("npy: truncated header");
  std::string_view header(reinterpret_cast<const char*>(b.data() + header_start), header_len);
  std::string descr;
  bool fortran = false;
  std::vector<uint64_t> dims;
  CG_RETURN_IF_ERROR(NpyDictParser(header).Parse(&descr, &fortran, &dims));
  DType dtype;
  if (descr == "<f4") dtype = DType::kF32;
  else if (descr == "<f2") dtype = DType::kF16;
  else return Status::InvalidArgument("npy: dtype '" + descr + "' not supported (want <f4 or <f2)");
  if (fortran) return Status::InvalidArgument("npy: fortran_order arrays not supported (want C order)");
  if (dims.size() != 5)
    return Status::InvalidArgument("npy: array has rank " + std::to_string(dims.size()) +
                                   ", want 5 ([layers, 2, tokens, heads, head_dim])");
  if (dims[1] != 2)
    return Status::InvalidArgument("npy: axis 1 has size " + std::to_string(dims[1]) + ", want 2 (K and V)");
  CG_ASSIGN_OR_RETURN(KVShape shape, MakeShape(dims[0], dims[3], dims[4], dims[2], "npy"));
  const uint64_t data_bytes = shape.values() * DTypeSize(dtype);
  const uint64_t have = b.size() - header_start - header_len;
  if (have != data_bytes)
    return Status::InvalidArgument("npy: data is " + std::to_string(have) + " bytes, shape needs " +
                                   std::to_string(data_bytes));
  KVTensor t(shape, dtype);
  std::memcpy(t.data(), b.data() + header_start + header_len, data_bytes);
  CG_RETURN_IF_ERROR(CheckFiniteIn(t, "npy"));
  return t;
}

std::vector<uint8_t> SerializeNpy(const KVTensor& in) {
  const KVTensor* src = &in;
  KVTensor converted;
  if (in.dtype() == DType::kBF16) {
    converted = in.Converted(DType::kF32);
    src = &converted;
  }
  const KVShape& s = src->shape();
  std::string dict = std::string("{'descr': '") + (src->dtype() == DType::kF32 ? "<f4" : "<f2") +
                     "', 'fortran_order': False, 'shape': (" + std::to_string(s.layers) + ", 2, " +
                     std::to_string(s.tokens) + ", " + std::to_string(s.kv_heads) + ", " +
                     std::to_string(s.head_dim) + "), }";
  // Pad with spaces so that data starts at a multiple of 64, ending in '\n'.
  size_t total = 10 + dict.size() + 1;
  size_t padded = (total + 63) / 64 * 64;
  const bool v2 = padded - 10 > 0xffff;
  if (v2) {
    total = 12 + dict.size() + 1;
    padded = (total + 63) / 64 * 64;
  }
  dict.append(padded - total, ' ');
  dict.push_back('\n');
  std::string head("\x93NUMPY", 6);
  head.push_back(static_cast<char>(v2 ? 2 : 1));
  head.push_back(0);
  const uint32_t len = static_cast<uint32_t>(dict.size());
  head.push_back(static_cast<char>(len & 0xff));
  head.push_back(static_cast<char>((len >> 8) & 0xff));
  if (v2) {
    head.push_back(static_cast<char>((len >> 16) & 0xff));
    head.push_back(static_cast<char>(len >> 24));
  }
  head += dict;
  std::vector<uint8_t> out(head.size() + src->size_bytes());
  std::memcpy(out.data(), head.data(), head.size());
  std::memcpy(out.data() + head.size(), src->data(), src->size_bytes());
  return out;
}

// ---------------------------------------------------------------- .safetensors

Result<DType> SafetensorsDType(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return Status::InvalidArgument("safetensors: dtype '" + s + "' not supported (want F32, F16 or BF16)");
}
const char* SafetensorsName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "F32";
}

// Parses "layers.{i}.k" / "layers.{i}.v"; i is decimal without sign or leading zeros.
bool ParseTensorName(const std::string& name, uint64_t* layer, KV* kv) {
  constexpr std::string_view kPrefix = "layers.";
  if (name.size() < kPrefix.size() + 3 || name.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  const char last = name.back();
  if (name[name.size() - 2] != '.' || (last != 'k' && last != 'v')) return false;
  const std::string_view digits(name.data() + kPrefix.size(), name.size() - kPrefix.size() - 2);
  if (digits.empty() || digits.size() > 6 || (digits.size() > 1 && digits[0] == '0')) return false;
  uint64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *layer = v;
  *kv = last == 'k' ? KV::kKey : KV::kValue;
  return true;
}

Result<KVTensor> ParseSafetensors(std::span<const uint8_t> b) {
  if (b.size() < 8) return Status::InvalidArgument("safetensors: truncated header");
  const uint64_t n = LoadU64(b.data());
  if (n > b.size() - 8) return Status::InvalidArgument("safetensors: header length " + std::to_string(n) +
                                                       " exceeds file size " + std::to_string(b.size()));
  const uint8_t* hdr = b.data() + 8;
  nlohmann::json j = nlohmann::json::parse(hdr, hdr + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument("safetensors: header is not a JSON object");
  const std::span<const uint8_t> data = b.subspan(8 + n);

  struct Entry {
    uint64_t begin, end;
  };
  std::map<std::pair<uint64_t, int>, Entry> entries;
  bool have_dtype = false;
  DType dtype = DType::kF32;
  std::vector<uint64_t> dims;
  uint64_t max_layer = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    uint64_t layer;
    KV kv;
    if (!ParseTensorName(name, &layer, &kv))
      return Status::InvalidArgument("safetensors: unexpected tensor '" + name +
                                     "' (want layers.{i}.k and layers.{i}.v)");
    const nlohmann::json& e = it.value();
    if (!e.is_object()) return Status::InvalidArgument("safetensors: entry '" + name + "' is not an object");
    auto fd = e.find("dtype");
    auto fs = e.find("shape");
    auto fo = e.find("data_offsets");
    if (fd == e.end() || !fd->is_string() || fs == e.end() || !fs->is_array() || fo == e.end() ||
        !fo->is_array() || fo->size() != 2 || !(*fo)[0].is_number_unsigned() || !(*fo)[1].is_number_unsigned())
      return Status::InvalidArgument("safetensors: entry '" + name + "' lacks dtype, shape or data_offsets");
    CG_ASSIGN_OR_RETURN(DType d, SafetensorsDType(fd->get<std::string>()));
    std::vector<uint64_t> sh;
    for (const auto& x : *fs) {
      if (!x.is_number_unsigned()) return Status::InvalidArgument("safetensors: bad shape of '" + name + "'");
      sh.push_back(x.get<uint64_t>());
    }
    if (sh.size() != 3)
      return Status::InvalidArgument("safetensors: tensor '" + name + "' has rank " + std::to_string(sh.size()) +
                                     ", want 3 ([tokens, heads, head_dim])");
    if (!have_dtype) {
      dtype = d;
      dims = sh;
      have_dtype = true;
    } else if (d != dtype || sh != dims) {
      return Status::InvalidArgument("safetensors: tensor '" + name + "' differs in dtype or shape from the others");
    }
    const uint64_t begin = (*fo)[0].get<uint64_t>(), end = (*fo)[1].get<uint64_t>();
    if (begin > end || end > data.size())
      return Status::InvalidArgument("safetensors: data_offsets of '" + name + "' outside the file");
    if (!entries.emplace(std::make_pair(layer, static_cast<int>(kv)), Entry{begin, end}).second)
      return Status::InvalidArgument("safetensors: duplicate tensor '" + name + "'");
    max_layer = std::max(max_layer, layer);
  }
  if (entries.empty()) return Status::InvalidArgument("safetensors: no layers.{i}.k / layers.{i}.v tensors");
  if (entries.size() != 2 * (max_layer + 1))
    return Status::InvalidArgument("safetensors: layers must be 0.." + std::to_string(max_layer) +
                                   ", each with .k and .v");
  CG_ASSIGN_OR_RETURN(KVShape shape, MakeShape(max_layer + 1, dims[1], dims[2], dims[0], "safetensors"));
  const uint64_t sec_bytes = uint64_t{shape.tokens} * shape.channels() * DTypeSize(dtype);
  for (const auto& [key, e] : entries)
    if (e.end - e.begin != sec_bytes)
      return Status::InvalidArgument("safetensors: tensor layers." + std::to_string(key.first) +
                                     (key.second ? ".v" : ".k") + " has " + std::to_string(e.end - e.begin) +
                                     " bytes, shape needs " + std::to_string(sec_bytes));
  KVTensor t(shape, dtype);
  for (const auto& [key, e] : entries)
    std::memcpy(t.data() + (key.first * 2 + static_cast<uint64_t>(key.second)) * sec_bytes, data.data() + e.begin,
                sec_bytes);
  CG_RETURN_IF_ERROR(CheckFiniteIn(t, "safetensors"));
  return t;
}

std::vector<uint8_t> SerializeSafetensors(const KVTensor& t, const KVMetadata& metadata = {}) {
  const KVShape& s = t.shape();
  const uint64_t sec_bytes = uint64_t{s.tokens} * s.channels() * DTypeSize(t.dtype());
  nlohmann::json j = nlohmann::json::object();
  j["__metadata__"] = {{"format", "cachegen-kv"}};
  for (const auto& [k, v] : metadata) j["__metadata__"][k] = v;
  for (uint32_t l = 0; l < s.layers; ++l)
    for (int kv = 0; kv < 2; ++kv) {
      const uint64_t begin = (uint64_t{l} * 2 + static_cast<uint64_t>(kv)) * sec_bytes;
      j["layers." + std::to_string(l) + (kv ? ".v" : ".k")] = {
          {"dtype", SafetensorsName(t.dtype())},
          {"shape", {s.tokens, s.kv_heads, s.head_dim}},
          {"data_offsets", {begin, begin + sec_bytes}}};
    }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + t.size_bytes());
  PutU64(out, header.size());
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), t.data(), t.data() + t.size_bytes());
  return out;
}

// ---------------------------------------------------------------- .kvraw

Result<KVTensor> ParseKvRaw(std::span<const uint8_t> b) {
  if (b.size() < kKvRawHeader) return Status::InvalidArgument("kvraw: truncated header");
  if (std::memcmp(b.data(), kKvRawMagic, 8) != 0) return Status::InvalidArgument("kvraw: bad magic");
  const uint32_t version = LoadU32(b.data() + 8);
  if (version != 1) return Status::InvalidArgument("kvraw: unsupported version " + std::to_string(version));
  const uint8_t d = b[12];
  if (d > 2) return Status::InvalidArgument("kvraw: unknown dtype code " + std::to_string(d));
  if (b[13] || b[14] || b[15]) return Status::InvalidArgument("kvraw: reserved bytes not zero");
  const DType dtype = static_cast<DType>(d);
  CG_ASSIGN_OR_RETURN(KVShape shape, MakeShape(LoadU32(b.data() + 16), LoadU32(b.data() + 20),
                                               LoadU32(b.data() + 24), LoadU32(b.data() + 28), "kvraw"));
  const uint64_t data_bytes = shape.values() * DTypeSize(dtype);
  if (b.size() - kKvRawHeader != data_bytes)
    return Status::InvalidArgument("kvraw: data is " + std::to_string(b.size() - kKvRawHeader) +
                                   " bytes, shape needs " + std::to_string(data_bytes));
  KVTensor t(shape, dtype);
  std::memcpy(t.data(), b.data() + kKvRawHeader, data_bytes);
  CG_RETURN_IF_ERROR(CheckFiniteIn(t, "kvraw"));
  return t;
}

std::vector<uint8_t> SerializeKvRaw(const KVTensor& t) {
  std::vector<uint8_t> out(kKvRawMagic, kKvRawMagic + 8);
  PutU32(out, 1);
  out.push_back(static_cast<uint8_t>(t.dtype()));
  out.insert(out.end(), 3, 0);
  const KVShape& s = t.shape();
  PutU32(out, s.layers);
  PutU32(out, s.kv_heads);
  PutU32(out, s.head_dim);
  PutU32(out, s.tokens);
  out.insert(out.end(), t.data(), t.data() + t.size_bytes());
  return out;
}

}  // namespace

Result<KVFileFormat> KVFileFormatFromPath(const std::string& path) {
  if (EndsWith(path, ".npy")) return KVFileFormat::kNpy;
  if (EndsWith(path, ".safetensors")) return KVFileFormat::kSafetensors;
  if (EndsWith(path, ".kvraw")) return KVFileFormat::kKvRaw;
  return Status::InvalidArgument("'" + path + "': unknown KV file extension (want .npy, .safetensors or .kvraw)");
}

Result<KVTensor> ParseKV(std::span<const uint8_t> bytes, KVFileFormat format) {
  switch (format) {
    case KVFileFormat::kNpy: return ParseNpy(bytes);
    case KVFileFormat::kSafetensors: return ParseSafetensors(bytes);
    case KVFileFormat::kKvRaw: return ParseKvRaw(bytes);
  }
  return Status::InvalidArgument("unknown KV file format");
}

Result<std::vector<uint8_t>> SerializeKV(const KVTensor& tensor, KVFileFormat format) {
  CG_RETURN_IF_ERROR(tensor.shape().Validate());
  switch (format) {
    case KVFileFormat::kNpy: return SerializeNpy(tensor);
    case KVFileFormat::kSafetensors: return SerializeSafetensors(tensor);
    case KVFileFormat::kKvRaw: return SerializeKvRaw(tensor);
  }
  return Status::InvalidArgument("unknown KV file format");
}

Result<std::vector<uint8_t>> ReadFileBytes(const std::string& path, uint64_t max_bytes) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::IOError("cannot open '" + path + "': " + std::strerror(errno));
  // Only regular files: a directory or device would report a meaningless size.
  struct stat st;
  if (fstat(fileno(f.get()), &st) != 0 || !S_ISREG(st.st_mode))
    return Status::IOError("'" + path + "' is not a regular file");
  const off_t size = st.st_size;
  if (static_cast<uint64_t>(size) > max_bytes)
    return Status::InvalidArgument("'" + path + "' is " + std::to_string(size) + " bytes, over the " +
                                   std::to_string(max_bytes) + "-byte limit");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (size > 0 && std::fread(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
    return Status::IOError("cannot read '" + path + "'");
  return bytes;
}

Status WriteFileBytes(const std::string& path, std::span<const uint8_t> bytes) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return Status::IOError("cannot create '" + path + "': " + std::strerror(errno));
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
    return Status::IOError("cannot write '" + path + "'");
  if (std::fclose(f.release()) != 0) return Status::IOError("cannot close '" + path + "'");
  return Status::Ok();
}

Result<KVTensor> ReadKV(const std::string& path) {
  CG_ASSIGN_OR_RETURN(KVFileFormat format, KVFileFormatFromPath(path));
  CG_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  Result<KVTensor> t = ParseKV(bytes, format);
  if (!t.ok()) return Status(t.status().code() == StatusCode::kInvalidArgument
                                 ? Status::InvalidArgument("'" + path + "': " + t.status().message())
                                 : t.status());
  return t;
}

Status WriteKV(const std::string& path, const KVTensor& tensor) {
  CG_ASSIGN_OR_RETURN(KVFileFormat format, KVFileFormatFromPath(path));
  CG_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, SerializeKV(tensor, format));
  return WriteFileBytes(path, bytes);
}

Status WriteSafetensors(const std::string& path, const KVTensor& tensor, const KVMetadata& metadata) {
  return WriteFileBytes(path, SerializeSafetensors(tensor, metadata));
}

Result<KVMetadata> ReadSafetensorsMetadata(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::IOError("cannot open '" + path + "': " + std::strerror(errno));
  uint8_t len[8];
  if (std::fread(len, 1, 8, f.get()) != 8) return Status::InvalidArgument("safetensors: truncated header");
  const uint64_t n = LoadU64(len);
  constexpr uint64_t kMaxHeader = 100 << 20;  // as the format's own readers bound it
  if (n > kMaxHeader) return Status::InvalidArgument("safetensors: header of " + std::to_string(n) + " bytes");
  std::string header(n, '\0');
  if (std::fread(header.data(), 1, n, f.get()) != n) return Status::InvalidArgument("safetensors: truncated header");
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument("safetensors: header is not a JSON object");
  KVMetadata out;
  if (auto m = j.find("__metadata__"); m != j.end() && m->is_object())
    for (const auto& [k, v] : m->items())
      if (v.is_string()) out[k] = v.get<std::string>();
  return out;
}

}  // namespace cachegen
