"""Train a Hugging Face ResNet (`transformers.ResNetForImageClassification`,
a small configuration of the real architecture: convolutions, batch-norm,
max pooling, residual blocks) with sbpc on MPI ranks, data parallel, then
load the weights and the batch-norm's running statistics back into the model
and evaluate it with PyTorch.

    pip install -e ".[models]"
    python examples/hf_resnet.py [--ranks 2] [--steps 60]

The task is synthetic: 16x16 images of noise with a brighter square in one
of four quadrants; the label is the quadrant. Batch-norm normalizes by the
statistics of the whole batch on every plan (SyncBatchNorm's), so this is
the same training as one process on the whole batch.
"""

import argparse
import sys
import time

import numpy as np
import torch
import transformers

import sbpc
from sbpc import S


def images(rng: np.random.Generator, batch: int) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, 4, batch)
    x = rng.normal(0.0, 1.0, (batch, 3, 16, 16)).astype(np.float32)
    for i, quadrant in enumerate(labels):
        top, left = 8 * (quadrant // 2), 8 * (quadrant % 2)
        x[i, :, top + 2:top + 6, left + 2:left + 6] += 2.0
    return x, labels.astype(np.int64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = transformers.ResNetForImageClassification(transformers.ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=4))
    model.train()
    rng = np.random.default_rng(0)
    x, y = images(rng, args.batch)
    start = time.perf_counter()
    graph = sbpc.from_torch(model, (), {"pixel_values": torch.from_numpy(x), "labels": torch.from_numpy(y)},
                            sbp={"pixel_values": S(0), "labels": S(0)}, placement=sbpc.placement("cpu", args.ranks))
    exe = sbpc.compile(graph, optimizer=sbpc.optim.Adam(lr=args.lr))
    print(f"imported {type(model).__name__} ({sum(p.numel() for p in model.parameters())} parameters) and "
          f"compiled for {args.ranks} ranks (data parallel) in {time.perf_counter() - start:.1f} s")

    first = last = None
    start = time.perf_counter()
    for step in range(args.steps):
        x, y = images(rng, args.batch)
        loss = float(exe.train_step({"pixel_values": x, "labels": y}, outputs=["loss"])["loss"])
        first = loss if first is None else first
        last = loss
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss:.4f}")
    print(f"{args.steps / (time.perf_counter() - start):.1f} steps/s")

    model.load_state_dict(exe.state_dict())  # weights, running statistics and count
    model.eval()
    x, y = images(np.random.default_rng(1), 256)
    with torch.no_grad():
        predicted = model(pixel_values=torch.from_numpy(x)).logits.argmax(-1).numpy()
    accuracy = float((predicted == y).mean())
    print(f"PyTorch with sbpc's weights and running statistics, evaluation mode: accuracy {accuracy:.2f} on 256 "
          f"new images (chance: 0.25)")
    assert first is not None and last is not None
    return 0 if last < first and accuracy > 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
