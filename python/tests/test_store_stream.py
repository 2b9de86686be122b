"""Stores by URI, chunk keys, put and the streaming client."""

import numpy as np
import pytest

import cachegen
from conftest import make_kv


def test_mem_store_put_get_delete():
    store = cachegen.Store("mem://")
    key = cachegen.ChunkKey("00112233445566778899aabbccddeeff")
    frame = cachegen.Encoder(chunk_tokens=0).encode_chunk(make_kv(tokens=64))[0]
    frame = cachegen.bind_frame(frame, key)
    store.put(key, 0, frame)
    assert store.get(key, 0) == frame
    assert store.size(key, 0) == len(frame)
    assert store.stats["puts"] == 1 and store.stats["hits"] == 1
    store.delete(key, 0)
    with pytest.raises(cachegen.NotFoundError):
        store.get(key, 0)


def test_file_store_and_missing_folder(tmp_path):
    store = cachegen.Store(f"file://{tmp_path}/s")
    assert store.uri.startswith("file://")
    with pytest.raises(cachegen.NotFoundError):
        cachegen.Store(f"file://{tmp_path}/absent", create=False)
    assert not (tmp_path / "absent").exists()
    with pytest.raises(ValueError, match="scheme"):
        cachegen.Store("ftp://x")


def test_chunk_keys():
    root = cachegen.chain_root("model-a", "cachegen-2bit", 64)
    tokens = list(range(200))
    keys = cachegen.chunk_keys(root, tokens, 64)
    assert len(keys) == 4  # the last chunk holds the remainder
    assert keys[0] == cachegen.next_chunk_key(root, tokens[:64])
    assert keys[1] == cachegen.next_chunk_key(keys[0], tokens[64:128])
    assert keys[3] == cachegen.next_chunk_key(keys[2], tokens[192:])
    assert len({k.hex for k in keys}) == 4 and len(keys[0].hex) == 32
    assert cachegen.ChunkKey(keys[0].hex) == keys[0]
    assert hash(cachegen.ChunkKey(keys[0].hex)) == hash(keys[0])
    other = cachegen.chunk_keys(cachegen.chain_root("model-b", "cachegen-2bit", 64), tokens, 64)
    assert other[0] != keys[0]
    with pytest.raises(ValueError):
        cachegen.ChunkKey("xyz")


def put_context(store, tokens=256, chunk=64, levels=2):
    kv = make_kv(tokens=tokens)
    root = cachegen.chain_root("model", "test", chunk)
    ids = list(range(1000, 1000 + tokens))
    encoder = cachegen.Encoder(levels=levels, chunk_tokens=chunk, bits_per_value=3.0)
    stats = cachegen.put_context(store, root, ids, kv, encoder)
    return kv, root, ids, stats


def test_put_lookup_fetch_round_trip():
    store = cachegen.Store("mem://")
    kv, root, ids, stats = put_context(store)
    assert stats["chunks"] == 4 and stats["chunks_stored"] == 4 and stats["frames"] == 8
    again = cachegen.put_context(store, root, ids, kv, cachegen.Encoder(levels=2, chunk_tokens=64))
    assert again["chunks_skipped"] == 4
    keys = cachegen.chunk_keys(root, ids, 64)
    found = cachegen.lookup_prefix(store, keys, levels=2)
    assert [k for k, _ in found] == keys and all(b[0] > b[1] > 0 for _, b in found)

    assembled = np.zeros((2, 2, 256, 2, 64), np.float16)
    seen = []

    def on_chunk(chunk):
        seen.append((chunk.index, chunk.level))
        assembled[:, :, chunk.token_start:chunk.token_start + chunk.kv.shape[2]] = chunk.kv

    client = cachegen.StreamClient(store)
    result = client.fetch_tokens(root, ids, 64, on_chunk, deadline_ms=60000, fixed_level=0)
    assert result["cached"] == 4 and result["recompute"] == [] and result["deadline_met"]
    assert seen == [(i, 0) for i in range(4)]
    expected = np.concatenate(
        [cachegen.decode_frame(store.get(k, 0)) for k in keys], axis=2)
    assert np.array_equal(assembled, expected)

    result = client.fetch(keys, [64] * 4, None, deadline_ms=60000, fixed_level=1, dtype="f32")
    assert result["levels"] == [1, 1, 1, 1]


def test_fetch_reports_missing_chunks_for_recompute():
    store = cachegen.Store("mem://")
    kv, root, ids, _ = put_context(store, levels=1)
    keys = cachegen.chunk_keys(root, ids, 64)
    store.delete(keys[2], 0)
    result = cachegen.StreamClient(store).fetch(keys, [64] * 4, deadline_ms=60000)
    assert result["cached"] == 2  # the prefix ends at the first missing chunk
    unknown = cachegen.chunk_keys(cachegen.chain_root("other", "test", 64), ids, 64)
    assert cachegen.StreamClient(store).fetch(unknown, [64] * 4, deadline_ms=60000)["cached"] == 0


def test_callback_exception_stops_the_fetch():
    store = cachegen.Store("mem://")
    _, root, ids, _ = put_context(store, levels=1)

    def on_chunk(chunk):
        raise KeyError("engine full")

    with pytest.raises(KeyError, match="engine full"):
        cachegen.StreamClient(store).fetch_tokens(root, ids, 64, on_chunk, deadline_ms=60000)
    with pytest.raises(TypeError, match="unknown fetch option"):
        cachegen.StreamClient(store).fetch_tokens(root, ids, 64, deadline=5)
