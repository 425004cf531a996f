"""Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray, "Fast
Algorithms for Convolutional Neural Networks", 2015) as host C: the
transforms of a 3x3 stride-1 convolution, between which the runtime
multiplies with BLAS (runtime/winograd_kernels.py).

Each 2x2 tile of a channel's output is A^T [(G g G^T) . (B^T d B)] A,
summed over the input channels, where d is the 4x4 tile of the padded
input under it and g the 3x3 filter: the sum over channels of the 16
elementwise products is 16 GEMMs, (K, C) filters times (C, tiles)
inputs, with 16 multiplies per tile and channel pair where the direct
convolution (im2col) takes 36. The weight's gradient uses the same
identity backwards: dU = sum over tiles of (A dY A^T) . (B^T d B), 16
GEMMs (K, tiles) times (tiles, C), then dW = G^T dU G.

The transforms' matrices hold 0, +-1 and +-1/2 only, so each is a few
additions per element (written out below, rows first, then columns). The
functions take their shapes at run time (`dims`, int64), so one library
per element type serves every layer, and images a range of the batch at a
time (dims[0], dims[1]) for GEMMs per image. Layouts, for C channels and
`cols` = tiles of the call's images, tile index (image, tile row, tile
column): V (16, C, cols), U (16, K, C/G) or, transposed for a transposed
convolution, (16, G, C/G, K/G), M and Z (16, K, cols)."""

from __future__ import annotations

from .render import IVDEP as _IVDEP
from .render import Kernel

FLIP = (3, 1, 2, 0)
"""G flip(g) G^T = P (G g G^T) P^T, P swapping rows 0 and 3 of four: a
flipped filter's transform is the filter's with its taps 0 and 3 swapped
on both axes (the gradient for the input flips the filters)."""


def _rows_then_columns(rows: list[str], columns: list[str], src: str, dst: str, size: int) -> str:
    """C that sets dst{i}{j} (4x4, or 3x3) from src{i}{j} by the transform
    whose output row r is `rows[r]` (an expression over src rows s0, s1...)
    applied on both axes: rows first into t{r}{j}, then columns."""
    lines = []
    for r, expr in enumerate(rows):
        for j in range(size):
            lines.append(f"T t{r}{j} = {_at(expr, src, 'R', j)};")
    for r in range(len(rows)):
        for c, expr in enumerate(columns):
            lines.append(f"T {dst}{r}{c} = {_at(expr, 't', 'C', r)};")
    return "\n".join(lines)


def _at(expr: str, name: str, axis: str, index: int) -> str:
    """expr over s0..s3 with s_k read as name[k][index] (rows) or name[index][k]."""
    out = expr
    for k in range(4):
        out = out.replace(f"s{k}", f"{name}{k}{index}" if axis == "R" else f"{name}{index}{k}")
    return out


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


B_T = ["s0 - s2", "s1 + s2", "s2 - s1", "s1 - s3"]
"""B^T's rows: the input tile's transform."""
G_ROWS = ["s0", "(s0 + s1 + s2) * (T)0.5", "(s0 - s1 + s2) * (T)0.5", "s2"]
"""G's rows: the filter's transform (3 taps to 4)."""
A_T = ["s0 + s1 + s2", "s1 - s2 - s3"]
"""A^T's rows: the output tile's transform (4 to 2)."""
A_ROWS = ["s0", "s0 + s1", "s0 - s1", "-s1"]
"""A's rows: the output gradient's transform (2 to 4), A dY A^T."""
G_T = ["s0 + (s1 + s2) * (T)0.5", "(s1 - s2) * (T)0.5", "(s1 + s2) * (T)0.5 + s3"]
"""G^T's rows: the filter gradient's transform (4 to 3), G^T dU G."""


ROW_TILES = 8
"""Planes this many tiles wide or wider go a tile row at a time, the loop
over the row's tiles reading (or writing) every other element, which
vectorizes by shuffles; narrower planes go in one loop over all their
tiles, each at its precomputed place (`base`), which vectorizes by
gathers and scatters: ResNet's 64 channels of 56x56, batch 8, took 3.2
ms to transform its input by gathers (one core of a 2-core Intel Xeon,
2026-12-01); rows of 7 tiles or fewer leave a row loop unvectorized."""


