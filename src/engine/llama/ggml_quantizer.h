// ggml's own block quantizers (libggml-base of the linked llama.cpp) for
// the quantized KV cache types, behind the core library's GgmlQuantizer.
#pragma once

#include "engine/llama_state.h"

namespace cachegen::engine {

// The process-wide quantizer (stateless, thread-safe).
const GgmlQuantizer& LlamaGgmlQuantizer();

}  // namespace cachegen::engine
