// Uses the installed library: quantizes with FSQ and checks that decode inverts encode.
#include <torch/torch.h>

#include <iostream>

#include "lockstep/dist/group.h"
#include "lockstep/quant/fsq.h"

int main() {
  lockstep::quant::Fsq fsq(lockstep::quant::FsqOptions({8, 5, 5, 5}));
  const at::Tensor x = torch::randn({2, 16, 4});
  const at::Tensor ids = fsq.encode(x);
  const bool same = torch::equal(fsq.decode(ids), fsq.quantize(x, {}).quantized);
  auto group = lockstep::dist::make_single_process_group();
  std::cout << "consumer: fsq codebook " << fsq.codebook_size() << ", round trip " << (same ? "ok" : "FAILED")
            << ", group " << group->describe() << "\n";
  return same ? 0 : 1;
}
