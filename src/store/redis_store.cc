// redis:// and redis-cluster:// backends.
#include "store/backends.h"

namespace cachegen::store {

Result<std::unique_ptr<ChunkStore>> OpenRedisStore(StoreUri uri) {
  return Status::Unsupported("store URI '" + uri.Redacted() + "': the redis backend is not implemented yet");
}

Result<std::unique_ptr<ChunkStore>> OpenRedisClusterStore(StoreUri uri) {
  return Status::Unsupported("store URI '" + uri.Redacted() + "': the redis-cluster backend is not implemented yet");
}

}  // namespace cachegen::store
