"""Sharded checkpoints against PyTorch's distributed checkpoint (DCP).

The GPT of examples/models.py with Adam (parameters and both moments) on 2
ranks, trained one step, then saved and loaded: sbpc's `exe.save(dir)` /
`exe.load(dir)` (each rank writes and reads its own pieces as safetensors
files) under data parallelism (replicated: one rank writes each array) and
ZeRO (the moments split: each rank writes its half), against
`torch.distributed.checkpoint.save` / `load` of a state dict of the same
tensors on 2 gloo processes (replicated, as DDP holds them; DCP's planner
writes each replicated tensor once). Both write into a fresh directory of
the same file system and sync their files. Prints seconds and GB/s (the
checkpoint's bytes over the time), best of `--repeats`.

    python bench/checkpoint.py [--dim 512 --layers 8 --repeats 3] [--quick]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import _common  # noqa: F401  (first: one BLAS thread per process)
import numpy as np

SCRIPT = os.path.abspath(__file__)


def config(args) -> dict:
    return {"vocab": _common.gpt_vocab(), "batch": 8, "seq": 16, "dim": args.dim, "heads": max(1, args.dim // 64),
            "layers": args.layers}


def run_sbpc(args, variant: str, folder: str) -> dict:
    import sbpc

    exe = sbpc.compile(_common.gpt(variant, 2, config(args)))
    data = _common.load_example("models").gpt_batches(8, 16)
    exe.train_step(next(data))
    types = exe._param_types()
    size = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in types.values())
    saves, loads = [], []
    for k in range(args.repeats):
        target = os.path.join(folder, f"sbpc-{variant}-{k}")
        start = time.perf_counter()
        exe.save(target)
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        exe.load(target)
        loads.append(time.perf_counter() - start)
        shutil.rmtree(target)
    shapes = {key: [list(shape), str(dtype)] for key, (shape, dtype) in types.items()}
    return {"bytes": size, "save_s": min(saves), "load_s": min(loads), "shapes": shapes}


def role_dcp(args) -> None:
    """One DCP process: a state dict of the given shapes, replicated."""
    import torch
    import torch.distributed.checkpoint as dcp

    rank, size = _common.torch_peer_group()
    with open(args.shapes) as f:
        shapes = json.load(f)
    generator = torch.Generator().manual_seed(0)
    state = {key: torch.randn(shape, generator=generator).to(getattr(torch, dtype)) if "float" in dtype
             else torch.zeros(shape, dtype=getattr(torch, dtype)) for key, (shape, dtype) in shapes.items()}
    saves, loads = [], []
    for k in range(args.repeats):
        target = os.path.join(args.folder, f"dcp-{k}")
        torch.distributed.barrier()
        start = time.perf_counter()
        dcp.save(state, checkpoint_id=target)
        torch.distributed.barrier()
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        dcp.load(state, checkpoint_id=target)
        torch.distributed.barrier()
        loads.append(time.perf_counter() - start)
        if rank == 0:
            shutil.rmtree(target)
    if rank == 0:
        print("RESULT " + json.dumps({"save_s": min(saves), "load_s": min(loads), "ranks": size}), flush=True)
    _common.leave_torch_peer()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a tiny GPT, one repeat: that the script runs")
    parser.add_argument("--role", choices=("dcp",), help=argparse.SUPPRESS)
    parser.add_argument("--shapes", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "dcp":
        _common.as_rank_role(lambda: role_dcp(args))
        return 0
    if args.quick:
        args.dim, args.layers, args.repeats = 64, 2, 1
    missing = _common.missing_peers({"torch": "the DCP peer"})
    with tempfile.TemporaryDirectory(prefix="sbpc-bench-ckpt-", dir=os.environ.get("TMPDIR")) as folder:
        dp = run_sbpc(args, "dp", folder)
        zero = run_sbpc(args, "zero", folder)
        _common.stop_pools()
        peer = None
        if not missing:
            shapes = os.path.join(folder, "shapes.json")
            with open(shapes, "w") as f:
                json.dump(dp["shapes"], f)
            peer = _common.run_on_ranks(SCRIPT, 2, "--role", "dcp", f"--shapes={shapes}", f"--folder={folder}",
                                        f"--repeats={args.repeats}")
    gb = dp["bytes"] / 1e9
    print(f"GPT {args.layers} layers of {args.dim} with Adam's state: {dp['bytes'] / 2**20:.1f} MiB on 2 ranks, "
          f"best of {args.repeats}; {_common.blas_kernels()}")
    rows = [["sbpc, data parallel (replicated)", f"{dp['save_s']:.3f}", f"{gb / dp['save_s']:.2f}",
             f"{dp['load_s']:.3f}", f"{gb / dp['load_s']:.2f}"],
            ["sbpc, ZeRO (moments split)", f"{zero['save_s']:.3f}", f"{gb / zero['save_s']:.2f}",
             f"{zero['load_s']:.3f}", f"{gb / zero['load_s']:.2f}"]]
    if peer is not None:
        rows.append(["PyTorch DCP (replicated)", f"{peer['save_s']:.3f}", f"{gb / peer['save_s']:.2f}",
                     f"{peer['load_s']:.3f}", f"{gb / peer['load_s']:.2f}"])
        rows.append(["sbpc data parallel / DCP (time)", _common.ratio(dp["save_s"], peer["save_s"]), "",
                     _common.ratio(dp["load_s"], peer["load_s"]), ""])
    _common.table(["", "save s", "save GB/s", "load s", "load GB/s"], rows)
    if peer is None:
        print(f"summary: sbpc saves {gb / dp['save_s']:.2f} GB/s and loads {gb / dp['load_s']:.2f} GB/s "
              "(peer missing: torch)")
    else:
        print(f"summary: sbpc saves in {_common.ratio(dp['save_s'], peer['save_s'])} and loads in "
              f"{_common.ratio(dp['load_s'], peer['load_s'])} DCP's time ({gb / dp['save_s']:.2f} and "
              f"{gb / dp['load_s']:.2f} GB/s; ZeRO {gb / zero['save_s']:.2f} and {gb / zero['load_s']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