def _tile_loops(tile: str) -> str:
    """C running `tile` (statements over the tile's index `t` and its first
    element `at` in the work plane, of row length `wrow`) over a plane's
    tiles: row by row where they are ROW_TILES wide, else in one loop."""
    return f"""if (tw >= {ROW_TILES}) {{
  for (long ty = 0; ty < th; ++ty) {{
    {_IVDEP}
    for (long tx = 0; tx < tw; ++tx) {{
      const long t = ty * tw + tx, at = 2 * ty * wrow + 2 * tx;
{_indent(tile, 6)}
    }}
  }}
}} else {{
  {_IVDEP}
  for (long t = 0; t < tiles; ++t) {{
    const long at = base[t];
{_indent(tile, 4)}
  }}
}}"""


_INPUT_TILE = "\n".join([
    *(f"T d{i}{j} = work[at + {i} * wrow + {j}];" for i in range(4) for j in range(4)),
    _rows_then_columns(B_T, B_T, "d", "e", 4),
    *(f"out[{i * 4 + j} * apart + t] = e{i}{j};" for i in range(4) for j in range(4))])
_OUTPUT_TILE = "\n".join([
    *(f"T m{i}{j} = in[{i * 4 + j} * apart + t];" for i in range(4) for j in range(4)),
    _rows_then_columns(A_T, A_T, "m", "o", 4),
    "work[at] = o00; work[at + 1] = o01; work[at + wrow] = o10; work[at + wrow + 1] = o11;"])
_GRADIENT_TILE = "\n".join([
    "T q00 = work[at], q01 = work[at + 1], q10 = work[at + wrow], q11 = work[at + wrow + 1];",
    _rows_then_columns(A_ROWS, A_ROWS, "q", "e", 2),
    *(f"out[{i * 4 + j} * apart + t] = e{i}{j};" for i in range(4) for j in range(4))])


INPUT_TRANSFORM = f"""  /* dims: first image, end image, C, H, W, padding top, padding left, tile rows, tile columns,
     the distance between the 16 matrices of v;
     base: each tile's first element in a padded plane; work: a padded plane (2 th + 2) x (2 tw + 2) */
  const long n0 = dims[0], n1 = dims[1], C = dims[2], H = dims[3], W = dims[4], ph = dims[5], pw = dims[6];
  const long th = dims[7], tw = dims[8], tiles = th * tw, cols = (n1 - n0) * tiles, apart = dims[9];
  const long hp = 2 * th + 2, wp = 2 * tw + 2, wrow = wp;
  const long left = pw < wp ? pw : wp, right = pw + W < wp ? pw + W : wp;  /* the image's columns in a row */
  for (long n = n0; n < n1; ++n)
    for (long c = 0; c < C; ++c) {{
      const T* img = images + (n * C + c) * H * W;
      for (long y = 0; y < hp; ++y) {{  /* the plane padded, in cache for its tiles */
        T* row = work + y * wp;
        long iy = y - ph;
        if (iy < 0 || iy >= H) {{ for (long x = 0; x < wp; ++x) row[x] = 0; continue; }}
        for (long x = 0; x < left; ++x) row[x] = 0;
        for (long x = left; x < right; ++x) row[x] = img[iy * W + x - pw];
        for (long x = right; x < wp; ++x) row[x] = 0;
      }}
      T* out = v + c * cols + (n - n0) * tiles;
{_indent(_tile_loops(_INPUT_TILE), 6)}
    }}"""

OUTPUT_TRANSFORM = f"""  /* dims: first image, end image, K, Ho, Wo, tile rows, tile columns, the distance between
     the 16 matrices; base: each tile's first element in a plane of whole tiles; work: such a plane (2 th) x (2 tw) */
  const long n0 = dims[0], n1 = dims[1], K = dims[2], Ho = dims[3], Wo = dims[4], th = dims[5], tw = dims[6];
  const long tiles = th * tw, cols = (n1 - n0) * tiles, apart = dims[7], wq = 2 * tw, wrow = wq;
  for (long n = n0; n < n1; ++n)
    for (long k = 0; k < K; ++k) {{
      const T* in = m + k * cols + (n - n0) * tiles;
{_indent(_tile_loops(_OUTPUT_TILE), 6)}
      T* plane_out = y + (n * K + k) * Ho * Wo;
      for (long r = 0; r < Ho; ++r)
        for (long x = 0; x < Wo; ++x) plane_out[r * Wo + x] = work[r * wq + x];
    }}"""

