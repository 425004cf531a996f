"""Sharded checkpoints: each rank writes the pieces it holds, and any plan of
the same graph reads them back.

A checkpoint is a directory:
- `rank-<r>.safetensors`: the pieces rank r wrote, one tensor per array
  (parameters, optimizer state, the RNG's seed and step: every persistent
  register), under the array's name;
- `index.json`: for every array its global shape and dtype, the layout that
  saved it (informative), and its pieces (file, and [start, stop) per axis);
  the graph's fingerprint (its arrays' names, shapes and dtypes).

Saving gathers nothing: a rank writes its own pieces, ZeRO's and FSDP's
shards where they live. A replicated piece is written once, by one of the
ranks that hold it, chosen by the array's name (`writes_piece`). Loading is
boxing from the layout that saved to the one that loads, done by reading:
each rank reads, from each saved piece that overlaps its own, only the
overlap (safetensors reads a slice's bytes through a memory map). Bytes
move; nothing is rounded or summed, so a checkpoint reloads bit for bit
on any plan.

Before a checkpoint is used, its pieces are checked to tile every array
exactly, with no gap and no overlap: a piece saved at wrong offsets (the
bug that silently corrupted PyTorch DCP and Megatron checkpoints) is
refused, not loaded.

The pieces and then the index are written into a temporary directory
beside the target, which is then swapped in (Linux: renameat2 with
RENAME_EXCHANGE, atomic; elsewhere two renames): a crash at any point,
a rank killed mid-write included, leaves the previous checkpoint whole.
The directory must be one every rank sees (a shared file system across
hosts), as for PyTorch DCP.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np

from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.pieces import Region, intersect, mesh_coord, region_shape, region_size, relative
from sbpc.dialects.sbp import DTensorType, Mesh, Sbp, nd_to_plain

FORMAT = "sbpc.sharded-checkpoint"
VERSION = 1
INDEX = "index.json"

Types = Mapping[str, tuple[tuple[int, ...], np.dtype]]
"""Array name -> (global shape, dtype): what a plan holds."""
Piece = tuple[str, list[int], list[int]]
"""(file, start, stop) of one saved piece of an array."""
Written = tuple[str, list[Piece]]
"""What one rank wrote: its file, and (array, start, stop) of each piece in it."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded here, with what is wrong."""


def piece_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"


def fingerprint(types: Types) -> str:
    """The graph's arrays' names, shapes and dtypes, hashed: the same for
    every plan of one graph."""
    text = json.dumps([[name, list(shape), str(dtype)] for name, (shape, dtype) in sorted(types.items())])
    return hashlib.sha256(text.encode()).hexdigest()


def writes_piece(t: DTensorType, mesh: Mesh, rank: int, name: str) -> bool:
    """Whether `rank` is the one that writes its piece of array `name` (of
    type `t`): the piece is held alike by every rank that differs from it
    only along the mesh axes the array is replicated on, and one of those
    replicas writes it, chosen by the array's name, so that replicated
    arrays spread over the replicas' files (as DCP's planner spreads them)
    and every replica chooses alike without a word."""
    coord = mesh_coord(mesh, rank)
    replica, replicas = 0, 1
    for axis, text in enumerate(nd_to_plain(t.nd_sbp)):
        sbp = Sbp.of(text)
        if sbp.is_partial:  # not met: sbp-infer gives persistent registers no partial sums
            raise CheckpointError(f"an array of type {t} holds partial sums: its pieces cannot be saved as they are")
        if not sbp.is_split:
            replica, replicas = replica * mesh.shape[axis] + coord[axis], replicas * mesh.shape[axis]
    return replica == zlib.crc32(name.encode()) % replicas


def layout_of(t: DTensorType, mesh: Mesh) -> dict:
    return {"sbp": list(nd_to_plain(t.nd_sbp)), "mesh": list(mesh.shape), "ranks": list(mesh.ranks)}


# -- writing -------------------------------------------------------------------


