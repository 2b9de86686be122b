"""torch tensors in and out, where torch is installed."""

import numpy as np
import pytest

import cachegen
from conftest import make_kv

torch = pytest.importorskip("torch", reason="torch is not installed (cachegen does not depend on it)")


def test_tensor_round_trip():
    kv = torch.from_numpy(make_kv())
    data = cachegen.encode(kv, codec="fp16")
    out = cachegen.to_torch(cachegen.decode(data))
    assert out.dtype == torch.float16 and torch.equal(out, kv.half())


def test_bfloat16_in_place():
    kv = torch.from_numpy(make_kv()).to(torch.bfloat16)
    data = cachegen.encode(kv, codec="fp16")
    assert cachegen.inspect(data)["dtype"] == "bf16"
    target = torch.zeros(2, 300, 2, 2, 64, dtype=torch.bfloat16)
    cachegen.decode(data, dtype="bf16", out=target[:, :256].permute(0, 2, 1, 3, 4))
    assert torch.equal(target[:, :256].permute(0, 2, 1, 3, 4), kv)
    assert torch.equal(cachegen.to_torch(cachegen.decode(data, dtype="bf16"), "bf16"), kv)
