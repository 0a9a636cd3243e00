// A synthetic DeepSeek-V4 GGUF whose context length is small enough for tests to reach it (the
// KV budget and context-length tests of the engine and of the server's admission).
#pragma once

#include "support/temp_dir.hpp"
#include "testkit/deepseek_v4_gguf.hpp"

#include <cstdint>
#include <string>

namespace ep::test {

/// Writes dir/ds4-ctx<N>.gguf: the default synthetic DeepSeek-V4 without YaRN, so its context
/// length is @p context tokens; returns its path.
inline std::string write_context_model(const TempDir &dir, int64_t context) {
  ep::testkit::DeepseekV4SyntheticSpec spec;
  spec.yarn_factor = 1.0f;  // no YaRN: the context length is the original one
  spec.yarn_original_max_positions = context;
  const std::string path = dir / ("ds4-ctx" + std::to_string(context) + ".gguf");
  ep::testkit::write_deepseek_v4_synthetic_gguf(spec, path);
  return path;
}

}  // namespace ep::test
