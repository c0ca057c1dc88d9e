// The old path, kept for existing programs: the header is flowstate/tools/testing.h.
#pragma once
#include "flowstate/tools/testing.h"
