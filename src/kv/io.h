// Reading and writing KV tensors from files (docs/INPUT-FORMATS.md).
//
// The format is chosen by the path's extension:
//   .npy          one array [L, 2, T, H, D], dtype <f4 or <f2, C order
//   .safetensors  tensors "layers.{i}.k" and "layers.{i}.v", each [T, H, D],
//                 dtype F32, F16 or BF16 (all tensors the same dtype)
//   .kvraw        cachegen's raw dump: a 32-byte header + contiguous data
//
// Every file is treated as hostile: sizes are validated against the file's
// length before anything is allocated, and non-finite values are rejected
// with their position.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen {

enum class KVFileFormat { kNpy, kSafetensors, kKvRaw };

// The format for a path's extension, or InvalidArgument naming the supported ones.
Result<KVFileFormat> KVFileFormatFromPath(const std::string& path);

// Reads a KV tensor; the tensor keeps the file's dtype.
Result<KVTensor> ReadKV(const std::string& path);
// Writes a KV tensor in the format of the path's extension. .npy cannot hold
// bf16 (numpy has no such dtype): such tensors are written as f32.
Status WriteKV(const std::string& path, const KVTensor& tensor);

// Safetensors with string metadata beside "format": "cachegen-kv" in its
// __metadata__ (what `cachegen capture` records: model, positions, RoPE).
using KVMetadata = std::map<std::string, std::string>;
Status WriteSafetensors(const std::string& path, const KVTensor& tensor, const KVMetadata& metadata);
// The __metadata__ string entries of a .safetensors file (its header only is
// read); an empty map when it has none.
Result<KVMetadata> ReadSafetensorsMetadata(const std::string& path);

// In-memory forms of the above, used by ReadKV/WriteKV and the fuzz tests.
Result<KVTensor> ParseKV(std::span<const uint8_t> bytes, KVFileFormat format);
Result<std::vector<uint8_t>> SerializeKV(const KVTensor& tensor, KVFileFormat format);

// Whole-file helpers.
// A file larger than max_bytes is refused (kInvalidArgument) before it is
// read: for inputs that are parsed whole.
Result<std::vector<uint8_t>> ReadFileBytes(const std::string& path, uint64_t max_bytes = UINT64_MAX);
Status WriteFileBytes(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace cachegen
