"""Complex numbers in imported PyTorch modules
(`sbpc/torch_import/aten/complex_numbers.py`): complex values carried as
their real and imaginary parts, the FFTs as products with the DFT's
matrices. Modules as users write them (FNet's Fourier mixing, a long
convolution by FFT, Meta's LLaMA rotary embedding through `torch.polar`
and `view_as_complex`) train as PyTorch does on 1 rank and data parallel
on 2; float64 transforms agree with PyTorch's to float64 rounding; what
sbpc does not take is refused by name."""

import math

import numpy as np
import pytest

import sbpc
from sbpc import S
from sbpc.torch_frontend import TorchImportError

torch = pytest.importorskip("torch")
nn = torch.nn

from support.torch_training import check_training  # noqa: E402


class SpectralMixer(nn.Module):
    """FNet's token mixing: the real part of the 2-D DFT over the sequence
    and the hidden axis, a residual, a layer norm and a feed-forward."""

    def __init__(self, d=8):
        super().__init__()
        self.embed = nn.Linear(4, d)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, 1)

    def forward(self, x, t):
        h = self.embed(x)
        h = self.norm(h + torch.fft.fftn(h, dim=(1, 2)).real)
        return (self.out(h).squeeze(-1) - t).pow(2).mean()


class FFTConvolution(nn.Module):
    """A long convolution by FFT (Hyena's, S4's): a learned filter as long as
    the sequence, both padded to twice its length, multiplied as spectra."""

    def __init__(self, seq=6, d=4):
        super().__init__()
        self.filter = nn.Parameter(torch.randn(d, seq) * 0.3)
        self.proj = nn.Linear(d, d)

    def forward(self, x, t):
        seq = x.shape[1]
        u = self.proj(x).transpose(1, 2)  # [batch, d, seq]
        spectrum = torch.fft.rfft(u, n=2 * seq) * torch.fft.rfft(self.filter, n=2 * seq)
        y = torch.fft.irfft(spectrum, n=2 * seq, norm="forward")[..., :seq] / (2 * seq)
        return (y.transpose(1, 2) - t).pow(2).mean() + torch.fft.rfft(u, norm="ortho").abs().mean() * 0.1


class InPlaceSpectrum(nn.Module):
    """A spectrum changed in place (`mul_`, `+=`): the complex value written
    is the one later ops read."""

    def __init__(self, d=4):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x, t):
        z = torch.fft.rfft(self.proj(x), dim=1)
        z.mul_(0.5)
        z += torch.fft.rfft(x, dim=1) * 0.25
        return (torch.fft.irfft(z, n=x.shape[1], dim=1) - t).pow(2).mean() + z.abs().mean()


