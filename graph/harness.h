// The old path, kept for existing programs: the header is flowstate/tools/harness.h.
#pragma once
#include "flowstate/tools/harness.h"
