// flowstate: the whole public API in one include, <flowstate/flowstate.h>.
//
// A program builds a Pipeline (in C++ with Pipeline::Builder, or from YAML with
// load_pipeline), iterates it with a Loader, and checkpoints and restores the Loader. Its own
// nodes are a NodeDef (define_node), its own sources any iterable (from_range, from_producer).
// Each header below can also be included on its own, as <flowstate/graph/loader.h> etc.
#pragma once

#include "flowstate/config/plugins.h"
#include "flowstate/config/registry.h"
#include "flowstate/config/transforms.h"
#include "flowstate/config/yaml.h"
#include "flowstate/core/batch.h"
#include "flowstate/core/collate.h"
#include "flowstate/core/error.h"
#include "flowstate/core/tensor.h"
#include "flowstate/graph/loader.h"
#include "flowstate/graph/pipeline.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/options.h"
#include "flowstate/nodes/sources/iterable.h"
#include "flowstate/tools/accumulate.h"
#include "flowstate/tools/verify.h"