def rotary_frequencies(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """Meta's LLaMA `precompute_freqs_cis`: unit complex numbers by `torch.polar`."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    angles = torch.outer(torch.arange(end).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


class ComplexRotaryAttention(nn.Module):
    """Meta's LLaMA attention as its reference code writes the rotary
    embedding: query and key pairs viewed as complex numbers, multiplied by
    the frequencies (a complex constant), viewed as real again."""

    def __init__(self, d=16, heads=2, seq=8):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.freqs_cis = rotary_frequencies(self.head_dim, seq)

    def rotated(self, x):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        freqs = self.freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, pairs.shape[-1])
        return torch.view_as_real(pairs * freqs).flatten(3).type_as(x)

    def forward(self, x, t):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = self.rotated(q), self.rotated(k)
        scores = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(2, 3)) / math.sqrt(self.head_dim)
        y = (scores.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2).reshape(b, s, -1)
        return (self.wo(y) - t).pow(2).mean()


def batches(shapes, count=5, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(*s, generator=g) for s in shapes) for _ in range(count)]


CASES = {
    "fnet mixing": (SpectralMixer, [(4, 6, 4), (4, 6)]),
    "fft convolution": (FFTConvolution, [(4, 6, 4), (4, 6, 4)]),
    "llama complex rotary": (ComplexRotaryAttention, [(4, 8, 16), (4, 8, 16)]),
    "in-place spectrum": (InPlaceSpectrum, [(4, 6, 4), (4, 6, 4)]),
}


@pytest.mark.parametrize("ranks", [1, 2], ids=["1 rank", "data parallel 2"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_modules_with_complex_values_train_as_pytorch(case, ranks):
    make, shapes = CASES[case]
    torch.manual_seed(0)
    check_training(make(), batches(shapes), ["x", "t"], sbpc.optim.AdamW(lr=1e-2, weight_decay=0.01),
                   lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01), ranks,
                   {"x": S(0), "t": S(0)} if ranks > 1 else None)


@pytest.mark.full
def test_fourier_mixing_trains_as_pytorch_under_the_automatic_plan_on_4():
    torch.manual_seed(0)
    check_training(SpectralMixer(), batches([(4, 6, 4), (4, 6)]), ["x", "t"], sbpc.optim.SGD(lr=0.1),
                   lambda m: torch.optim.SGD(m.parameters(), lr=0.1), 4, plan="auto")


class Transforms(nn.Module):
    """Every FFT form users call, each as its real output or its parts."""

    def forward(self, x):
        return torch.cat([
            torch.view_as_real(torch.fft.fft(x)).flatten(),
            torch.view_as_real(torch.fft.ifft(torch.fft.fft2(x), norm="ortho")).flatten(),
            torch.view_as_real(torch.fft.rfftn(x, norm="forward")).flatten(),
            torch.fft.irfft(torch.fft.rfft(x, n=9), n=9).flatten(),
            torch.fft.irfft2(torch.fft.rfft2(x)).flatten(),
            torch.fft.hfft(torch.fft.rfft(x), n=8).flatten(),
            torch.fft.fft(x).abs().flatten(),
            torch.fft.fft(x).angle().flatten(),
            (torch.fft.rfft(x) / torch.fft.rfft(x + 2.0)).imag.flatten(),
            torch.exp(torch.view_as_complex(x.reshape(3, 5, 4, 2))).real.flatten(),
            torch.view_as_real(torch.fft.fft(x).mean(dim=1) + torch.fft.fft(x).sum(dim=(0, 1))[None]).flatten(),
        ])


def test_float64_transforms_agree_with_pytorchs_to_float64_rounding():
    x = torch.randn(3, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    graph = sbpc.from_torch(Transforms(), (x,), placement=sbpc.placement("cpu", 1))
    got = sbpc.compile(graph, mode="interpret").run({"x": x.numpy()})["output"]
    want = Transforms()(x).numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11 * np.abs(want).max())


class ComplexOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return torch.fft.rfft(self.proj(x))


class LogOfASpectrum(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return torch.view_as_real(torch.fft.rfft(self.proj(x)).log()).sum()


class ComplexWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.weights = nn.Parameter(torch.randn(3, dtype=torch.cfloat))

    def forward(self, x):
        return (torch.fft.rfft(x) * self.weights).abs().sum()


@pytest.mark.parametrize("module, says", [
    (ComplexOutput, "ComplexOutput.forward returns a complex tensor (output); sbpc's outputs are real"),
    (LogOfASpectrum, "the ATen op aten.log (log) on complex numbers has no lowering in sbpc"),
    (ComplexWeights, "parameter 'weights' has dtype torch.complex64, which sbpc does not support"),
], ids=["a complex output", "an op with no complex rule", "a complex parameter"])
def test_what_sbpc_does_not_take_of_complex_numbers_is_refused_by_name(module, says):
    with pytest.raises(TorchImportError) as raised:
        sbpc.from_torch(module(), (torch.randn(2, 4),))
    assert says in str(raised.value)


def test_every_op_taken_part_by_part_has_a_real_rule():
    from sbpc.torch_import.aten.complex_numbers import PARTWISE
    from sbpc.torch_import.aten.registry import COMPLEX_RULES, RULES

    assert RULES.keys() >= PARTWISE
    assert COMPLEX_RULES.keys() >= PARTWISE
