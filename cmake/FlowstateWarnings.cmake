# Compile settings. What a consumer needs (C++20) is the public flowstate::options target;
# warnings and sanitizers are directory options of this project: every flowstate target,
# test, benchmark and example gets them, and none reaches a project that uses flowstate
# (through find_package or add_subdirectory).
add_library(flowstate_options INTERFACE)
add_library(flowstate::options ALIAS flowstate_options)
set_target_properties(flowstate_options PROPERTIES EXPORT_NAME options)
target_compile_features(flowstate_options INTERFACE cxx_std_20)
install(TARGETS flowstate_options EXPORT flowstateTargets)

add_compile_options(
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall> $<$<CXX_COMPILER_ID:GNU,Clang>:-Wextra>
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wpedantic>
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wno-missing-field-initializers>)
if(FLOWSTATE_SANITIZE)
  string(REPLACE ";" "," _san "${FLOWSTATE_SANITIZE}")
  add_compile_options(-fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  if(FLOWSTATE_SANITIZE MATCHES "undefined")
    # oneTBB's flow-graph headers downcast a task in its own finalize() after destroying it
    # (_flow_graph_impl.h: finalize<forward_task_bypass>): a vptr report inside TBB, not ours.
    add_compile_options(-fno-sanitize=vptr)
  endif()
  add_link_options(-fsanitize=${_san})
endif()
