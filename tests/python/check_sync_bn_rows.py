"""run_scaling.py --sync-bn on two Gloo ranks (ResNet-50, --quick): libddp's
row ran SyncBatchNorm and measured a throughput; PyTorch's says that
torch.nn.SyncBatchNorm needs CUDA, instead of failing or running plain BatchNorm.

    python3 check_sync_bn_rows.py RUN_SCALING BUILD_DIR OUT_DIR
"""
import json
import os
import subprocess
import sys


def main():
    run_scaling, build, out = sys.argv[1:4]
    subprocess.run([sys.executable, run_scaling, "--build", build, "--device", "cpu", "--quick", "--gpus", "2",
                    "--models", "resnet50", "--precisions", "bf16", "--impls", "libddp,pytorch", "--sync-bn",
                    "--out", out, "--prefix", "sync-bn"], check=True)
    with open(os.path.join(out, "sync-bn.json")) as report:
        rows = {row["impl"]: row for row in json.load(report)["rows"]}
    libddp, pytorch = rows["libddp"], rows["pytorch"]
    assert libddp.get("sync_bn") is True and libddp["gpus"] == 2 and libddp["throughput"] > 0, libddp
    assert "SyncBatchNorm runs on CUDA only" in pytorch.get("unavailable", ""), pytorch
    assert pytorch.get("sync_bn") is True, pytorch
    print("sync-bn rows as expected:", libddp["throughput"], libddp["unit"], "|", pytorch["unavailable"])


if __name__ == "__main__":
    main()
