"""cachegen: compress transformer KV caches, store them by chunk and stream them back.

KV arrays are [layers, 2, tokens, kv_heads, head_dim] (K then V), float32,
float16 or bfloat16, any strides: numpy arrays and CPU torch tensors are read
and written in place, without copies. numpy has no bfloat16: such arrays are
uint16/int16 with dtype="bf16" (torch bfloat16 tensors are handled here).

    import cachegen
    data = cachegen.encode(kv, bits=2.0)      # bytes of a .cgkv container
    restored = cachegen.decode(data)           # numpy float16 array

Beneath these: Encoder/Decoder (every codec option, CodecConfig), Profile and
ProfileSet (model profiles), Store (chunk stores by URI), chain_root/chunk_keys,
put_context and StreamClient (deadline-aware fetch). Errors raise cachegen.Error
(NotFoundError, CorruptError), ValueError for unusable arguments and OSError for
unreachable stores. The GIL is released while encoding, decoding and fetching.
"""

from ._cachegen import (  # noqa: F401  (the public names of the package)
    DEFAULT_BITS_PER_VALUE,
    MAX_CHUNK_LEVELS,
    ChunkKey,
    CodecConfig,
    CorruptError,
    Decoder,
    Encoder,
    Error,
    NotFoundError,
    Profile,
    ProfileSet,
    Store,
    StreamClient,
    StreamedChunk,
    __version__,
    bind_frame,
    chain_root,
    chunk_keys,
    codec_names,
    inspect,
    inspect_frame,
    lookup_prefix,
    next_chunk_key,
    put_container,
    with_model_profile,
    verify_frame,
)
from . import _cachegen

__all__ = [
    "DEFAULT_BITS_PER_VALUE", "MAX_CHUNK_LEVELS", "ChunkKey", "CodecConfig", "CorruptError", "Decoder", "Encoder",
    "Error", "NotFoundError", "Profile", "ProfileSet", "Store", "StreamClient", "StreamedChunk", "bind_frame",
    "chain_root", "chunk_keys", "codec_names", "decode", "decode_frame", "encode", "inspect", "inspect_frame",
    "load_profile", "lookup_prefix", "next_chunk_key", "put_container", "put_context", "to_torch",
    "with_model_profile", "verify_frame",
]


def _kv_buffer(kv, dtype=""):
    """(buffer, dtype name) for a KV array: numpy arrays and buffers as they
    are, torch CPU tensors as zero-copy numpy views (bfloat16 as int16)."""
    module = type(kv).__module__ or ""
    if module.startswith("torch"):
        import torch

        if kv.device.type != "cpu":
            raise ValueError("cachegen reads CPU memory: move the tensor with .cpu() first")
        kv = kv.detach()
        if kv.dtype == torch.bfloat16:
            if dtype not in ("", "bf16"):
                raise ValueError(f"the tensor holds bf16, not {dtype}")
            return kv.view(torch.int16).numpy(), "bf16"
        return kv.numpy(), dtype
    if not isinstance(kv, memoryview) and not hasattr(kv, "__buffer__") and hasattr(kv, "__array__"):
        import numpy

        kv = numpy.asarray(kv)
    return kv, dtype


def encode(kv, bits=None, *, dtype="", token_start=0, **options):
    """Encodes a KV array into a .cgkv container (bytes).

    bits: average bits per value (default 2.0 when no other target is given:
    max_kl, snr_db or max_rel_error). Every CodecConfig field is a keyword
    option: codec, levels, level_bits, chunk_tokens, rope, rope_dims,
    rope_theta, rope_scale, profile, quantizer, group_tokens, key_step_scale,
    recent_tokens, threads, ... dtype: "bf16" for a uint16/int16 array that
    holds bfloat16."""
    if bits is not None:
        options["bits_per_value"] = bits
    if "profile" in options and "quantizer" not in options and options["profile"] is not None:
        # As the CLI: a profile's tables were learned for one quantizer.
        q = options["profile"].quantizer
        if q is not None:
            options["quantizer"] = q
    buffer, dtype = _kv_buffer(kv, dtype)
    return Encoder(**options).encode(buffer, token_start=token_start, dtype=dtype)


def _out_buffer(out, dtype):
    """(buffer, dtype) of a decode target: `out` in place, else a new array of dtype."""
    if out is None:
        return None, dtype
    buffer, hint = _kv_buffer(out)
    return buffer, hint or ("bf16" if dtype == "bf16" else "")


def decode(data, level=0, *, dtype="f16", profiles=None, threads=0, out=None):
    """Decodes a .cgkv container at `level` into a new numpy array of `dtype`
    ("f16", "f32" or "bf16" as uint16), or in place into `out` (a numpy array
    or CPU torch tensor of the container's shape, any strides: a slice of an
    engine's cache). profiles: a ProfileSet holding the model profiles its
    frames reference."""
    decoder = Decoder(bytes(data), profiles)
    buffer, dtype = _out_buffer(out, dtype)
    result = decoder.decode(level=level, dtype=dtype, threads=threads, out=buffer)
    return out if out is not None else result


def decode_frame(frame, *, dtype="f16", profiles=None, threads=1, out=None):
    """Decodes one chunk frame (what a store keeps) into a new array or `out`."""
    buffer, dtype = _out_buffer(out, dtype)
    result = _cachegen.decode_frame(bytes(frame), dtype=dtype, profiles=profiles, threads=threads, out=buffer)
    return out if out is not None else result


def put_context(store, root, tokens, kv, encoder, *, dtype=""):
    """Encodes and stores the whole chunks of a context: kv holds one token
    per entry of `tokens`. Returns the put statistics (dict)."""
    buffer, dtype = _kv_buffer(kv, dtype)
    return _cachegen.put_context(store, root, list(tokens), buffer, encoder, dtype=dtype)


def load_profile(path):
    """Reads and validates a .cgprof file."""
    with open(path, "rb") as f:
        return Profile.from_bytes(f.read())


def to_torch(array, dtype=None):
    """A torch tensor sharing `array`'s memory; dtype="bf16" reads uint16
    storage as torch.bfloat16. Needs torch (not a dependency otherwise)."""
    import numpy
    import torch

    if dtype == "bf16":
        return torch.from_numpy(numpy.asarray(array).view(numpy.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
