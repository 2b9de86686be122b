"""Shared fixtures: KV arrays shaped like a small model's cache."""

import numpy as np
import pytest


def make_kv(layers=2, tokens=256, heads=2, dim=64, seed=0, dtype=np.float32, model=0):
    """[L, 2, T, H, D] with per-channel scales and offsets (the "model's":
    the same for every seed) and correlation along tokens, as real caches
    have."""
    channels = np.random.default_rng(1000 + model)
    scale = channels.uniform(0.2, 3.0, size=(layers, 2, 1, heads, dim))
    offset = channels.normal(0, 1, size=(layers, 2, 1, heads, dim))
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 1, size=(layers, 2, tokens, heads, dim))
    # AR(1) along tokens: neighbouring tokens alike, the mean the model's.
    ar = np.empty_like(noise)
    ar[:, :, 0] = noise[:, :, 0]
    for t in range(1, tokens):
        ar[:, :, t] = 0.8 * ar[:, :, t - 1] + 0.6 * noise[:, :, t]
    return (offset + scale * ar).astype(dtype)


@pytest.fixture
def kv():
    return make_kv()
