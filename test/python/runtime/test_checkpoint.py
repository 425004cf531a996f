"""Sharded checkpoints (runtime/checkpoint.py): each rank writes its own
pieces on the plan that trained, and any plan of the same graph loads them
bit for bit: another rank count, mesh, SBP, ZeRO, FSDP or pipeline."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import sbpc
from sbpc import B, S
from sbpc.runtime.checkpoint import CheckpointError

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import models  # noqa: E402

VOCAB = len(models.corpus()[1])
SIZE = {"batch": 8, "seq": 8, "dim": 16, "heads": 4, "layers": 2, "dropout": 0.1}
"""The example GPT with dropout: the RNG's seed and step are in its state."""
TRAINED = 3


def gpt(variant: str, ranks: int, **size):
    return models.gpt(variant, ranks, VOCAB, **{**SIZE, **size})


def exact(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def saved_then_loaded(tmp_path, plan_a, plan_b, feeds):
    """Plan A trains TRAINED steps and saves; plan B loads. Returns both
    executables and A's state as it saved it."""
    a = sbpc.compile(plan_a, seed=7)
    for f in feeds[:TRAINED]:
        a.train_step(f)
    a.save(tmp_path / "ckpt")
    state = {key: a.params[key] for key in a.param_keys()}
    b = sbpc.compile(plan_b)  # its own seed (0) until the checkpoint's is loaded
    b.load(tmp_path / "ckpt")
    return a, b, state


def check_resharded(a, b, state, feeds, rtol=1e-6):
    loaded = {key: b.params[key] for key in b.param_keys()}
    assert set(loaded) == set(state)
    differ = [key for key in state if not exact(state[key], loaded[key])]
    assert not differ, f"{len(differ)} arrays differ after loading, {differ[0]!r} first"
    # both go on: A from where it was (its pool may have run B since), B from A's state
    after_a = float(a.train_step(feeds[TRAINED])["loss"])
    after_b = float(b.train_step(feeds[TRAINED])["loss"])
    assert after_b == pytest.approx(after_a, rel=rtol, abs=0)


PAIRS = [
    ("dp", 2, "tp", 4),
    pytest.param("zero", 2, "fsdp", 4, marks=pytest.mark.full),
    pytest.param("2d", 4, "dp", 1, marks=pytest.mark.full),
    ("pipeline", 4, "dp", 2),
    ("dp", 2, "zero", 2),  # one pool runs both plans: each goes on from its own state
]


@pytest.mark.parametrize("a, ranks_a, b, ranks_b", PAIRS,
                         ids=["dp2 to tp4", "zero2 to fsdp4", "2-D 2x2 to 1 rank", "pipeline 2x2 to dp2",
                              "dp2 to zero2"])
def test_the_gpts_checkpoint_reshards_to_another_plan_bit_for_bit(tmp_path, a, ranks_a, b, ranks_b):
    data = models.gpt_batches(8, 8)
    feeds = [next(data) for _ in range(TRAINED + 1)]
    exe_a, exe_b, state = saved_then_loaded(tmp_path, gpt(a, ranks_a), gpt(b, ranks_b), feeds)
    assert int(state["rng.seed"]) == 7 and int(state["rng.step"]) == TRAINED
    check_resharded(exe_a, exe_b, state, feeds)


def test_each_rank_writes_its_own_shards_and_a_replicated_array_once(tmp_path):
    data = models.gpt_batches(8, 8)
    exe = sbpc.compile(gpt("zero", 2))
    exe.train_step(next(data))
    exe.save(tmp_path / "ckpt")
    index = json.loads((tmp_path / "ckpt" / "index.json").read_text())
    arrays = index["arrays"]
    # ZeRO: Adam's moments split over the two ranks, each half in its rank's file
    moment = arrays["adam.m.block0.w1"]
    assert moment["layout"]["sbp"] == ["S0"]
    assert sorted((p["file"], p["start"], p["stop"]) for p in moment["pieces"]) == [
        ("rank-00000.safetensors", [0, 0], [8, 64]), ("rank-00001.safetensors", [8, 0], [16, 64])]
    # replicated weights: one piece each, written by one rank or the other
    weight = arrays["block0.w1"]
    assert weight["layout"]["sbp"] == ["B"]
    assert [(p["start"], p["stop"]) for p in weight["pieces"]] == [([0, 0], [16, 64])]
    writers = {name: entry["pieces"][0]["file"] for name, entry in arrays.items() if entry["layout"]["sbp"] == ["B"]}
    assert sorted(set(writers.values())) == ["rank-00000.safetensors", "rank-00001.safetensors"]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["index.json", "rank-00000.safetensors", "rank-00001.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name != "ckpt"]  # no temporary directory left


def test_an_interpreted_plans_checkpoint_loads_on_ranks_and_back(tmp_path):
    data = models.gpt_batches(8, 8)
    feeds = [next(data) for _ in range(TRAINED + 1)]
    a = sbpc.compile(gpt("dp", 2), mode="interpret", seed=7)
    for f in feeds[:TRAINED]:
        a.train_step(f)
    a.save(tmp_path / "ckpt")
    b = sbpc.compile(gpt("tp", 2))
    b.load(tmp_path / "ckpt")
    b.save(tmp_path / "again")  # saved anew from the ranks' pieces
    c = sbpc.compile(gpt("dp", 2), mode="interpret")
    c.load(tmp_path / "again")
    check_resharded(a, c, {key: a.params[key] for key in a.param_keys()}, feeds)


def test_saving_over_a_checkpoint_replaces_it_and_refuses_anything_else(tmp_path):
    data = models.gpt_batches(8, 8)
    exe = sbpc.compile(gpt("dp", 2))
    exe.train_step(next(data))
    exe.save(tmp_path / "ckpt")
    exe.train_step(next(data))
    exe.save(tmp_path / "ckpt")
    fresh = sbpc.compile(gpt("dp", 2))
    fresh.load(tmp_path / "ckpt")
    assert int(fresh.params["rng.step"]) == 2
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="exists and is not a checkpoint"):
        exe.save(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "not a checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "mine"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A dp2 GPT's checkpoint, the template the refusals below damage."""
    path = tmp_path_factory.mktemp("saved") / "ckpt"
    exe = sbpc.compile(gpt("dp", 2))
    exe.train_step(next(models.gpt_batches(8, 8)))
    exe.save(path)
    return path


@pytest.fixture(scope="module")
def tensor_parallel():
    return sbpc.compile(gpt("tp", 2))


def damaged(saved, tmp_path, change):
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(saved, copy)
    change(copy)
    return copy


def edit_index(edit):
    def change(folder):
        index = json.loads((folder / "index.json").read_text())
        edit(index)
        (folder / "index.json").write_text(json.dumps(index))
    return change


def _shift_a_piece(index):
    # the bug that corrupted DCP and Megatron checkpoints: a piece at wrong offsets
    piece = index["arrays"]["block0.w1"]["pieces"][0]
    piece["start"][0] += 1
    piece["stop"][0] += 1


def _truncate(folder):
    with open(folder / "rank-00000.safetensors", "r+b") as f:
        f.truncate(1000)


@pytest.mark.parametrize("change, message", [
    (lambda f: (f / "rank-00000.safetensors").unlink(), r"is torn: rank-00000\.safetensors, with pieces of "
                                                         r"'adam\.m\.block0\.ln1\.b' and \d+ more arrays, is missing"),
    (_truncate, r"is torn: rank-00000\.safetensors cannot be read"),
    (lambda f: (f / "index.json").unlink(), "has no index.json: not a checkpoint, or one whose save never finished"),
    (lambda f: (f / "index.json").write_text('{"format": '), "index.json is not valid JSON"),
    (edit_index(_shift_a_piece), r"the piece of 'block0\.w1' in rank-00000\.safetensors at \[1, 0\]\.\.\[17, 64\] "
                                 r"does not lie inside its shape \[16, 64\]"),
    (edit_index(lambda i: i["arrays"]["block0.w1"]["pieces"].append(i["arrays"]["block0.w1"]["pieces"][0])),
     r"pieces of 'block0\.w1' overlap"),
    (edit_index(lambda i: i["arrays"]["block0.w1"]["pieces"][0]["stop"].__setitem__(0, 15)),
     r"the pieces of 'block0\.w1' cover 960 of its 1024 elements"),
    (edit_index(lambda i: i["arrays"]["block0.w1"]["pieces"][0].__setitem__("file", "../elsewhere.safetensors")),
     "names a piece file outside the checkpoint"),
], ids=["a missing shard", "a truncated shard", "no index", "a torn index", "a piece at wrong offsets",
        "overlapping pieces", "a gap", "a file outside"])
def test_a_damaged_checkpoint_is_refused_naming_what_is_wrong(saved, tensor_parallel, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        tensor_parallel.load(damaged(saved, tmp_path, change))


def test_a_checkpoint_of_another_graph_is_refused_naming_the_first_array_that_differs(saved):
    wider = sbpc.compile(gpt("dp", 2, dim=32))
    with pytest.raises(CheckpointError, match=r"is of another graph: 'adam\.m\.block0\.ln1\.b' is float32\[16\] "
                                              r"there, float32\[32\] here"):
        wider.load(saved)
    sgd = sbpc.compile(gpt("dp", 2, algorithm="sgd"))
    with pytest.raises(CheckpointError, match=r"is of another graph: it has 'adam\.m\.block0\.ln1\.b', which this "
                                              r"plan does not"):
        sgd.load(saved)


# -- Hugging Face GPT-2, as its configuration has it (dropout 0.1) ---------------

GPT2_TP = {"*.c_attn.weight": S(1), "*.c_attn.bias": S(0), "*.attn.c_proj.weight": S(0),
           "*.c_fc.weight": S(1), "*.c_fc.bias": S(0), "*.mlp.c_proj.weight": S(0)}
DATA = {"input_ids": S(0), "labels": S(0)}
GPT2_PLANS = {
    "dp2": (2, DATA, None, {}),
    "tp4": (4, GPT2_TP, None, {}),
    "zero2": (2, DATA, None, {"zero": True}),
    "fsdp4": (4, {**DATA, "*": S(0)}, None, {}),
    "2-D 2x2": (4, {"input_ids": (S(0), B), "labels": (S(0), B), **{k: (B, v) for k, v in GPT2_TP.items()}}, (2, 2),
                {}),
    "1 rank": (1, None, None, {}),
    "pipeline 2x2": (4, None, None, {"stages": 2, "micro_batches": 2}),
}


def gpt2_plan(name, batches):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from support.torch_training import LanguageModelLoss

    ranks, sbp, mesh, options = GPT2_PLANS[name]
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                                                 n_head=4))
    graph = sbpc.from_torch(LanguageModelLoss(model), batches[0], sbp=sbp, placement=sbpc.placement("cpu", ranks, mesh))
    micro = options.get("micro_batches", 1)
    return graph, {"optimizer": sbpc.optim.Adam(lr=1e-3, zero=options.get("zero", False)),
                   "pipeline": f"lg-micro-batch{{count={micro}}},compile" if micro > 1 else "compile",
                   "stages": options.get("stages", 1)}


@pytest.mark.parametrize("a, b", [
    pytest.param("dp2", "tp4", marks=pytest.mark.full),
    pytest.param("zero2", "fsdp4", marks=pytest.mark.full),
    pytest.param("2-D 2x2", "1 rank", marks=pytest.mark.full),
    # make test runs the example GPT's pairs; these repeat them through the importer's names
    pytest.param("pipeline 2x2", "dp2", marks=pytest.mark.full),
    pytest.param("dp2", "zero2", marks=pytest.mark.full),
], ids=lambda name: name)
def test_gpt2s_checkpoint_reshards_to_another_plan_bit_for_bit(tmp_path, a, b):
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 64, (4, 8), generator=generator),) * 2 for _ in range(TRAINED + 1)]
    feeds = [{"input_ids": x.numpy(), "labels": y.numpy()} for x, y in batches]
    graph_a, options_a = gpt2_plan(a, batches)
    exe_a = sbpc.compile(graph_a, seed=7, **options_a)
    for f in feeds[:TRAINED]:
        exe_a.train_step(f)
    exe_a.save(tmp_path / "ckpt")
    state = {key: exe_a.params[key] for key in exe_a.param_keys()}
    assert int(state["rng.step"]) == TRAINED
    graph_b, options_b = gpt2_plan(b, batches)
    exe_b = sbpc.compile(graph_b, **options_b)
    exe_b.load(tmp_path / "ckpt")
    check_resharded(exe_a, exe_b, state, feeds)
