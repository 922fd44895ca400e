// A first distributed program: joins the job, checks each collective once,
// and reports. Run it on every local GPU, or on 2 CPU processes:
//   ddprun --standalone build/examples/smoke/collectives_smoke

#include <chrono>
#include <cstdio>

#include <torch/torch.h>

#include <ddp/ddp.h>

int main() {
  try {
    auto pg = ddp::init();
    auto& comm = pg->communicator();
    const auto options = torch::TensorOptions().device(pg->device());
    const int world = pg->world_size();

    // Every rank contributes its rank + 1; everyone gets 1 + 2 + ... + world.
    auto start = std::chrono::steady_clock::now();
    torch::Tensor sum = torch::full({1 << 20}, pg->rank() + 1.0, options);
    comm.all_reduce(sum)->wait();
    const double expected_sum = world * (world + 1) / 2.0;
    TORCH_CHECK(sum.eq(expected_sum).all().item<bool>(), "all_reduce gave ", sum[0].item<double>(), ", expected ",
                expected_sum);

    torch::Tensor seed = pg->rank() == 0 ? torch::arange(1000, options.dtype(torch::kFloat)) : torch::zeros({1000}, options);
    comm.broadcast(seed, 0)->wait();
    TORCH_CHECK(seed.equal(torch::arange(1000, options.dtype(torch::kFloat))), "broadcast from rank 0 differs");

    torch::Tensor gathered = torch::empty({world}, options);
    comm.all_gather(gathered, torch::full({1}, static_cast<double>(pg->rank()), options))->wait();
    TORCH_CHECK(gathered.equal(torch::arange(world, options.dtype(torch::kFloat))), "all_gather out of rank order");
    comm.barrier();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

    if (pg->rank() == 0) {
      std::printf("smoke: %d ranks over %s on %s: all_reduce, broadcast, all_gather and barrier correct (%.1f ms)\n",
                  world, ddp::to_string(pg->backend()).c_str(), pg->device().str().c_str(), ms);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smoke: error: %s\n", e.what());
    return 1;
  }
}
