// Codec bindings: CodecConfig, Encoder, Decoder, and the frame functions.
#include <pybind11/stl.h>

#include "bindings.h"
#include "cachegen/codec.h"
#include "cachegen/profile.h"

namespace cachegen::python {
namespace {

const char* RopeKindName(RopeConfig::Kind k) {
  return k == RopeConfig::Kind::kNormal ? "normal" : k == RopeConfig::Kind::kNeox ? "neox" : "none";
}
RopeConfig::Kind ParseRopeKind(const std::string& name) {
  if (name == "none") return RopeConfig::Kind::kNone;
  if (name == "normal") return RopeConfig::Kind::kNormal;
  if (name == "neox") return RopeConfig::Kind::kNeox;
  throw py::value_error("rope must be none, normal or neox, got '" + name + "'");
}

// The profile a config holds; Python holds profiles as shared_ptr<Profile>.
std::shared_ptr<Profile> MutableProfile(const std::shared_ptr<const Profile>& p) {
  return std::const_pointer_cast<Profile>(p);
}

CodecConfig ConfigFromKwargs(const py::kwargs& options) {
  py::object config = py::cast(CodecConfig{});
  for (auto [name, value] : options) {
    if (!py::hasattr(config, name)) throw py::type_error("unknown codec option '" + py::str(name).cast<std::string>() + "'");
    py::setattr(config, name, value);
  }
  return config.cast<CodecConfig>();
}

void BindConfig(py::module_& m) {
  py::class_<CodecConfig>(m, "CodecConfig",
                          "Every option of the encoder (include/cachegen/codec.h); keyword arguments set them")
      .def(py::init(&ConfigFromKwargs))
      .def_readwrite("codec", &CodecConfig::codec)
      .def_readwrite("bits_per_value", &CodecConfig::bits_per_value)
      .def_readwrite("snr_db", &CodecConfig::snr_db)
      .def_readwrite("max_rel_error", &CodecConfig::max_rel_error)
      .def_readwrite("max_kl", &CodecConfig::max_kl)
      .def_readwrite("level_bits", &CodecConfig::level_bits)
      .def_readwrite("levels", &CodecConfig::levels)
      .def_readwrite("chunk_tokens", &CodecConfig::chunk_tokens)
      .def_readwrite("group_tokens", &CodecConfig::group_tokens)
      .def_readwrite("rotate", &CodecConfig::rotate)
      .def_readwrite("layer_slope", &CodecConfig::layer_slope)
      .def_readwrite("key_step_scale", &CodecConfig::key_step_scale)
      .def_property(
          "rope", [](const CodecConfig& c) { return RopeKindName(c.rope.kind); },
          [](CodecConfig& c, const std::string& k) { c.rope.kind = ParseRopeKind(k); })
      .def_property(
          "rope_dims", [](const CodecConfig& c) { return c.rope.dims; },
          [](CodecConfig& c, uint32_t v) { c.rope.dims = v; })
      .def_property(
          "rope_theta", [](const CodecConfig& c) { return c.rope.freq_base; },
          [](CodecConfig& c, double v) { c.rope.freq_base = v; })
      .def_property(
          "rope_scale", [](const CodecConfig& c) { return c.rope.freq_scale; },
          [](CodecConfig& c, double v) { c.rope.freq_scale = v; })
      .def_property(
          "profile", [](const CodecConfig& c) { return MutableProfile(c.profile); },
          [](CodecConfig& c, std::shared_ptr<Profile> p) { c.profile = std::move(p); })
      .def_property(
          "quantizer",
          [](const CodecConfig& c) { return c.quantizer == CodecConfig::Quantizer::kLloyd ? "lloyd" : "uniform"; },
          [](CodecConfig& c, const std::string& q) {
            if (q != "uniform" && q != "lloyd") throw py::value_error("quantizer must be uniform or lloyd");
            c.quantizer = q == "lloyd" ? CodecConfig::Quantizer::kLloyd : CodecConfig::Quantizer::kUniform;
          })
      .def_readwrite("recent_tokens", &CodecConfig::recent_tokens)
      .def_readwrite("recent_step_scale", &CodecConfig::recent_step_scale)
      .def_readwrite("threads", &CodecConfig::threads);
}

py::dict FrameStatsDict(const FrameStats& f) {
  py::dict d;
  d["chunk"] = f.chunk;
  d["level"] = f.level;
  d["token_start"] = f.token_start;
  d["tokens"] = f.tokens;
  d["bytes"] = f.bytes;
  d["side_bytes"] = f.side_bytes;
  d["bits_per_value"] = f.bits_per_value;
  d["sections_unlike_profile"] = f.sections_unlike_profile;
  d["predicted_kl"] = f.predicted_kl < 0 ? py::object(py::none()) : py::object(py::float_(f.predicted_kl));
  return d;
}

py::dict EncodeStatsDict(const EncodeStats& s) {
  py::dict d;
  d["input_values"] = s.input_values;
  d["container_bytes"] = s.container_bytes;
  d["level_bits_per_value"] = s.level_bits_per_value;
  d["level_predicted_kl"] = s.level_predicted_kl;
  py::list frames;
  for (const FrameStats& f : s.frames) frames.append(FrameStatsDict(f));
  d["frames"] = frames;
  return d;
}

py::dict ShapeDict(const KVShape& s) {
  py::dict d;
  d["layers"] = s.layers;
  d["kv_heads"] = s.kv_heads;
  d["head_dim"] = s.head_dim;
  d["tokens"] = s.tokens;
  return d;
}

py::dict ContainerInfoDict(const ContainerInfo& info) {
  py::dict d;
  d["format_version"] = info.format_version;
  d["codec"] = info.codec;
  d["dtype"] = DTypeName(info.dtype);
  d["shape"] = ShapeDict(info.shape);
  d["token_start"] = info.token_start;
  d["levels"] = info.levels;
  d["chunk_tokens"] = info.chunk_tokens;
  d["bytes"] = info.bytes;
  py::list chunks;
  for (const ChunkEntry& c : info.chunks) {
    py::dict e;
    e["token_start"] = c.token_start;
    e["tokens"] = c.tokens;
    e["frame_bytes"] = c.frame_size;
    chunks.append(e);
  }
  d["chunks"] = chunks;
  return d;
}

py::dict FrameInfoDict(const FrameInfo& f) {
  py::dict d;
  d["codec"] = f.codec;
  d["format_version"] = f.format_version;
  d["dtype"] = DTypeName(f.dtype);
  d["shape"] = ShapeDict(f.shape);
  d["level"] = f.level;
  d["token_start"] = f.token_start;
  d["context_tokens"] = f.context_tokens;
  d["chunk_key"] = f.chunk_key ? py::object(py::str(f.chunk_key->Hex())) : py::object(py::none());
  d["bytes"] = f.bytes;
  d["header_bytes"] = f.header_bytes;
  d["side_bytes"] = f.side_bytes;
  return d;
}

// A decode target: `out` (written in place, any strides) or a new array;
// `result` is what the decode returns.
struct Target {
  py::object result;
  KVBuffer buffer;
};
Target DecodeTarget(const py::object& out, const KVShape& shape, const std::string& dtype, uint64_t input_bytes) {
  // bfloat16 arrays are 16-bit integers: dtype "bf16" says so.
  const std::string hint = dtype == "bf16" ? "bf16" : "";
  if (!out.is_none()) {
    Target t{out, ViewOfBuffer(out.cast<py::buffer>(), hint, /*writable=*/true)};
    if (!(t.buffer.view.shape() == shape))
      throw py::value_error("out has shape " + t.buffer.view.shape().ToString() + ", the data " + shape.ToString());
    return t;
  }
  const DType dt = Unwrap(ParseDType(dtype));
  // Hostile input: a header claiming far more KV than its bytes can code is
  // refused before anything is allocated (docs/FORMAT.md, "Decode bound").
  if (shape.values() * DTypeSize(dt) > DecodeOutputLimit(input_bytes))
    throw py::value_error("the data claims " + shape.ToString() + ", more than " + std::to_string(input_bytes) +
                          " bytes can decode to");
  py::array array = NewKVArray(shape, dt);
  KVBuffer buffer = ViewOfBuffer(array, hint, /*writable=*/true);
  return Target{std::move(array), std::move(buffer)};
}

// Python's Decoder: keeps the container bytes and the profiles alive.
struct PyDecoder {
  py::bytes data;
  std::shared_ptr<ProfileSet> profiles;
  std::optional<Decoder> decoder;
};

PyDecoder OpenDecoder(py::bytes data, std::shared_ptr<ProfileSet> profiles) {
  PyDecoder d{std::move(data), std::move(profiles), std::nullopt};
  d.decoder = Unwrap(Decoder::Open(BytesSpan(d.data), d.profiles.get()));
  return d;
}

py::object DecodeWith(const PyDecoder& d, uint32_t level, const std::string& dtype, uint32_t threads,
                      const py::object& out) {
  Target t = DecodeTarget(out, d.decoder->info().shape, dtype, BytesSpan(d.data).size());
  Status st;
  {
    py::gil_scoped_release release;
    st = d.decoder->Decode(t.buffer.view, level, threads);
  }
  Check(st);
  return t.result;
}

}  // namespace

void BindCodec(py::module_& m) {
  BindConfig(m);
  m.def("codec_names", &CodecNames, "Codec names CodecConfig.codec accepts");
  m.attr("DEFAULT_BITS_PER_VALUE") = kDefaultBitsPerValue;

  py::class_<Encoder>(m, "Encoder", "KV arrays to .cgkv containers or chunk frames (thread-safe)")
      .def(py::init([](const CodecConfig& c) { return Unwrap(Encoder::Create(c)); }), py::arg("config"))
      .def(py::init([](const py::kwargs& options) { return Unwrap(Encoder::Create(ConfigFromKwargs(options))); }))
      .def_property_readonly("config", &Encoder::config)
      .def(
          "encode",
          [](const Encoder& e, const py::buffer& kv, uint32_t token_start, const std::string& dtype,
             bool with_stats) -> py::object {
            KVBuffer in = ViewOfBuffer(kv, dtype, /*writable=*/false);
            EncodeStats stats;
            Result<std::vector<uint8_t>> out = Status::Internal("not run");
            {
              py::gil_scoped_release release;
              out = e.Encode(in.view, &stats, token_start);
            }
            py::bytes bytes = ToBytes(Unwrap(std::move(out)));
            if (!with_stats) return bytes;
            return py::make_tuple(bytes, EncodeStatsDict(stats));
          },
          py::arg("kv"), py::arg("token_start") = 0, py::arg("dtype") = "", py::arg("with_stats") = false,
          "A .cgkv container (bytes); with_stats: (bytes, stats dict)")
      .def(
          "encode_chunk",
          [](const Encoder& e, const py::buffer& kv, uint32_t token_start, uint32_t context_tokens,
             const std::string& dtype) {
            KVBuffer in = ViewOfBuffer(kv, dtype, /*writable=*/false);
            Result<std::vector<std::vector<uint8_t>>> frames = Status::Internal("not run");
            {
              py::gil_scoped_release release;
              frames = e.EncodeChunk(in.view, token_start, context_tokens);
            }
            py::list out;
            for (const auto& f : Unwrap(std::move(frames))) out.append(ToBytes(f));
            return out;
          },
          py::arg("kv"), py::arg("token_start") = 0, py::arg("context_tokens") = 0, py::arg("dtype") = "",
          "One chunk's frames, one per level (bytes each)");

  py::class_<PyDecoder>(m, "Decoder", "A .cgkv container, validated; decodes any level")
      .def(py::init(&OpenDecoder), py::arg("data"), py::arg("profiles") = nullptr)
      .def_property_readonly("info", [](const PyDecoder& d) { return ContainerInfoDict(d.decoder->info()); })
      .def("decode", &DecodeWith, py::arg("level") = 0, py::arg("dtype") = "f16", py::arg("threads") = 0,
           py::arg("out") = py::none(),
           "A new [L, 2, T, H, D] array (bf16: uint16 storage), or the values written into `out`")
      .def(
          "frame",
          [](const PyDecoder& d, uint32_t chunk, uint32_t level) {
            return ToBytes(Unwrap(d.decoder->Frame(chunk, level)));
          },
          py::arg("chunk"), py::arg("level") = 0);

  m.def("inspect", [](py::bytes data) { return ContainerInfoDict(OpenDecoder(std::move(data), nullptr).decoder->info()); },
        py::arg("data"), "A container's header and chunk index (dict), validated");
  m.def("inspect_frame", [](py::bytes f) { return FrameInfoDict(Unwrap(InspectFrame(BytesSpan(f)))); }, py::arg("frame"));
  m.def("verify_frame", [](py::bytes f) { return FrameInfoDict(Unwrap(VerifyFrame(BytesSpan(f)))); }, py::arg("frame"),
        "inspect_frame, and every section's checksum (CorruptError names the first damaged one)");
  m.def(
      "decode_frame",
      [](py::bytes frame, const std::string& dtype, std::shared_ptr<ProfileSet> profiles, uint32_t threads,
         const py::object& out) {
        const FrameInfo info = Unwrap(InspectFrame(BytesSpan(frame)));
        Target t = DecodeTarget(out, info.shape, dtype, BytesSpan(frame).size());
        Status st;
        {
          py::gil_scoped_release release;
          st = DecodeFrame(BytesSpan(frame), t.buffer.view, threads, profiles.get());
        }
        Check(st);
        return t.result;
      },
      py::arg("frame"), py::arg("dtype") = "f16", py::arg("profiles") = nullptr, py::arg("threads") = 1,
      py::arg("out") = py::none());
  m.def(
      "bind_frame",
      [](py::bytes frame, const ChunkKey& key) { return ToBytes(Unwrap(BindFrameToChunk(BytesSpan(frame), key))); },
      py::arg("frame"), py::arg("key"), "The frame bound to the chunk key it is stored under");
}

}  // namespace cachegen::python
