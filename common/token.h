#pragma once
// The token id type, below runtime/kv (which stores tokens), runtime/store (which persists them) and
// runtime/model (which makes them: there it is also called model::Token), so that none of those need include
// the model.

#include <cstdint>

namespace choreo {

using Token = int32_t;

}  // namespace choreo
