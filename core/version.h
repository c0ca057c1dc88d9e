// The version of flowstate this program was built with: `flowstate --version`, the writer of a
// checkpoint's MANIFEST.json. One definition: project(flowstate VERSION ...) in CMakeLists.txt.
#pragma once

namespace flowstate {

/// "0.1.0"
const char* version();

}  // namespace flowstate
