// Chunk stores by URI, chunk keys, put and prefix lookup.
#include <pybind11/stl.h>

#include "bindings.h"
#include "cachegen/codec.h"
#include "cachegen/profile.h"
#include "cachegen/service.h"
#include "cachegen/store.h"
#include "cachegen/stream.h"

namespace cachegen::python {
namespace {

std::shared_ptr<ChunkStore> Open(const std::string& uri, bool create, const std::string& token) {
  Result<std::unique_ptr<ChunkStore>> s = Status::Internal("not run");
  {
    py::gil_scoped_release release;
    if (uri.starts_with("http://")) {
      ClientOptions options;
      options.token = token;
      s = ConnectService(uri, options);
    } else {
      s = OpenStore(uri, {.create = create});
    }
  }
  return std::shared_ptr<ChunkStore>(Unwrap(std::move(s)));
}

py::dict PutStatsDict(const PutStats& s) {
  py::dict d;
  d["chunks"] = s.chunks;
  d["chunks_stored"] = s.chunks_stored;
  d["chunks_skipped"] = s.chunks_skipped;
  d["frames"] = s.frames;
  d["bytes"] = s.bytes;
  d["sections_unlike_profile"] = s.sections_unlike_profile;
  return d;
}

py::dict StatsDict(const StoreStats& s) {
  py::dict d;
  d["puts"] = s.puts;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["corrupt"] = s.corrupt;
  d["evictions"] = s.evictions;
  d["bytes_written"] = s.bytes_written;
  d["bytes_read"] = s.bytes_read;
  return d;
}

void BindChunkKey(py::module_& m) {
  py::class_<ChunkKey>(m, "ChunkKey", "A chunk's 128-bit address (32 hex digits across processes)")
      .def(py::init([](const std::string& hex) { return Unwrap(ChunkKey::FromHex(hex)); }), py::arg("hex"))
      .def_property_readonly("hex", &ChunkKey::Hex)
      .def_property_readonly("bytes", [](const ChunkKey& k) { return ToBytes(k.bytes); })
      .def("__str__", &ChunkKey::Hex)
      .def("__repr__", [](const ChunkKey& k) { return "ChunkKey('" + k.Hex() + "')"; })
      .def("__eq__", [](const ChunkKey& a, const ChunkKey& b) { return a == b; })
      .def("__hash__", [](const ChunkKey& k) { return py::hash(ToBytes(k.bytes)); });

  m.def("chain_root", &ChainRoot, py::arg("model_fingerprint"), py::arg("codec_profile"),
        py::arg("chunk_tokens") = kDefaultChunkTokens,
        "The root of a chunk key chain: what makes KV of one model and codec setting shareable");
  m.def("with_model_profile", &WithModelProfile, py::arg("codec_profile"), py::arg("profile_id"),
        "A codec setting string that also names a model profile (its id is part of the keys)");
  m.def(
      "chunk_keys",
      [](const ChunkKey& root, const std::vector<TokenId>& tokens, uint32_t chunk_tokens) {
        return ChunkKeys(root, tokens, chunk_tokens);
      },
      py::arg("root"), py::arg("tokens"), py::arg("chunk_tokens") = kDefaultChunkTokens,
      "The key of every chunk of `tokens`, the last holding the remainder (each key depends on all tokens before it)");
  m.def(
      "next_chunk_key",
      [](const ChunkKey& previous, const std::vector<TokenId>& tokens) { return NextChunkKey(previous, tokens); },
      py::arg("previous"), py::arg("tokens"));
}

}  // namespace

void BindStore(py::module_& m) {
  BindChunkKey(m);
  m.attr("MAX_CHUNK_LEVELS") = kMaxChunkLevels;

  py::class_<ChunkStore, std::shared_ptr<ChunkStore>>(
      m, "Store", "A chunk store (file://, mem://, redis://, redis-cluster://, or a chunk service http://); thread-safe")
      .def(py::init(&Open), py::arg("uri"), py::arg("create") = true, py::arg("token") = "",
           "create: make a file:// store's folder where missing (False: a missing one is NotFoundError); "
           "token: bearer token of a chunk service")
      .def(
          "put",
          [](ChunkStore& s, const ChunkKey& key, uint32_t level, py::bytes frame) {
            std::span<const uint8_t> f = BytesSpan(frame);
            Status st;
            {
              py::gil_scoped_release release;
              st = s.Put(key, level, f);
            }
            Check(st);
          },
          py::arg("key"), py::arg("level"), py::arg("frame"))
      .def(
          "get",
          [](ChunkStore& s, const ChunkKey& key, uint32_t level) {
            Result<std::vector<uint8_t>> r = Status::Internal("not run");
            {
              py::gil_scoped_release release;
              r = s.Get(key, level);
            }
            return ToBytes(Unwrap(std::move(r)));
          },
          py::arg("key"), py::arg("level"), "The stored frame, verified (NotFoundError when absent or corrupt)")
      .def(
          "size",
          [](ChunkStore& s, const ChunkKey& key, uint32_t level) {
            Result<uint64_t> r = Status::Internal("not run");
            {
              py::gil_scoped_release release;
              r = s.Size(key, level);
            }
            return Unwrap(std::move(r));
          },
          py::arg("key"), py::arg("level"), "The stored frame's size without reading it")
      .def(
          "delete",
          [](ChunkStore& s, const ChunkKey& key, uint32_t level) {
            Status st;
            {
              py::gil_scoped_release release;
              st = s.Delete(key, level);
            }
            Check(st);
          },
          py::arg("key"), py::arg("level"))
      .def_property_readonly("stats", [](const ChunkStore& s) { return StatsDict(s.stats()); })
      .def_property_readonly("uri", &ChunkStore::uri);
  m.def(
      "put_context",
      [](ChunkStore& store, const ChunkKey& root, const std::vector<TokenId>& tokens, const py::buffer& kv,
         const Encoder& encoder, const std::string& dtype) {
        KVBuffer in = ViewOfBuffer(kv, dtype, /*writable=*/false);
        Result<PutStats> r = Status::Internal("not run");
        {
          py::gil_scoped_release release;
          r = PutContext(store, root, tokens, in.view, encoder);
        }
        return PutStatsDict(Unwrap(std::move(r)));
      },
      py::arg("store"), py::arg("root"), py::arg("tokens"), py::arg("kv"), py::arg("encoder"), py::arg("dtype") = "",
      "Encodes the whole chunks of a context (kv holds one token per entry of `tokens`) and stores every level; "
      "chunks already stored at every level are skipped");
  m.def(
      "put_container",
      [](ChunkStore& store, const ChunkKey& root, const std::vector<TokenId>& tokens, py::bytes container,
         std::shared_ptr<ProfileSet> profiles) {
        Result<PutStats> r = Status::Internal("not run");
        std::span<const uint8_t> c = BytesSpan(container);
        {
          py::gil_scoped_release release;
          r = PutContainer(store, root, tokens, c, profiles.get());
        }
        return PutStatsDict(Unwrap(std::move(r)));
      },
      py::arg("store"), py::arg("root"), py::arg("tokens"), py::arg("container"), py::arg("profiles") = nullptr);
  m.def(
      "lookup_prefix",
      [](ChunkStore& store, const std::vector<ChunkKey>& keys, uint32_t levels) {
        std::vector<CachedChunk> found;
        Status error;
        {
          py::gil_scoped_release release;
          found = LookupPrefix(store, keys, levels, &error);
        }
        Check(error);
        py::list out;
        for (const CachedChunk& c : found) out.append(py::make_tuple(c.key, c.level_bytes));
        return out;
      },
      py::arg("store"), py::arg("keys"), py::arg("levels") = kMaxChunkLevels,
      "The longest cached prefix of `keys`: (key, bytes per level, 0 = absent) per chunk");
}

}  // namespace cachegen::python
