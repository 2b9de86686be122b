"""encode/decode, Encoder/Decoder, inspection, dtypes, strides and errors."""

import numpy as np
import pytest

import cachegen
from conftest import make_kv


def snr_db(ref, got):
    ref = ref.astype(np.float64)
    err = got.astype(np.float64) - ref
    return 10 * np.log10(np.sum((ref - ref.mean(axis=2, keepdims=True)) ** 2) / np.sum(err**2))


def test_fp16_round_trip_is_exact(kv):
    half = kv.astype(np.float16)
    data = cachegen.encode(half, codec="fp16", chunk_tokens=64)
    assert isinstance(data, bytes)
    out = cachegen.decode(data)
    assert out.dtype == np.float16 and out.shape == half.shape
    assert np.array_equal(out, half)


def test_default_codec_is_smaller_and_close(kv):
    data = cachegen.encode(kv)
    assert len(data) < kv.size * 2 / 4  # 2 bits per value is 8x below f16, side information included
    out = cachegen.decode(data, dtype="f32")
    assert out.dtype == np.float32
    assert snr_db(kv, out) > 5


def test_more_bits_more_fidelity(kv):
    low = cachegen.decode(cachegen.encode(kv, bits=2.0), dtype="f32")
    high = cachegen.decode(cachegen.encode(kv, bits=5.0), dtype="f32")
    assert snr_db(kv, high) > snr_db(kv, low) + 6


def test_levels_and_inspect(kv):
    data = cachegen.encode(kv, levels=3, chunk_tokens=128)
    info = cachegen.inspect(data)
    assert info["levels"] == 3 and info["codec"] == "cachegen"
    assert info["shape"] == {"layers": 2, "kv_heads": 2, "head_dim": 64, "tokens": 256}
    assert len(info["chunks"]) == 2
    sizes = [sum(c["frame_bytes"][lv] for c in info["chunks"]) for lv in range(3)]
    assert sizes[0] > sizes[1] > sizes[2]
    for level in range(3):
        assert cachegen.decode(data, level).shape == kv.shape


def test_strided_input_reads_in_place(kv):
    # An engine's token-major layout [L, T, 2, H, D], viewed as [L, 2, T, H, D].
    engine = np.ascontiguousarray(kv.transpose(0, 2, 1, 3, 4))
    view = engine.transpose(0, 2, 1, 3, 4)
    assert not view.flags.c_contiguous
    assert cachegen.encode(view, bits=3.0) == cachegen.encode(kv, bits=3.0)


def test_decode_into_strided_out(kv):
    data = cachegen.encode(kv, bits=3.0)
    expected = cachegen.decode(data)
    engine = np.zeros((2, 300, 2, 2, 64), np.float16)  # room for more tokens than the context
    out = engine[:, 10:266].transpose(0, 2, 1, 3, 4)
    result = cachegen.decode(data, out=out)
    assert result is out
    assert np.array_equal(engine[:, 10:266].transpose(0, 2, 1, 3, 4), expected)
    assert not engine[:, :10].any() and not engine[:, 266:].any()


def test_bf16_as_uint16(kv):
    bits = (kv.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 by truncation
    data = cachegen.encode(bits, dtype="bf16", codec="fp16")
    assert cachegen.inspect(data)["dtype"] == "bf16"
    out = cachegen.decode(data, dtype="bf16")
    assert out.dtype == np.uint16
    as_f32 = (out.astype(np.uint32) << 16).view(np.float32)
    assert np.allclose(as_f32, kv, rtol=2e-2, atol=1e-2)
    with pytest.raises(ValueError, match="bfloat16"):
        cachegen.encode(bits)  # 16-bit integers without dtype="bf16"


def test_encoder_decoder_objects(kv):
    config = cachegen.CodecConfig(bits_per_value=3.0, levels=2, chunk_tokens=128, rope="neox", quantizer="lloyd")
    assert config.rope == "neox" and config.levels == 2
    encoder = cachegen.Encoder(config)
    data, stats = encoder.encode(kv, with_stats=True)
    assert stats["container_bytes"] == len(data)
    assert len(stats["frames"]) == 4 and len(stats["level_bits_per_value"]) == 2
    assert 2.5 < stats["level_bits_per_value"][0] < 3.5
    frames = encoder.encode_chunk(kv[:, :, :128], token_start=0, context_tokens=256)
    assert len(frames) == 2
    info = cachegen.verify_frame(frames[0])
    assert info["shape"]["tokens"] == 128 and info["level"] == 0
    decoder = cachegen.Decoder(data)
    assert decoder.info["levels"] == 2
    frame = decoder.frame(1, 0)
    assert cachegen.inspect_frame(frame)["token_start"] == 128
    assert cachegen.decode_frame(frame).shape == (2, 2, 128, 2, 64)


def test_profile_train_and_decode_with_it(tmp_path):
    contexts = [make_kv(tokens=256, seed=s) for s in range(3)]
    config = cachegen.CodecConfig(chunk_tokens=128)
    profile = cachegen.Profile.train(contexts, config)
    assert (profile.layers, profile.kv_heads, profile.head_dim) == (2, 2, 64)
    path = tmp_path / "p.cgprof"
    path.write_bytes(profile.data)
    loaded = cachegen.load_profile(path)
    assert loaded.id == profile.id
    kv = make_kv(seed=9)
    data = cachegen.encode(kv, profile=loaded, chunk_tokens=128)
    with pytest.raises(cachegen.NotFoundError, match="profile"):
        cachegen.decode(data)
    out = cachegen.decode(data, profiles=cachegen.ProfileSet([loaded]), dtype="f32")
    assert snr_db(kv, out) > 5
    sens = profile.with_sensitivity([1e-3] * 4)
    assert sens.id != profile.id
    data = cachegen.encode(kv, profile=sens, max_kl=1e-2, chunk_tokens=128)
    assert cachegen.inspect(data)["levels"] == 1


def test_errors_are_exceptions(kv):
    with pytest.raises(cachegen.Error):
        cachegen.decode(b"\x00" * 100)
    data = bytearray(cachegen.encode(kv))
    data[-1] ^= 0x40
    with pytest.raises(cachegen.CorruptError):
        cachegen.decode(bytes(data))
    with pytest.raises(ValueError, match="layers, 2, tokens"):
        cachegen.encode(kv[0])
    with pytest.raises(ValueError, match="float32 or float16"):
        cachegen.encode(kv.astype(np.float64))
    with pytest.raises(TypeError, match="unknown codec option"):
        cachegen.encode(kv, bitz=2)
    with pytest.raises(ValueError):
        cachegen.encode(kv, bits=2.0, snr_db=10)  # two rate targets
    with pytest.raises(ValueError, match="shape"):
        cachegen.decode(cachegen.encode(kv), out=np.zeros((2, 2, 10, 2, 64), np.float16))
    with pytest.raises(ValueError):
        cachegen.CodecConfig(rope="sideways")


def test_threads_decode_concurrently(kv):
    from concurrent.futures import ThreadPoolExecutor

    data = cachegen.encode(kv, bits=3.0)
    expected = cachegen.decode(data)
    with ThreadPoolExecutor(4) as pool:
        for out in pool.map(lambda _: cachegen.decode(data, threads=1), range(8)):
            assert np.array_equal(out, expected)
