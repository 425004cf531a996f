"""A mixture of experts (Hugging Face Mixtral, its default grouped experts)
imported with `sbpc.from_torch` and trained expert parallel on R ranks,
against PyTorch DDP on R processes with the experts replicated, measured in
the same run.

    python bench/moe.py [--ranks 2 4] [--steps 8] [--batch 8] [--seq 64] [--experts 8] [--quick]

For each rank count: seconds per step (the median of the steps after the
first) and the peak resident memory per rank (VmHWM of sbpc's rank
processes; ru_maxrss of DDP's, which includes PyTorch's own footprint of
about 0.35 GiB), and for sbpc the memory its compiled plan holds per rank
(arena and persistent state: parameters, gradients, Adam's moments), of
sbpc expert parallel (the experts' weights
`sbp={"*experts*": S(0)}`: each rank holds E/R experts, their gradients and
Adam state), sbpc data parallel (`sbp={"*experts*": B}`: the experts
replicated, as DDP holds them), both with the batch split,
and DDP; each step's loss is checked against PyTorch on one process over
the whole batch (the same AdamW). `--quick` is a check that the script
runs: 2 ranks, a tiny model, 3 steps. Needs `pip install -e ".[models]"`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _common  # first: one BLAS thread per process

SCRIPT = str(Path(__file__).resolve())
LR = 1e-3


def config(args) -> dict:
    if args.quick:
        return {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
                "num_experts_per_tok": 2, "max_position_embeddings": 64}
    return {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 8, "num_key_value_heads": 4, "num_local_experts": args.experts,
            "num_experts_per_tok": 2, "max_position_embeddings": 256}


def model(args, seed: int = 0):
    import torch
    import transformers

    torch.manual_seed(seed)
    m = transformers.MixtralForCausalLM(transformers.MixtralConfig(**config(args)))
    return m.train()


def batches(args):
    import torch

    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, config(args)["vocab_size"], (args.batch, args.seq), generator=g)
            for _ in range(args.steps)]


def optimizer():
    import sbpc

    return sbpc.optim.AdamW(lr=LR, weight_decay=0.0)


def run_sbpc(args, data, ranks: int, experts_split: bool) -> dict:
    import sbpc

    # both split the batch; the experts split by expert, or replicated as DDP holds them
    sbp = {"input_ids": sbpc.S(0), "labels": sbpc.S(0), "*experts*": sbpc.S(0) if experts_split else sbpc.B}
    graph = sbpc.from_torch(model(args), (), {"input_ids": data[0], "labels": data[0]}, sbp=sbp,
                            placement=sbpc.placement("cpu", ranks))
    exe = sbpc.compile(graph, optimizer=optimizer())
    planned = exe.predict("cpu", devices=ranks).peak_memory / 2**30  # the compiled plan's arena and persistent state
    losses, times = [], []
    for x in data:
        start = time.perf_counter()
        losses.append(float(exe.train_step({"input_ids": x.numpy(), "labels": x.numpy()}, outputs=["loss"])["loss"]))
        times.append(time.perf_counter() - start)
    peaks = _common.rank_peaks()
    _common.stop_pools()
    return {"losses": losses, "step_s": times, "peaks": peaks, "planned": planned}


def _adamw(m):
    import torch

    return torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=0.0)


def _loss(m, x):
    return m(input_ids=x, labels=x).loss


def run_torch_reference(args, data) -> list[float]:
    """PyTorch on one process over the whole batch: the losses sbpc must give."""
    return _common.torch_losses(model(args), _adamw, data, _loss)


def role_ddp(args) -> None:
    """One DDP process (launched by mpiexec): its part of each batch, every expert."""
    _common.ddp_role(model(args), _adamw, batches(args), _loss, _common.rows_of)


def run_ddp(args, ranks: int) -> dict:
    options = [f"--{k}={v}" for k, v in (("steps", args.steps), ("batch", args.batch), ("seq", args.seq),
                                          ("experts", args.experts))]
    return _common.run_on_ranks(SCRIPT, ranks, "--role", "ddp", *options,
                                *(["--quick"] if args.quick else []))


def median_step(run: dict) -> float:
    return statistics.median(run["step_s"][1:] or run["step_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="a tiny Mixtral, 2 ranks, 3 steps: that the script runs")
    parser.add_argument("--role", choices=("ddp",), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "ddp":
        _common.as_rank_role(lambda: role_ddp(args))
        return 0
    if _common.missing_peers({"torch": "the model and the DDP peer", "transformers": "Mixtral"}):
        print("summary: skipped (peer missing)")
        return 0
    if args.quick:
        args.ranks, args.steps, args.batch, args.seq, args.experts = [2], 3, 4, 16, 4
    data = batches(args)
    reference = run_torch_reference(args, data)
    cfg = config(args)
    print(f"Mixtral, {cfg['num_hidden_layers']} layers, dim {cfg['hidden_size']}, {cfg['num_local_experts']} "
          f"experts (top {cfg['num_experts_per_tok']}), batch {args.batch} x {args.seq}, AdamW; "
          f"{_common.blas_kernels()}")
    rows, summary = [], []
    for ranks in args.ranks:
        expert = run_sbpc(args, data, ranks, experts_split=True)
        data_parallel = run_sbpc(args, data, ranks, experts_split=False)
        ddp = run_ddp(args, ranks)
        worst = max(abs(a - b) / abs(b) for run in (expert, data_parallel)
                    for a, b in zip(run["losses"], reference))
        for name, run in (("sbpc expert parallel", expert), ("sbpc data parallel", data_parallel),
                          ("PyTorch DDP", ddp)):
            rows.append([f"{ranks} ranks, {name}", f"{median_step(run):.3f}",
                         _common.ratio(median_step(run), median_step(ddp)),
                         f"{max(run['peaks']):.3f}", _common.ratio(max(run["peaks"]), max(ddp["peaks"])),
                         f"{run['planned'] * 1024:.1f}" if "planned" in run else "-"])
        summary.append(f"{ranks} ranks: expert parallel {_common.ratio(median_step(expert), median_step(ddp))} "
                       f"DDP's step time, {_common.ratio(max(expert['peaks']), max(ddp['peaks']))} its peak "
                       f"memory; loss within {worst:.1e} of PyTorch")
    _common.table(["", "s/step", "of DDP's", "peak GiB per rank", "of DDP's", "planned MiB per rank"], rows)
    print("summary: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
