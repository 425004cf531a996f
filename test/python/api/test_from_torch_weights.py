"""Weights that never pass through the driver: a Hugging Face model built on
the meta device and imported with `from_torch(weights=)` (the ranks read
their pieces from the safetensors checkpoint), and `save_pretrained`, which
writes the layout `from_pretrained` loads."""

import json

import numpy as np
import pytest

import sbpc
from sbpc import S
from sbpc.torch_frontend import TorchImportError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.torch_training import LanguageModelLoss as LossOf  # noqa: E402

CONFIG = {"vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 4}
"""GPT-2 as its configuration has it (dropout 0.1, the KV cache on), tiny."""
DATA = {"input_ids": S(0), "labels": S(0)}
GPT2_TP = {"*.c_attn.weight": S(1), "*.c_attn.bias": S(0), "*.attn.c_proj.weight": S(0),
           "*.c_fc.weight": S(1), "*.c_fc.bias": S(0), "*.mlp.c_proj.weight": S(0)}


def on_meta(**config):
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**CONFIG, **config}))


def tokens(seed: int):
    return torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A GPT-2 as `save_pretrained` writes it: one file, and sharded."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG))
    single, sharded = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("sharded")
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists()
    return single, sharded


@pytest.mark.parametrize("ranks, sbp, layout", [
    (1, None, "single"), (2, DATA, "sharded"), pytest.param(4, GPT2_TP, "single", marks=pytest.mark.full)],
    ids=["1 rank", "data parallel 2, sharded files", "tensor parallel 4"])
def test_a_gpt2_built_on_meta_gives_from_pretrained_s_loss(pretrained, ranks, sbp, layout):
    folder = pretrained[0] if layout == "single" else pretrained[1]
    x = tokens(0)
    reference = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = float(LossOf(reference)(x, x))
    model = on_meta().eval()  # a forward as from_pretrained's model runs it: no dropout
    graph = sbpc.from_torch(LossOf(model), (x, x), weights=folder, sbp=sbp, placement=sbpc.placement("cpu", ranks))
    assert not graph.initial_values  # nothing of the weights in this process
    exe = sbpc.compile(graph, mode="interpret" if ranks == 1 else "auto")
    loss = float(exe.run({"input_ids": x.numpy(), "labels": x.numpy()})["loss"])
    assert loss == pytest.approx(expected, rel=1e-5, abs=0)


def test_a_gpt2_built_on_meta_trains_as_the_same_model_with_its_weights(pretrained):
    feeds = [{"input_ids": tokens(i).numpy(), "labels": tokens(i).numpy()} for i in range(3)]
    x = tokens(0)

    def losses(module, **weights):
        graph = sbpc.from_torch(LossOf(module), (x, x), sbp=DATA, placement=sbpc.placement("cpu", 2), **weights)
        exe = sbpc.compile(graph, optimizer=sbpc.optim.AdamW(lr=1e-3), seed=3)
        return [float(exe.train_step(f)["loss"]) for f in feeds], exe

    with_weights, _ = losses(transformers.GPT2LMHeadModel.from_pretrained(pretrained[0]).train())
    from_files, exe = losses(on_meta().train(), weights=pretrained[1])
    assert from_files == with_weights  # the same bytes, the same dropout masks: the same steps
    assert exe.state_dict()["model.lm_head.weight"].shape == (64, 32)


def test_save_pretrained_writes_what_from_pretrained_loads(tmp_path, pretrained):
    x = tokens(0)
    torch.manual_seed(1)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG))
    graph = sbpc.from_torch(LossOf(model), (x, x), sbp=DATA, placement=sbpc.placement("cpu", 2))
    exe = sbpc.compile(graph, optimizer=sbpc.optim.AdamW(lr=1e-2))
    for i in range(2):
        exe.train_step({"input_ids": tokens(i).numpy(), "labels": tokens(i).numpy()})
    exe.save_pretrained(tmp_path / "one", config=model.config, prefix="model.")
    exe.save_pretrained(tmp_path / "shards", config=model.config, prefix="model.", max_shard_size=20_000)
    index = json.loads((tmp_path / "shards" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert "lm_head.weight" not in index["weight_map"]  # tied: once, as transformers writes it
    trained = LossOf(transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG)))
    trained.load_state_dict(exe.state_dict())
    trained.eval()
    with torch.no_grad():
        expected = trained.model(input_ids=x).logits
    for folder in ("one", "shards"):
        loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / folder).eval()
        for name, value in loaded.state_dict().items():
            assert torch.equal(value, exe.state_dict()[f"model.{name}"]), name
        with torch.no_grad():
            np.testing.assert_allclose(loaded(input_ids=x).logits.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
    # and sbpc reads it back on another plan, as it reads any Hugging Face checkpoint
    again = sbpc.compile(sbpc.from_torch(LossOf(on_meta()), (x, x), weights=tmp_path / "shards",
                                         sbp=GPT2_TP, placement=sbpc.placement("cpu", 2)))
    assert np.array_equal(again.params["model.transformer.h.0.mlp.c_fc.weight"],
                          exe.params["model.transformer.h.0.mlp.c_fc.weight"])


def test_a_meta_model_without_weights_and_weights_without_a_parameter_are_named(pretrained, tmp_path):
    x = tokens(0)
    with pytest.raises(TorchImportError, match=r"parameter 'model\.transformer\.wte\.weight' is on the meta device: "
                                               r"pass weights="):
        sbpc.from_torch(LossOf(on_meta()), (x, x))
    with pytest.raises(TorchImportError, match=r"hold 'transformer\.h\.0\.attn\.c_attn\.bias' as float32\[96\]; the "
                                               r"module's parameter 'model\.transformer\.h\.0\.attn\.c_attn\.bias' is "
                                               r"float32\[144\]"):
        sbpc.from_torch(LossOf(on_meta(n_embd=48)), (x, x), weights=pretrained[0])
    from safetensors.numpy import load_file, save_file

    tensors = load_file(pretrained[0] / "model.safetensors")
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TorchImportError, match=r"hold no tensor for parameter 'model\.transformer\.h\.1\.mlp\."
                                               r"c_fc\.bias' \(under the names \['model\.transformer\.h\.1\.mlp\."
                                               r"c_fc\.bias'\], less the prefix 'model\.'\)"):
        sbpc.from_torch(LossOf(on_meta()), (x, x), weights=tmp_path)
    with pytest.raises(TorchImportError, match="no such file"):
        sbpc.from_torch(LossOf(on_meta()), (x, x), weights=tmp_path / "nowhere")
