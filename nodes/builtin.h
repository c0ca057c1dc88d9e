// Every built-in node, in one include: their options types and definitions, for programs that
// use the Pipeline::Builder shorthands (`.shard({})`, `.batch({.size = 256})`) or name the
// built-ins' definitions. The runtime (graph/) includes none of them.
#pragma once

#include "flowstate/nodes/batch.h"
#include "flowstate/nodes/decode_image.h"
#include "flowstate/nodes/device_copy.h"
#include "flowstate/nodes/filter.h"
#include "flowstate/nodes/map.h"
#include "flowstate/nodes/mix.h"
#include "flowstate/nodes/pack.h"
#include "flowstate/nodes/prefetch.h"
#include "flowstate/nodes/shard.h"
#include "flowstate/nodes/shuffle.h"
#include "flowstate/nodes/sources/indexed.h"
#include "flowstate/nodes/sources/iterable.h"
#include "flowstate/nodes/sources/lines.h"
#include "flowstate/nodes/sources/records.h"
#include "flowstate/nodes/sources/tar.h"
#include "flowstate/nodes/tokenize.h"
