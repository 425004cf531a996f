"""Capturing a module with torch.export: Hugging Face's caches registered
so that a decoder built with `use_cache` can be exported, export made
quiet, its failures in a sentence, and the user's line in a PyTorch stack
trace (the last frame outside torch and sbpc), which every import error
names."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import warnings


@contextlib.contextmanager
def _quiet_torch():
    """Export logs and prints its graph and guesses on failure; the error says what matters."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            # torch's own deprecations inside export (pytree internals), not the user's
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def _export_failure(module, error: Exception) -> str:
    """torch.export's reason in a sentence, with the user's line."""
    text = str(error)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    where = _user_line(text)
    dependent = "data-dependent" in text or "data dependent" in text
    kind = "data-dependent control flow (a Python branch on a tensor's value)" if dependent else "torch.export failed"
    return f"cannot capture {type(module).__name__} with torch.export: {kind}: {first}" + (
        f"\n  at {where}" if where else "") + (_config_hint(module, where or "") if dependent else "")


def _config_hint(module, where: str) -> str:
    """The configuration option of a Hugging Face model that chose a form
    torch.export cannot capture, and the value that it can, judged by the
    line that branched (`where`) and the model's modules."""
    configs = [c for c in (getattr(sub, "config", None) for sub in module.modules()) if c is not None]
    if "layerdrop" in where:
        options = sorted({f"{k} = {v}" for c in configs for k, v in vars(c).items()
                       if "layerdrop" in k and isinstance(v, float) and v > 0})
        if options:
            return (f"\n  the model's config sets {', '.join(options)} (LayerDrop: a layer is skipped when a random "
                    "draw falls below it, a branch on a tensor's value): set it to 0 to train it with sbpc, "
                    "whose plans fix the step's layers ahead")
    has_experts = any(type(sub).__name__.endswith("Experts") for sub in module.modules())
    if has_experts and any(getattr(c, "_experts_implementation", None) == "eager" for c in configs):
        return ("\n  the model's experts run as config._experts_implementation = 'eager' (a Python loop over "
                "the experts the batch routes to): set it to 'grouped_mm' (transformers' default) or "
                "'batched_mm'")
    return ""


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def _user_line(trace: str) -> str | None:
    """The last frame of a PyTorch stack trace outside torch and sbpc: the user's line."""
    frames = [m for m in _FRAME.finditer(trace or "") if not _is_library_file(m.group(1))]
    if not frames:
        return None
    file, line, func, code = frames[-1].groups()
    return f"{file}:{line} in {func}: {code.strip()}"


def _is_library_file(file: str) -> bool:
    """Whether a frame's file is torch's or sbpc's own code (or generated:
    `<eval_with_key>`), decided by where those packages are installed: a
    user's code under a folder that happens to be named `sbpc` or `torch` (a
    clone of this repository, a virtual environment in it) is the user's."""
    if file.startswith("<"):
        return True
    folder = os.path.dirname(os.path.realpath(file))
    return any(folder == d or folder.startswith(d + os.sep) for d in _library_dirs())


def _library_dirs() -> set[str]:
    """The directory of the installed torch package and those of sbpc's
    loaded modules (sbpc's layers live in folders of their own: sbpc.dialects
    in dialects/, and so on; a frame in a trace is of a loaded module)."""
    files = [getattr(module, "__file__", None) for name, module in list(sys.modules.items())
             if name.partition(".")[0] == "sbpc"]
    files.append(getattr(sys.modules.get("torch"), "__file__", None))
    return {os.path.realpath(os.path.dirname(file)) for file in files if file}


def _register_caches(module) -> None:
    """Hugging Face's caches as pytree nodes, as its own exporter registers
    them: a decoder built with `use_cache` (its config's default) returns a
    `DynamicCache` beside its loss and logits, which `torch.export` cannot
    return otherwise. The importer leaves the cache out of the graph."""
    if "transformers" not in sys.modules:
        return
    try:
        from transformers import PreTrainedModel
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:  # another transformers: its caches stay unregistered, and export says so
        return
    for m in module.modules():
        if isinstance(m, PreTrainedModel):
            register_cache_pytrees_for_model(m)
            return
