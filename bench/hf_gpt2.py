"""Hugging Face GPT-2 small at full size (124M parameters, vocabulary 50257,
12 layers, dim 768) imported with `sbpc.from_torch` and trained on R ranks,
against PyTorch DDP on R processes measured in the same run.

    python bench/hf_gpt2.py [--ranks 2] [--steps 10] [--batch 8] [--seq 128] [--plan manual|auto] [--rounds 3]
        [--quick]

Prints the import and compile times, seconds per step (in each round the
median of the steps after the first; sbpc and DDP take turns, `--rounds`
times, and the ratio is the median of the rounds' ratios, beside their
spread), each step's loss beside PyTorch's (one process over the whole
batch, the same SGD), and the peak resident memory per rank of both
systems (VmHWM of sbpc's rank processes; ru_maxrss of DDP's). `--plan
auto` lets sbp-autoplan choose the plan (and prints its choice); `manual`
is data parallel. `--quick` is a check that the script runs: a 2-layer
GPT-2 of dim 64 over 1000 tokens, 3 steps. Needs `pip install -e ".[models]"`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _common  # first: one BLAS thread per process

SCRIPT = str(Path(__file__).resolve())
SMALL: dict = {}
"""GPT-2 small: transformers' default configuration."""
QUICK = {"vocab_size": 1000, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4}


def model(config: dict, seed: int = 0):
    import torch
    import transformers

    torch.manual_seed(seed)
    m = transformers.GPT2LMHeadModel(transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                                              **config))
    return m.train()


def batches(args):
    import torch

    vocab = model_config(args).get("vocab_size", 50257)
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (args.batch, args.seq), generator=g) for _ in range(args.steps)]


def model_config(args) -> dict:
    return QUICK if args.quick else SMALL


def run_sbpc(args, data) -> dict:
    import sbpc

    gpt2 = model(model_config(args))
    start = time.perf_counter()
    graph = sbpc.from_torch(gpt2, (), {"input_ids": data[0], "labels": data[0]},
                            sbp={"input_ids": sbpc.S(0), "labels": sbpc.S(0)} if args.plan == "manual" else None,
                            placement=sbpc.placement("cpu", args.ranks))
    imported = time.perf_counter() - start
    start = time.perf_counter()
    exe = sbpc.compile(graph, optimizer=sbpc.optim.SGD(lr=args.lr), plan=args.plan)
    compiled = time.perf_counter() - start
    return {"import_s": imported, "compile_s": compiled, **train_steps(exe, data), "exe": exe,
            "plan": exe.autoplan.get("chosen", "data parallel (manual)")}


def train_steps(exe, data) -> dict:
    """One sbpc step per batch: the losses and each step's seconds."""
    losses, times = [], []
    for x in data:
        start = time.perf_counter()
        losses.append(float(exe.train_step({"input_ids": x.numpy(), "labels": x.numpy()}, outputs=["loss"])["loss"]))
        times.append(time.perf_counter() - start)
    return {"losses": losses, "step_s": times}


def median_step(run: dict) -> float:
    """A run's seconds a step: the median of the steps after the first."""
    return statistics.median(run["step_s"][1:] or run["step_s"])


def _sgd(args):
    import torch

    return lambda m: torch.optim.SGD(m.parameters(), lr=args.lr)


def _loss(m, x):
    return m(input_ids=x, labels=x).loss


def run_torch_reference(args, data) -> list[float]:
    """PyTorch on one process over the whole batch: the losses sbpc must give."""
    return _common.torch_losses(model(model_config(args)), _sgd(args), data, _loss)


def role_ddp(args) -> None:
    """One DDP process (launched by mpiexec): its part of each batch."""
    _common.ddp_role(model(model_config(args)), _sgd(args), batches(args), _loss, _common.rows_of)


def run_ddp(args) -> dict:
    options = [f"--{k}={v}" for k, v in (("steps", args.steps), ("batch", args.batch),
                                          ("seq", args.seq), ("lr", args.lr))]
    return _common.run_on_ranks(SCRIPT, args.ranks, "--role", "ddp", *options,
                                *(["--quick"] if args.quick else []))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--plan", choices=("manual", "auto"), default="manual")
    parser.add_argument("--rounds", type=int, default=3, help="turns of sbpc and DDP timed (default 3)")
    parser.add_argument("--quick", action="store_true", help="a tiny GPT-2, 3 steps: that the script runs")
    parser.add_argument("--role", choices=("ddp",), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "ddp":
        _common.as_rank_role(lambda: role_ddp(args))
        return 0
    if _common.missing_peers({"torch": "the model and the DDP peer", "transformers": "GPT-2"}):
        print("summary: skipped (peer missing)")
        return 0
    if args.quick:
        args.steps, args.batch, args.seq, args.rounds = 3, 4, 16, 1
    data = batches(args)
    sbpc_run = run_sbpc(args, data)
    peaks = _common.rank_peaks()
    ddp = run_ddp(args)
    rounds = _common.take_turns((median_step(sbpc_run), median_step(ddp)),
                                lambda: median_step(train_steps(sbpc_run["exe"], data)),
                                lambda: median_step(run_ddp(args)), args.rounds)
    _common.stop_pools()
    reference = run_torch_reference(args, data)
    name = "GPT-2 (quick: 2 layers, dim 64)" if args.quick else "GPT-2 small"
    print(f"{name}, batch {args.batch} x {args.seq}, {args.ranks} ranks, SGD; sbpc plan: {sbpc_run['plan']}")
    print(f"import {sbpc_run['import_s']:.1f} s, compile {sbpc_run['compile_s']:.1f} s")
    worst = max(abs(a - b) / abs(b) for a, b in zip(sbpc_run["losses"], reference))
    print("loss per step, sbpc / PyTorch: " + ", ".join(f"{a:.6f}/{b:.6f}" for a, b in zip(sbpc_run["losses"],
                                                                                            reference)))
    print(f"worst relative loss difference: {worst:.2e}")
    sbpc_step, ratio, lowest, highest = _common.report_turns(rounds, "DDP")
    _common.table(["", "peak GiB per rank"], [
        ["sbpc", ", ".join(f"{p:.2f}" for p in peaks)],
        ["PyTorch DDP", ", ".join(f"{p:.2f}" for p in ddp["peaks"])],
        ["sbpc / DDP", _common.ratio(max(peaks, default=None), max(ddp["peaks"]))],
    ])
    print(f"summary: sbpc {sbpc_step:.2f} s/step, {ratio:.2f}x DDP's time (median of {len(rounds)} rounds, "
          f"{lowest:.2f}x-{highest:.2f}x); peak {_common.ratio(max(peaks, default=None), max(ddp['peaks']))} "
          f"DDP's; loss within {worst:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
