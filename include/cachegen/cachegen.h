/* cachegen C API: encode a contiguous KV cache into a container and back.
 *
 * Plain C (C99), for FFI users (Python ctypes, Rust, Go). Tensors are
 * contiguous [layer][K|V][token][head][dim] in the given dtype: layers x 2 x
 * tokens x kv_heads x head_dim elements, no alignment needed. cg_encode,
 * cg_inspect and cg_decode return a cg_status (0 = CG_OK); on failure a
 * one-line message is written to `err` (NUL-terminated, truncated to err_len;
 * err may be NULL). Every function is thread-safe. No exception or abort
 * crosses this boundary: running out of memory is CG_INTERNAL ("out of
 * memory").
 *
 * A model profile (.cgprof) is loaded into a cg_profile object
 * (cg_profile_load) and passed explicitly: to cg_encode in cfg->profile, and
 * to cg_decode_using_profile for containers whose frames reference it (as
 * zstd passes a dictionary). Nothing is registered process-wide: cg_decode
 * of such a container answers CG_NOT_FOUND ("frame needs model profile ...").
 */
#ifndef CACHEGEN_CACHEGEN_H_
#define CACHEGEN_CACHEGEN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as cachegen::StatusCode. */
enum cg_status {
  CG_OK = 0,
  CG_INVALID_ARGUMENT = 1,
  CG_CORRUPT = 2,
  CG_UNSUPPORTED = 3,
  CG_NOT_FOUND = 4,
  CG_IO_ERROR = 5,
  CG_INTERNAL = 6,
  CG_UNAVAILABLE = 7  /* not returned by the codec functions; kept in step with the C++ StatusCode */
};

/* Same values as cachegen::DType. */
enum cg_dtype { CG_F32 = 0, CG_F16 = 1, CG_BF16 = 2 };

/* A loaded, validated model profile; immutable, usable from any thread. */
typedef struct cg_profile cg_profile;

typedef struct cg_config {
  const char* codec;      /* NULL = "cachegen" */
  double bits_per_value;  /* at most one of these three > 0; all 0 = 2 bits/value */
  double snr_db;
  double max_rel_error;
  uint32_t levels;        /* 1..8; 0 = 1; codecs other than "cachegen" code one level */
  uint32_t chunk_tokens;  /* 0 = the whole context as one chunk */
  uint32_t threads;       /* 0 = hardware concurrency; at most 256 are used */
  uint32_t token_start;   /* absolute position of the first token */
  /* A model profile (NULL = none; not owned, must stay loaded during the
   * call): frames reference it instead of carrying statistics and tables;
   * its quantizer is used. */
  const cg_profile* profile;
  /* Rate target: the predicted mean next-token KL of the restored context,
   * from the profile's measured sensitivities (needs profile; exclusive
   * with the three targets above; levels below the first: sqrt(10) times
   * the previous level's KL). */
  double max_kl;
} cg_config;

typedef struct cg_info {
  char codec[32];
  int dtype; /* cg_dtype of the encoded source */
  uint32_t layers, kv_heads, head_dim, tokens;
  uint32_t token_start;
  uint32_t levels;
  uint32_t chunk_tokens; /* tokens per chunk (the last may be shorter); tokens when one chunk */
  uint32_t chunks;
  uint64_t bytes;
} cg_info;

/* The library's version, "MAJOR.MINOR.PATCH" (static storage). */
const char* cg_version(void);

/* The library defaults: codec "cachegen" (cfg->codec NULL), no rate target
 * set (bits_per_value 0 = the codec's default, 2 bits/value), 1 level, chunks
 * of 256 tokens. */
void cg_config_default(cg_config* cfg);

/* Encodes `data` (dtype; layers x 2 x tokens x kv_heads x head_dim elements,
 * which must all be readable) into a new buffer *out of *out_len bytes,
 * allocated with malloc, which the caller releases with cg_free. cfg may be
 * NULL for the defaults. On failure *out is NULL and *out_len 0 (when those
 * pointers are not NULL). */
int cg_encode(const void* data, int dtype, uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
              uint32_t tokens, const cg_config* cfg, uint8_t** out, size_t* out_len, char* err,
              size_t err_len);

/* Reads a container's header and index; on failure *info is left as it was. */
int cg_inspect(const uint8_t* container, size_t len, cg_info* info, char* err, size_t err_len);

/* Decodes the container at quality `level` into out, a contiguous tensor of
 * the container's shape in `dtype`; out_len must be exactly its byte size.
 * threads: 0 = hardware concurrency. On failure out may be partly written. */
int cg_decode(const uint8_t* container, size_t len, uint32_t level, int dtype, void* out, size_t out_len,
              uint32_t threads, char* err, size_t err_len);

/* cg_decode for containers coded with a model profile: `profile` must be
 * the one their frames reference (else CG_NOT_FOUND); NULL = cg_decode. */
int cg_decode_using_profile(const uint8_t* container, size_t len, const cg_profile* profile, uint32_t level,
                            int dtype, void* out, size_t out_len, uint32_t threads, char* err, size_t err_len);

/* Parses a .cgprof (untrusted bytes: every field is checked; they are
 * copied) into a new profile *out, released with cg_profile_free. On failure
 * *out is NULL. */
int cg_profile_load(const uint8_t* bytes, size_t len, cg_profile** out, char* err, size_t err_len);
/* The profile's 64-bit id (what its frames reference; `cachegen profile
 * inspect` prints it). */
uint64_t cg_profile_id(const cg_profile* profile);
/* Releases a profile. NULL is ignored. */
void cg_profile_free(cg_profile* profile);

/* Releases a buffer returned by cg_encode. NULL is ignored. */
void cg_free(void* p);

#ifdef __cplusplus
}
#endif

#endif /* CACHEGEN_CACHEGEN_H_ */
