#include "cachegen/store.h"
#include "store/backends.h"

namespace cachegen {

namespace store {
std::string Address(const ChunkKey& key, uint32_t level) { return key.Hex() + "/" + std::to_string(level); }
}  // namespace store

Result<std::unique_ptr<ChunkStore>> OpenStore(const std::string& uri, const OpenStoreOptions& options) {
  CG_ASSIGN_OR_RETURN(store::StoreUri u, store::ParseStoreUri(uri));
  if (u.scheme == "file") return store::OpenFileStore(std::move(u), options.create);
  if (u.scheme == "mem") return store::OpenMemStore(std::move(u));
  if (u.scheme == "redis") return store::OpenRedisStore(std::move(u));
  if (u.scheme == "redis-cluster") return store::OpenRedisClusterStore(std::move(u));
  return Status::InvalidArgument("store URI '" + u.Redacted() + "': unknown scheme '" + u.scheme +
                                 "' (want file, mem, redis or redis-cluster)");
}

}  // namespace cachegen
