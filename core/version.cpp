#include "flowstate/core/version.h"

#ifndef FLOWSTATE_VERSION
#error "FLOWSTATE_VERSION comes from the project's version (core/CMakeLists.txt)"
#endif

namespace flowstate {

const char* version() { return FLOWSTATE_VERSION; }

}  // namespace flowstate
