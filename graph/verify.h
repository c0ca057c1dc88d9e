// The old path, kept for existing programs: the header is flowstate/tools/verify.h.
#pragma once
#include "flowstate/tools/verify.h"
