"""How a Python serving engine plugs cachegen in: the connector pattern.

An engine with a paged KV cache (vLLM, SGLang; LMCache-style connectors sit at
the same point) needs two calls:

  after prefill   save(tokens, block_ids): the prompt's KV, gathered from the
                  engine's blocks, is encoded and stored chunk by chunk under
                  keys derived from the token ids (a chunk's key depends on
                  every token before it, so equal prefixes share chunks);
  before prefill  load(tokens, block_ids): the longest stored prefix is
                  streamed under a deadline and each chunk is copied into the
                  request's blocks as soon as it is decoded; what could not
                  arrive in time comes back as chunks to recompute.

The engine's cache here is a numpy stand-in for vLLM's per-layer layout
[num_blocks, 2, block_size, kv_heads, head_dim], one such array per layer
stacked as [layers, num_blocks, 2, block_size, kv_heads, head_dim]. A real
connector does the same with the engine's tensors (CPU memory; torch tensors
are accepted as they are).

Run: PYTHONPATH=<build>/python python3 paged_kv_connector.py [--store URI]
"""

import argparse

import numpy as np

import cachegen

LAYERS, KV_HEADS, HEAD_DIM = 4, 2, 64
BLOCK_SIZE, NUM_BLOCKS = 16, 256
CHUNK_TOKENS = 64  # a multiple of BLOCK_SIZE: a chunk fills whole blocks


class PagedKVConnector:
    """Saves and loads a request's KV between an engine's block table and a
    cachegen chunk store."""

    def __init__(self, store_uri, model_fingerprint, deadline_ms=200.0, prefill_tokens_per_s=5000.0):
        self.store = cachegen.Store(store_uri)
        # Keys depend on the model and the codec setting: KV of another model
        # or setting is never mistaken for this one's.
        self.root = cachegen.chain_root(model_fingerprint, "cachegen-2bit-3levels", CHUNK_TOKENS)
        self.encoder = cachegen.Encoder(bits_per_value=2.0, levels=3, chunk_tokens=CHUNK_TOKENS)
        self.client = cachegen.StreamClient(self.store)  # one per engine: it reuses decode buffers
        self.deadline_ms = deadline_ms
        self.prefill_tokens_per_s = prefill_tokens_per_s

    @staticmethod
    def _gather(cache, block_ids, tokens):
        """[L, 2, T, H, D] of a request's tokens from its blocks (a copy: the
        blocks are scattered)."""
        blocks = cache[:, block_ids]  # [L, n, 2, B, H, D]
        kv = blocks.transpose(0, 2, 1, 3, 4, 5).reshape(LAYERS, 2, -1, KV_HEADS, HEAD_DIM)
        return kv[:, :, :tokens]

    def save(self, cache, tokens, block_ids):
        """After prefill: store the whole chunks of the prompt."""
        whole = len(tokens) - len(tokens) % CHUNK_TOKENS
        kv = self._gather(cache, block_ids, whole)
        return cachegen.put_context(self.store, self.root, tokens[:whole], kv, self.encoder)

    def load(self, cache, tokens, block_ids):
        """Before prefill: stream the stored prefix into the request's blocks.
        Returns (tokens loaded, chunk indices to recompute, fetch result)."""
        whole = len(tokens) - len(tokens) % CHUNK_TOKENS
        keys = cachegen.chunk_keys(self.root, tokens[:whole], CHUNK_TOKENS)
        per_block = CHUNK_TOKENS // BLOCK_SIZE

        def on_chunk(chunk):
            # Chunk i fills blocks [i * per_block, (i + 1) * per_block) of the request.
            blocks = block_ids[chunk.index * per_block:(chunk.index + 1) * per_block]
            kv = chunk.kv.reshape(LAYERS, 2, per_block, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
            cache[:, blocks] = kv.transpose(0, 2, 1, 3, 4, 5)

        result = self.client.fetch(keys, [CHUNK_TOKENS] * len(keys), on_chunk, deadline_ms=self.deadline_ms,
                                   recompute_tokens_per_s=self.prefill_tokens_per_s, dtype="f16")
        delivered = [i for i, level in enumerate(result["levels"]) if level >= 0]
        loaded = CHUNK_TOKENS * len(delivered) if delivered == list(range(len(delivered))) else 0
        return loaded, result["recompute"], result


def fake_prefill(cache, block_ids, tokens, rng):
    """Stands in for the model: writes KV for the prompt into its blocks."""
    scale = rng.uniform(0.3, 2.0, size=(LAYERS, 1, 1, KV_HEADS, HEAD_DIM))
    for i, block in enumerate(block_ids):
        n = min(BLOCK_SIZE, tokens - i * BLOCK_SIZE)
        if n <= 0:
            break
        values = rng.normal(0, 1, size=(LAYERS, 2, n, KV_HEADS, HEAD_DIM)) * scale
        cache[:, block, :, :n] = values.astype(np.float16)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="mem://", help="chunk store URI (file://, redis://, http:// service)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cache = np.zeros((LAYERS, NUM_BLOCKS, 2, BLOCK_SIZE, KV_HEADS, HEAD_DIM), np.float16)
    connector = PagedKVConnector(args.store, "example-model-v1")

    prompt = list(rng.integers(0, 32000, size=300))
    first = list(range(0, 19))  # ceil(300 / 16) blocks
    fake_prefill(cache, first, len(prompt), rng)
    stats = connector.save(cache, prompt, first)
    print(f"saved {stats['chunks_stored']} chunks, {stats['bytes']} bytes "
          f"({stats['bytes'] / (LAYERS * 2 * 256 * KV_HEADS * HEAD_DIM * 2):.3f} of f16 at the finest level and two coarser)")

    # The same prompt again, now in other blocks: load instead of prefill.
    second = list(range(100, 119))
    loaded, recompute, result = connector.load(cache, prompt, second)
    print(f"loaded {loaded} of {len(prompt)} tokens in {result['elapsed_ms']:.1f} ms at levels {result['levels']}; "
          f"recompute chunks {recompute}; prefill the remaining {len(prompt) - loaded} tokens")
    # Finest-level chunks decode close to the original KV.
    original = PagedKVConnector._gather(cache, first, loaded).astype(np.float32)
    restored = PagedKVConnector._gather(cache, second, loaded).astype(np.float32)
    rel = np.sqrt(np.mean((original - restored) ** 2) / np.mean(original**2))
    print(f"relative RMS error of the loaded KV: {rel:.3f}")
    return 0 if loaded > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
