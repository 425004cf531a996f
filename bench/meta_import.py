"""The driver's memory for a model it never holds: a GPT-2 of about 1 GB of
float32 weights is built on the meta device, imported with
`sbpc.from_torch(weights=)` from the safetensors checkpoint
`save_pretrained` wrote, compiled with AdamW and trained one step on rank
pool ranks, which read their own pieces of the weights from the files.

Prints the driver's resident memory once the model is built on meta (its
class's code imported), its peak from there to the end of the step (VmHWM,
reset through /proc/self/clear_refs), the growth against the weights'
size, and the wall time of each stage; first for the large GPT-2, in a
process that has exported nothing before (torch.export's and the
compiler's first use count), then for a tiny one. Each checkpoint is
written by a child process (the model with its weights lives only there).

    python bench/meta_import.py [--layers 20] [--dim 1024] [--ranks 1] [--quick]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import _common  # noqa: F401  (first: one BLAS thread per process)

WRITE = """
import sys, torch, transformers
config = transformers.GPT2Config(vocab_size={vocab}, n_positions={seq}, n_embd={dim}, n_layer={layers},
                                 n_head={heads})
torch.manual_seed(0)
transformers.GPT2LMHeadModel(config).save_pretrained(sys.argv[1])
"""


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a tiny GPT-2: checks that the script runs")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.dim, args.vocab, args.seq = 2, 64, 512, 16
    missing = _common.missing_peers({"torch": "torch", "transformers": "transformers"})
    if missing:
        print(f"summary: peer missing: {', '.join(missing)}")
        return
    big = measure(args.ranks, args.layers, args.dim, args.vocab, args.seq)  # first: nothing exported before it
    tiny = measure(args.ranks, 2, 64, 512, 16)
    _common.stop_pools()
    mb = 1 << 20
    print(f"GPT-2 with {args.layers} layers of {args.dim}, vocabulary {args.vocab}: {big['weights'] / mb:.0f} MB of "
          f"weights; {args.ranks} rank(s); {_common.blas_kernels()}")
    for what, run in (("this GPT-2, first", big), ("then a tiny one (2 layers of 64)", tiny)):
        print(f"{what}: driver RSS {run['before'] / mb:.0f} MB with the model built on meta, peak "
              f"{run['peak'] / mb:.0f} MB to the end of the step: grew {run['growth'] / mb:.0f} MB; import "
              f"{run['import']:.1f} s, compile {run['compile']:.1f} s, first step (the ranks read their pieces) "
              f"{run['step']:.1f} s, loss {run['loss']:.4f}")
    print(f"summary: the driver's peak RSS grew {big['growth'] / mb:.0f} MB for {big['weights'] / mb:.0f} MB of "
          f"weights ({100 * big['growth'] / big['weights']:.1f}%; a tiny model's import after it: "
          f"{tiny['growth'] / mb:.0f} MB)")


def measure(ranks: int, layers: int, dim: int, vocab: int, seq: int) -> dict:
    """Writes the checkpoint (a child process), then imports, compiles and
    trains one step here, resetting the peak RSS first."""
    import numpy as np
    import torch
    import transformers

    import sbpc
    from sbpc import S

    heads = max(1, dim // 64)
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-c", WRITE.format(vocab=vocab, seq=seq, dim=dim, layers=layers, heads=heads),
                        folder], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        weights = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
                      if f.endswith(".safetensors"))

        class LossOf(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, input_ids, labels):
                return self.model(input_ids=input_ids, labels=labels).loss

        ids = torch.randint(0, vocab, (ranks, seq), generator=torch.Generator().manual_seed(0))
        config = transformers.GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=dim, n_layer=layers, n_head=heads)
        with torch.device("meta"):
            model = transformers.GPT2LMHeadModel(config)  # (its first build imports transformers' GPT-2 code)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS: the peak from here on
        before = status_kb("VmRSS")
        t0 = time.perf_counter()
        sbp = {"input_ids": S(0), "labels": S(0)} if ranks > 1 else None
        graph = sbpc.from_torch(LossOf(model), (ids, ids), weights=folder, sbp=sbp,
                                placement=sbpc.placement("cpu", ranks))
        t1 = time.perf_counter()
        exe = sbpc.compile(graph, optimizer=sbpc.optim.AdamW(lr=1e-4))
        t2 = time.perf_counter()
        loss = float(exe.train_step({"input_ids": ids.numpy(), "labels": ids.numpy()})["loss"])
        t3 = time.perf_counter()
        peak = status_kb("VmHWM")
    assert np.isfinite(loss)
    return {"weights": weights, "before": before * 1024, "peak": peak * 1024, "growth": (peak - before) * 1024,
            "import": t1 - t0, "compile": t2 - t1, "step": t3 - t2, "loss": loss}


if __name__ == "__main__":
    main()
