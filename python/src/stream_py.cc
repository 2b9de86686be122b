// The streaming client: fetch a context's cached chunks under a deadline,
// each handed to a Python callback as it is decoded.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstring>

#include "bindings.h"
#include "cachegen/profile.h"
#include "cachegen/stream_client.h"

namespace cachegen::python {
namespace {

// What the callback receives: the chunk's facts and its KV (an array the
// callback may keep: a copy of the client's buffer, which it reuses).
struct PyChunk {
  uint32_t index = 0, level = 0, token_start = 0;
  uint64_t bytes = 0;
  py::array kv;
};

StreamOptions OptionsFromKwargs(const py::kwargs& kw, std::shared_ptr<ProfileSet>* profiles) {
  StreamOptions o;
  for (auto [key, value] : kw) {
    const std::string k = py::str(key);
    if (k == "deadline_ms") o.deadline_ms = value.cast<double>();
    else if (k == "recompute_tokens_per_s") o.recompute_tokens_per_s = value.cast<double>();
    else if (k == "inflight") o.inflight = value.cast<uint32_t>();
    else if (k == "read_ahead") o.read_ahead = value.cast<uint32_t>();
    else if (k == "queue_ms") o.queue_ms = value.cast<double>();
    else if (k == "fixed_level") o.fixed_level = value.cast<int>();
    else if (k == "initial_bandwidth_bytes_s") o.initial_bandwidth_bytes_s = value.cast<double>();
    else if (k == "levels") o.levels = value.cast<uint32_t>();
    else if (k == "decode_threads") o.decode_threads = value.cast<uint32_t>();
    else if (k == "dtype") o.dtype = Unwrap(ParseDType(value.cast<std::string>()));
    else if (k == "stop_at_deadline") o.stop_at_deadline = value.cast<bool>();
    else if (k == "profiles") *profiles = value.cast<std::shared_ptr<ProfileSet>>();
    else throw py::type_error("unknown fetch option '" + k + "'");
  }
  o.profiles = *profiles;
  return o;
}

py::dict ResultDict(const StreamResult& r) {
  py::dict d;
  d["requested"] = r.requested;
  d["cached"] = r.cached;
  d["levels"] = r.levels;
  d["recompute"] = r.recompute;
  d["errors"] = r.errors;
  d["lookup_error"] = r.lookup_status.ok() ? py::object(py::none()) : py::object(py::str(r.lookup_status.ToString()));
  d["bytes"] = r.bytes;
  d["elapsed_ms"] = r.elapsed_ms;
  d["lookup_ms"] = r.lookup_ms;
  d["decode_ms"] = r.decode_ms;
  d["deadline_met"] = r.deadline_met;
  d["timed_out"] = r.timed_out;
  d["bandwidth_bytes_s"] = r.bandwidth_bytes_s;
  d["reissued"] = r.reissued;
  d["rejected"] = r.rejected;
  return d;
}

// A Python client: the C++ client and the store it reads (kept alive).
struct PyStreamClient {
  std::shared_ptr<ChunkStore> store;
  std::unique_ptr<StreamClient> client;
};

// Runs a fetch without the GIL; the callback takes it back on the calling
// thread. A callback that raises cancels the fetch, and its exception is
// raised from fetch once the client has returned.
template <typename FetchFn>
py::dict RunFetch(const py::object& on_chunk, const py::kwargs& kw, FetchFn fetch) {
  std::shared_ptr<ProfileSet> profiles;
  StreamOptions options = OptionsFromKwargs(kw, &profiles);
  std::atomic<bool> cancel{false};
  options.cancel = &cancel;
  std::optional<py::error_already_set> raised;
  const ChunkCallback callback = [&](const StreamedChunk& c) {
    py::gil_scoped_acquire acquire;
    if (raised || on_chunk.is_none()) return;
    try {
      PyChunk chunk{c.index, c.level, c.token_start, c.bytes, NewKVArray(c.kv->shape(), c.kv->dtype())};
      std::memcpy(chunk.kv.mutable_data(), c.kv->data(), c.kv->size_bytes());
      on_chunk(chunk);
    } catch (py::error_already_set& e) {
      raised.emplace(std::move(e));
      cancel = true;
    }
  };
  Result<StreamResult> r = Status::Internal("not run");
  {
    py::gil_scoped_release release;
    r = fetch(options, callback);
  }
  if (raised) throw std::move(*raised);
  return ResultDict(Unwrap(std::move(r)));
}

}  // namespace

void BindStream(py::module_& m) {
  py::class_<PyChunk>(m, "StreamedChunk", "One chunk as fetch delivers it")
      .def_readonly("index", &PyChunk::index)
      .def_readonly("level", &PyChunk::level)
      .def_readonly("token_start", &PyChunk::token_start)
      .def_readonly("bytes", &PyChunk::bytes)
      .def_readonly("kv", &PyChunk::kv, "[L, 2, tokens, H, D] array of the chunk (bf16: uint16 storage)");

  py::class_<PyStreamClient>(
      m, "StreamClient",
      "Fetches a context's cached chunks under a deadline, choosing each chunk's level by the measured link; keep one "
      "client for a sequence of fetches (it reuses decode buffers)")
      .def(py::init([](std::shared_ptr<ChunkStore> store) {
             PyStreamClient c{store, std::make_unique<StreamClient>(store.get())};
             return c;
           }),
           py::arg("store"))
      .def(
          "fetch",
          [](const PyStreamClient& c, const std::vector<ChunkKey>& keys, const std::vector<uint32_t>& chunk_tokens,
             const py::object& on_chunk, const py::kwargs& kw) {
            return RunFetch(on_chunk, kw, [&](const StreamOptions& o, const ChunkCallback& cb) {
              return c.client->Fetch(keys, chunk_tokens, o, cb);
            });
          },
          py::arg("keys"), py::arg("chunk_tokens"), py::arg("on_chunk") = py::none(),
          "Streams chunks `keys` (chunk i holds chunk_tokens[i] tokens); on_chunk(StreamedChunk) in chunk order. "
          "Options: deadline_ms, recompute_tokens_per_s, inflight, read_ahead, queue_ms, fixed_level, "
          "initial_bandwidth_bytes_s, levels, decode_threads, dtype, stop_at_deadline, profiles. Returns a dict "
          "(levels delivered, recompute: chunk indices the engine must recompute, errors, deadline_met, ...)")
      .def(
          "fetch_tokens",
          [](const PyStreamClient& c, const ChunkKey& root, const std::vector<TokenId>& tokens, uint32_t chunk_size,
             const py::object& on_chunk, const py::kwargs& kw) {
            return RunFetch(on_chunk, kw, [&](const StreamOptions& o, const ChunkCallback& cb) {
              return c.client->FetchTokens(root, tokens, chunk_size, o, cb);
            });
          },
          py::arg("root"), py::arg("tokens"), py::arg("chunk_tokens") = kDefaultChunkTokens,
          py::arg("on_chunk") = py::none(), "fetch for the chunk keys of a token sequence (chunk_keys)");
}

}  // namespace cachegen::python
