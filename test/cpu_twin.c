// test/twin.h bound to the CPU trainer (train_llama2.c, its main left out), as
// cpu_* functions for test/test_llama2cu.cu (declared in test/cpu_twin.h).
#define TESTING
#include "../train_llama2.c"
#define TWIN_PREFIX cpu_
#include "twin.h"
#include "cpu_twin.h"
