// The old path, kept for existing programs: the header is flowstate/tools/accumulate.h.
#pragma once
#include "flowstate/tools/accumulate.h"
