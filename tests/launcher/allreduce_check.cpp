// A real libddp worker for the two-node launcher test: all-reduces each
// rank's rank + 1 and exits non-zero unless everyone got 1 + 2 + ... + world.

#include <cstdio>

#include <torch/torch.h>

#include <ddp/ddp.h>

int main() {
  try {
    auto pg = ddp::init();
    const int world = pg->world_size();
    torch::Tensor sum = torch::full({1000}, pg->rank() + 1.0, torch::TensorOptions().device(pg->device()));
    pg->communicator().all_reduce(sum)->wait();
    const double expected = world * (world + 1) / 2.0;
    const bool correct = sum.eq(expected).all().item<bool>();
    std::printf("allreduce_check: rank %d of %d: sum %g, expected %g: %s\n", pg->rank(), world, sum[0].item<double>(),
                expected, correct ? "correct" : "WRONG");
    return correct ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_check: error: %s\n", e.what());
    return 1;
  }
}