FILTER_TRANSFORM = f"""  /* dims: K, C/G, G, transposed and flipped (the gradient for the input: 1), the distance
     between the 16 matrices of u */
  const long K = dims[0], CG = dims[1], G = dims[2], flip = dims[3], KG = K / G, apart = dims[4];
  for (long k = 0; k < K; ++k) {{
    /* (16, K, C/G); flipped, (16, G, C/G, K/G) with each group's filters transposed */
    const long at = flip ? (k / KG) * CG * KG + k % KG : k * CG, step = flip ? KG : 1;
    static const long flipped[16] = {{{", ".join(str(FLIP[t // 4] * 4 + FLIP[t % 4]) for t in range(16))}}};
    T* o[16];  /* each transformed tap's row of filters */
    for (long t = 0; t < 16; ++t) o[t] = u + (flip ? flipped[t] : t) * apart + at;
    {_IVDEP}
    for (long c = 0; c < CG; ++c) {{
      const T* f = w + (k * CG + c) * 9;
{_indent(chr(10).join(f"T g{i}{j} = f[{i * 3 + j}];" for i in range(3) for j in range(3)), 6)}
{_indent(_rows_then_columns(G_ROWS, G_ROWS, "g", "e", 3), 6)}
{_indent(chr(10).join(f"o[{i * 4 + j}][c * step] = e{i}{j};" for i in range(4) for j in range(4)), 6)}
    }}
  }}"""

GRADIENT_TRANSFORM = f"""  /* dims: first image, end image, K, Ho, Wo, tile rows, tile columns, the distance between
     the 16 matrices; base: each tile's first element in a plane of whole tiles; work: such a plane (2 th) x (2 tw) */
  const long n0 = dims[0], n1 = dims[1], K = dims[2], Ho = dims[3], Wo = dims[4], th = dims[5], tw = dims[6];
  const long tiles = th * tw, cols = (n1 - n0) * tiles, apart = dims[7], wq = 2 * tw, wrow = wq;
  for (long x = 0; x < 2 * th * wq; ++x) work[x] = 0;  /* zero past the output, kept so */
  for (long n = n0; n < n1; ++n)
    for (long k = 0; k < K; ++k) {{
      const T* plane_in = dy + (n * K + k) * Ho * Wo;
      for (long r = 0; r < Ho; ++r)
        for (long x = 0; x < Wo; ++x) work[r * wq + x] = plane_in[r * Wo + x];
      T* out = z + k * cols + (n - n0) * tiles;
{_indent(_tile_loops(_GRADIENT_TILE), 6)}
    }}"""

FILTER_GRADIENT_TRANSFORM = f"""  /* dims: K, C/G, the distance between the 16 matrices of du */
  const long K = dims[0], CG = dims[1], apart = dims[2];
  for (long k = 0; k < K; ++k)
    for (long c = 0; c < CG; ++c) {{
      const long at = k * CG + c;
{_indent(chr(10).join(f"T s{i}{j} = du[{i * 4 + j} * apart + at];" for i in range(4) for j in range(4)), 6)}
{_indent(_rows_then_columns(G_T, G_T, "s", "e", 4), 6)}
      T* f = dw + at * 9;
{_indent(chr(10).join(f"f[{i * 3 + j}] = e{i}{j};" for i in range(3) for j in range(3)), 6)}
    }}"""


def kernels(t: str) -> dict[str, Kernel]:
    """The five transforms for element type `t` (a C type), by role. Host
    only: the CUDA backend convolves by its own kernels."""
    made = {
        "input": (("const T* images", "const int64_t* dims", "const int32_t* base", "T* work", "T* v"),
                  INPUT_TRANSFORM),
        "output": (("const T* m", "const int64_t* dims", "const int32_t* base", "T* work", "T* y"),
                   OUTPUT_TRANSFORM),
        "filter": (("const T* w", "const int64_t* dims", "T* u"), FILTER_TRANSFORM),
        "gradient": (("const T* dy", "const int64_t* dims", "const int32_t* base", "T* work", "T* z"),
                     GRADIENT_TRANSFORM),
        "filter_gradient": (("const T* du", "const int64_t* dims", "T* dw"), FILTER_GRADIENT_TRANSFORM),
    }
    return {role: Kernel(f"winograd_{role}_{t}", t, params, 1, "", restrict=True, host_body=body)
            for role, (params, body) in made.items()}
