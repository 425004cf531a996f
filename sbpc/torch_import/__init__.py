"""The PyTorch importer behind `sbpc.from_torch` (`sbpc/torch_frontend.py`,
its entry, says what is imported and how). One module per concern:

    values     TorchImportError, the dtypes PyTorch and lg share, `_Const` (a value known at import time),
               `to_numpy`, helpers over nested arguments and ATen op names
    capture    torch.export made quiet, its failures in a sentence, the user's line in a PyTorch stack trace
    state      forward's signature: inputs, parameters (tied ones once), buffers (folded, or state the
               forward updates), the sbp hints matched to their names
    precision  16-bit floats and torch.autocast: the casts around a rule
    importer   `_Importer`: the walk over export's graph, one node at a time, through the rules
    core_aten  PyTorch's Core ATen opset, the decomposition of an op with no rule, the data-dependent ops
    aten       the lowering of each ATen op (`RULES`), one module per op family

Nothing here is imported by a lower layer; torch is imported inside
functions only, so importing the package does not load it.
"""
