#pragma once
// The token id type, below runtime/kv (which stores tokens) and runtime/model (which makes them), so that kv
// need not include the model. It keeps its name choreo::model::Token.

#include <cstdint>

namespace choreo::model {

using Token = int32_t;

}  // namespace choreo::model