def write_pieces(folder: str | os.PathLike, rank: int, pieces: Iterable[tuple[str, Region, np.ndarray]]) -> Written:
    """Writes (name, region, values) pieces as this rank's file (none when
    there is nothing to write: every piece it holds is another replica's to
    write) and returns the file's name and (name, start, stop) of each."""
    from safetensors.numpy import save_file

    tensors, entries = {}, []
    for name, region, values in pieces:
        if region_size(region) == 0 and region:  # a split over more devices than elements: an empty piece
            continue
        tensors[name] = np.ascontiguousarray(values).reshape(region_shape(region))  # (a scalar's register is [1])
        entries.append((name, [s.start for s in region], [s.stop for s in region]))
    file = piece_file(rank)
    if tensors:
        path = os.path.join(folder, file)
        save_file(tensors, path)
        os.chmod(path, 0o666 & ~_umask())  # (safetensors creates it 0600; the umask decides, as for the index)
        _fsync(path)
    return file, entries


def write_index(folder: str | os.PathLike, types: Types, layouts: Mapping[str, dict],
                written: Iterable[Written]) -> None:
    """The index of what the ranks wrote (each rank's (file, entries)),
    after checking that the pieces tile every array."""
    pieces: dict[str, list[Piece]] = {name: [] for name in types}
    for file, entries in written:
        for name, start, stop in entries:
            pieces[name].append((file, start, stop))
    arrays = {}
    for name, (shape, dtype) in sorted(types.items()):
        _check_tiling(name, shape, pieces[name], "saved")
        arrays[name] = {"shape": list(shape), "dtype": str(dtype), "layout": layouts[name],
                        "pieces": [{"file": f, "start": a, "stop": b} for f, a, b in sorted(pieces[name])]}
    index = {"format": FORMAT, "version": VERSION, "fingerprint": fingerprint(types), "arrays": arrays}
    path = os.path.join(folder, INDEX)
    with open(path, "w") as f:
        json.dump(index, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def writing(target: str | os.PathLike) -> Iterator[str]:
    """A temporary directory beside `target` to write a checkpoint into;
    swapped in for `target` when the block ends normally, removed when it
    raises. An existing `target` must be a checkpoint (it is replaced)."""
    target = os.path.abspath(os.fspath(target))
    if os.path.lexists(target) and not (os.path.isdir(target) and
                                        (os.path.exists(os.path.join(target, INDEX)) or not os.listdir(target))):
        raise CheckpointError(f"{target!r} exists and is not a checkpoint: not replacing it")
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.saving-", dir=parent)
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # (mkdtemp's 0700: the umask decides, as for a plain directory)
        yield tmp
        _fsync(tmp)
        _swap_in(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, for
    a moment, for every thread): Linux reports it in /proc/self/status."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _swap_in(tmp: str, target: str) -> None:
    """Puts the written directory `tmp` at `target`; what was at `target`
    ends at `tmp` (removed after)."""
    if not os.path.lexists(target):
        os.rename(tmp, target)
    elif not _exchange(tmp, target):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
        os.rename(target, os.path.join(old, "previous"))  # the one moment without a checkpoint at `target`
        os.rename(tmp, target)
        os.rename(old, tmp)
    _fsync(os.path.dirname(target))


def _exchange(a: str, b: str) -> bool:
    """Swaps two paths at once (Linux's renameat2 RENAME_EXCHANGE); False
    where the system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, rename_exchange = -100, 2
    done = renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange)
    return done == 0


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading -------------------------------------------------------------------


def read_index(folder: str | os.PathLike, types: Types) -> dict[str, list[Piece]]:
    """The pieces of every array a plan with `types` holds, from a
    checkpoint checked whole first: its index, that it is of this graph,
    that every file is there with the tensors the index gives, and that the
    pieces tile each array. Raises CheckpointError naming what is wrong."""
    folder = os.fspath(folder)
    where = f"checkpoint {folder!r}"
    if not os.path.isdir(folder):
        raise CheckpointError(f"{where}: no such directory")
    try:
        with open(os.path.join(folder, INDEX)) as f:
            index = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{where} has no {INDEX}: not a checkpoint, or one whose save never finished") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{where}: {INDEX} is not valid JSON ({e})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise CheckpointError(f"{where}: {INDEX} is not an sbpc checkpoint index")
    if index.get("version") != VERSION:
        raise CheckpointError(f"{where} has format version {index.get('version')!r}; this sbpc reads {VERSION}")
    arrays = index.get("arrays")
    if not isinstance(arrays, dict):
        raise CheckpointError(f"{where}: {INDEX} lists no arrays")
    _check_same_graph(where, arrays, types)
    pieces: dict[str, list[Piece]] = {}
    for name in types:
        try:
            pieces[name] = [(p["file"], list(p["start"]), list(p["stop"])) for p in arrays[name]["pieces"]]
        except (KeyError, TypeError):
            raise CheckpointError(f"{where}: {INDEX} gives no readable pieces for {name!r}") from None
        _check_tiling(name, types[name][0], pieces[name], where)
    _check_files(folder, where, pieces, types)
    return pieces


def _check_same_graph(where: str, arrays: dict, types: Types) -> None:
    def described(shape, dtype) -> str:
        return f"{dtype}{list(shape)}"

    for name in sorted(set(arrays) | set(types)):
        if name not in types:
            raise CheckpointError(f"{where} is of another graph: it has {name!r}, which this plan does not")
        if name not in arrays:
            raise CheckpointError(f"{where} is of another graph: it lacks {name!r}")
        shape, dtype = types[name]
        entry = arrays[name]
        saved = (tuple(entry.get("shape", ())), str(entry.get("dtype")))
        if saved != (tuple(shape), str(dtype)):
            raise CheckpointError(f"{where} is of another graph: {name!r} is {described(*saved)} there, "
                                  f"{described(shape, dtype)} here")


def _check_tiling(name: str, shape: tuple[int, ...], pieces: list[Piece], where: str) -> None:
    """Every element of the array in exactly one piece, every piece inside it."""
    regions = []
    for file, start, stop in pieces:
        if len(start) != len(shape) or len(stop) != len(shape) or not all(
                0 <= a < b <= n for a, b, n in zip(start, stop, shape)):
            raise CheckpointError(f"{where}: the piece of {name!r} in {file} at {start}..{stop} does not lie "
                                  f"inside its shape {list(shape)}")
        regions.append(tuple(slice(a, b) for a, b in zip(start, stop)))
    for i, a in enumerate(regions):
        for b in regions[i + 1:]:
            if intersect(a, b) is not None:
                raise CheckpointError(f"{where}: pieces of {name!r} overlap ({_text(a)} and {_text(b)})")
    covered = sum(region_size(r) for r in regions)
    if covered != math.prod(shape):
        raise CheckpointError(f"{where}: the pieces of {name!r} cover {covered} of its {math.prod(shape)} elements")


def _text(region: Region) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in region) + "]"


def _check_files(folder: str, where: str, pieces: Mapping[str, list[Piece]], types: Types) -> None:
    """Every piece file is there, readable, and holds each piece the index
    gives it with its shape and dtype (headers only: no tensor is read)."""
    from safetensors import safe_open

    by_file: dict[str, list[Piece]] = {}
    for name, found in sorted(pieces.items()):
        for file, start, stop in found:
            by_file.setdefault(file, []).append((name, start, stop))
    for file, held in sorted(by_file.items()):
        path = os.path.join(folder, file)
        if os.path.basename(file) != file:
            raise CheckpointError(f"{where}: {INDEX} names a piece file outside the checkpoint: {file!r}")
        if not os.path.exists(path):
            raise CheckpointError(f"{where} is torn: {file}, with pieces of {held[0][0]!r}"
                                  f"{f' and {len(held) - 1} more arrays' if len(held) > 1 else ''}, is missing")
        try:
            with safe_open(path, framework="numpy") as f:
                keys = set(f.keys())
                for name, start, stop in held:
                    if name not in keys:
                        raise CheckpointError(f"{where} is torn: {file} lacks its piece of {name!r}")
                    piece = f.get_slice(name)
                    shape = [b - a for a, b in zip(start, stop)]
                    if list(piece.get_shape()) != shape or _dtype_name(piece.get_dtype()) != str(types[name][1]):
                        raise CheckpointError(
                            f"{where}: {file} holds {name!r} as {piece.get_dtype()}{list(piece.get_shape())}, its "
                            f"index says {types[name][1]}{shape}")
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - safetensors' own errors (a truncated or garbled file)
            raise CheckpointError(f"{where} is torn: {file} cannot be read ({e})") from None


SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32",
                      "U16": "uint16", "U8": "uint8", "BOOL": "bool"}


def _dtype_name(safetensors_dtype: str) -> str:
    return SAFETENSORS_DTYPES.get(safetensors_dtype, safetensors_dtype)


def read_pieces(folder: str | os.PathLike, pieces: Mapping[str, list[Piece]],
                wanted: Iterable[tuple[str, Region, np.dtype]],
                tensors: Mapping[str, str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Each wanted (name, region, dtype) filled from the saved pieces that
    overlap it, reading only the overlaps (cast to `dtype` where the file's
    differs: a bfloat16 checkpoint into a float32 model, as `from_pretrained`
    does); the checkpoint was checked by `read_index` or `hf_weights`. An
    array is the file's tensor `tensors[name]` (default: its own name)."""
    tensors = tensors or {}
    from safetensors import safe_open

    with contextlib.ExitStack() as files:
        opened: dict[str, object] = {}

        def open_file(file: str):
            if file not in opened:
                opened[file] = files.enter_context(safe_open(os.path.join(folder, file), framework="numpy"))
            return opened[file]

        for name, region, dtype in wanted:
            local = np.empty(region_shape(region), dtype)
            for file, start, stop in pieces[name]:
                saved = tuple(slice(a, b) for a, b in zip(start, stop))
                overlap = intersect(region, saved)
                if overlap is None:
                    continue
                f = open_file(file)
                tensor = tensors.get(name, name)
                # a whole piece at once; else only the overlap's bytes
                local[relative(overlap, region)] = (f.get_tensor(tensor) if overlap == saved
                                                    else f.get_slice(tensor)[relative(overlap, saved)])
            yield name, local


# -- a rank's side --------------------------------------------------------------


def save_rank(executor, folder: str) -> Written:
    """Writes the pieces this rank is the writer of (see `writes_piece`)."""
    def pieces():
        for key, name in executor.held_params():
            t = executor.registers[name].value
            if writes_piece(t, executor.mesh(t), executor.rank, key):
                yield key, executor.piece_of(t), executor.param_view(name)

    return write_pieces(folder, executor.rank, pieces())


def load_rank(executor, folder: str, pieces: Mapping[str, list[Piece]],
              tensors: Mapping[str, str] | None = None) -> None:
    """Reads this rank's piece of every array of `pieces` it holds (each
    register of it): a checkpoint's every array, a model file's weights."""
    registers = [(key, name, executor.registers[name].value) for key, name in executor.param_registers()
                 if key in pieces]
    wanted = ((key, executor.piece_of(t), np.dtype(numpy_dtype(t.element_type))) for key, _, t in registers)
    for (_, name, _), (_, local) in zip(registers, read_pieces(folder, pieces, wanted, tensors)):
        executor.write_param_piece(name, local)


def whole(shape: Iterable[int]) -> Region:
    """The region of a whole array."""
    return tuple(slice(0, n) for n in shape)


def whole_pieces(arrays: Mapping[str, np.ndarray]) -> Iterator[tuple[str, Region, np.ndarray]]:
    """Global arrays as one piece each (the interpreter holds them so)."""
    for name, value in arrays.items():
        yield name, whole(value.shape), value


def is_checkpoint_path(path: str | os.PathLike) -> bool:
    """Whether `path` names a sharded checkpoint (a directory) rather than
    the single-file `.npz` one."""
    return not os.fspath(path).endswith(".npz") and not Path(path).is_file()


# -- Hugging Face's layout -------------------------------------------------------

HF_SINGLE = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"


@dataclasses.dataclass(frozen=True)
class Weights:
    """A model's weights in safetensors files, whole tensors under
    state_dict() names (Hugging Face's layout): what the ranks read their
    pieces of, in place of a module's values."""

    folder: str
    pieces: dict[str, list[Piece]]
    """Each parameter's one piece: the whole tensor in its file."""
    tensors: dict[str, str]
    """Each parameter's tensor name in its file."""
    prefix: str = ""
    """What the module's names have before the checkpoint's (a wrapper's `model.`)."""


def hf_files(path: str | os.PathLike) -> tuple[str, dict[str, str]]:
    """The folder and {tensor name: file} of a Hugging Face checkpoint: a
    `.safetensors` file, a sharded one's index, or a directory holding
    either (as `save_pretrained` writes it)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        index = os.path.join(path, HF_INDEX)
        path = index if os.path.exists(index) else os.path.join(path, HF_SINGLE)
    if not os.path.exists(path):
        raise CheckpointError(f"weights {path!r}: no such file (a .safetensors file, {HF_INDEX}, or a directory "
                              "holding either)")
    folder = os.path.dirname(path)
    if path.endswith(".json"):
        try:
            with open(path) as f:
                weight_map = json.load(f)["weight_map"]
            return folder, {str(name): str(file) for name, file in weight_map.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"weights {path!r}: not a safetensors index with a weight_map ({e})") from None
    from safetensors import safe_open

    try:
        with safe_open(path, framework="numpy") as f:
            return folder, dict.fromkeys(f.keys(), os.path.basename(path))
    except Exception as e:  # noqa: BLE001 - safetensors' own errors
        raise CheckpointError(f"weights {path!r} cannot be read ({e})") from None


def tensor_types(folder: str, files: Mapping[str, str], names: Iterable[str]) -> dict[str, tuple[tuple[int, ...], str]]:
    """(shape, dtype name) of the named tensors, from their files' headers."""
    from safetensors import safe_open

    by_file: dict[str, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    found = {}
    for file, held in sorted(by_file.items()):
        path = os.path.join(folder, file)
        if os.path.basename(file) != file or not os.path.exists(path):
            raise CheckpointError(f"weights in {folder!r}: {file!r}, which holds {held[0]!r}, is missing")
        try:
            with safe_open(path, framework="numpy") as f:
                for name in held:
                    piece = f.get_slice(name)
                    found[name] = (tuple(piece.get_shape()), _dtype_name(piece.get_dtype()))
        except Exception as e:  # noqa: BLE001 - safetensors' own errors
            raise CheckpointError(f"weights in {folder!r}: {file} cannot be read ({e})") from None
    return found


def write_hf_shards(folder: str, names: Mapping[str, str], sizes: Mapping[str, int],
                    value: Callable[[str], np.ndarray], max_shard_size: int) -> None:
    """Writes tensors in Hugging Face's layout: {file name: our name} of
    `sizes[our name]` bytes each, `value(our name)` fetched one shard at a
    time; files of an earlier save that this one does not write are removed."""
    from safetensors.numpy import save_file

    shards: list[list[str]] = [[]]
    filled = 0
    for name in sorted(names):
        size = sizes[names[name]]
        if shards[-1] and filled + size > max_shard_size:
            shards.append([])
            filled = 0
        shards[-1].append(name)
        filled += size
    count = len(shards)
    files = [HF_SINGLE] if count == 1 else [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)]
    for file, shard in zip(files, shards):
        path = os.path.join(folder, file)
        tmp = os.path.join(folder, f".{file}.saving")
        save_file({name: np.ascontiguousarray(value(names[name])) for name in shard}, tmp, metadata={"format": "pt"})
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    index = os.path.join(folder, HF_INDEX)
    if count > 1:
        weight_map = {name: file for file, shard in zip(files, shards) for name in shard}
        with open(index + ".saving", "w") as f:
            json.dump({"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}, f, indent=2)
        os.replace(index + ".saving", index)
    elif os.path.exists(index):
        os.unlink(index)
    for stale in os.listdir(folder):
        if stale.endswith(".safetensors") and stale.startswith("model") and stale not in files:
            os.unlink(os.path.join(folder, stale))
