# Shared compile settings for every flowstate target.
add_library(flowstate_options INTERFACE)
add_library(flowstate::options ALIAS flowstate_options)
target_compile_features(flowstate_options INTERFACE cxx_std_20)
target_compile_options(flowstate_options INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers>)
if(FLOWSTATE_SANITIZE)
  string(REPLACE ";" "," _san "${FLOWSTATE_SANITIZE}")
  target_compile_options(flowstate_options INTERFACE -fsanitize=${_san} -fno-omit-frame-pointer
                                                     -fno-sanitize-recover=all)
  if(FLOWSTATE_SANITIZE MATCHES "undefined")
    # oneTBB's flow-graph headers downcast a task in its own finalize() after destroying it
    # (_flow_graph_impl.h: finalize<forward_task_bypass>): a vptr report inside TBB, not ours.
    target_compile_options(flowstate_options INTERFACE -fno-sanitize=vptr)
  endif()
  target_link_options(flowstate_options INTERFACE -fsanitize=${_san})
endif()
install(TARGETS flowstate_options EXPORT flowstateTargets)
