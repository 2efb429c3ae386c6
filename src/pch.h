// Precompiled for every lockstep target: torch's headers dominate compile time.
#pragma once
#include <torch/torch.h>
