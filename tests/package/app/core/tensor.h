// The application's own core/tensor.h, a name flowstate also uses for a header: flowstate's
// headers include theirs as <flowstate/core/tensor.h>, so this one is only ever the app's.
#pragma once

namespace app {
struct Tensor {
  int rows = 0;
};
}  // namespace app

#define APP_OWN_CORE_TENSOR_H 1
