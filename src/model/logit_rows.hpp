// Which logits a forward pass computes: none (prefill that only fills the state), the last row
// (generation: the output head runs on one token), or every row (scoring).
#pragma once

#include <cstdint>

namespace ep::model {

enum class LogitRows : uint8_t { none = 0, last = 1, all = 2 };

}  // namespace ep::model
