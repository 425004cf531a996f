"""sbpc's IR, the bottom layer: one dialect per file (`lg` the logical
graph, `sbp` distributed tensors, placements and collectives, `plan` the
physical actor plan) and the layout geometry the `sbp` dialect defines
(`pieces`: pieces, balanced splits, mesh coordinates). Nothing here imports
a pass, the runtime or the API."""

import gc
import re
import struct
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.utils.lexer import Input, Span
from xdsl.utils.mlir_lexer import MLIRLexer

from .lg import LG
from .plan import PLAN
from .sbp import SBP

# xDSL 0.74 lexes a string literal with `"(?:[^"\\...]+|\\...)*"`: a run of
# characters under two nested quantifiers, which backtracks exponentially
# over a long run with no closing quote on its line (a mutant with a
# 5000-character name stopped sbp-opt for minutes). Without the inner `+`
# it matches the same strings, one character per step, and fails in
# linear time (the alternatives never start with the same character).
MLIRLexer._unescaped_characters_regex = re.compile(r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"')


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pauses Python's cyclic garbage collector while IR is built and
    rewritten (passes, a compile, sbp-opt). A pass makes and drops ops by
    the ten thousand, and every op and value points at its parent, so the
    collector's full collections walked the whole, growing IR again and
    again: a third of compiling a 10k-op graph (4.5 s against 3.1 s
    paused). The dropped ops wait for the collections after it, so the
    peak memory is higher (140 against 111 MB there). Nested pauses resume
    only at the outermost."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def make_context() -> Context:
    """A context with the builtin, `lg`, `sbp` and `plan` dialects loaded."""
    ctx = Context()
    for dialect in (Builtin, LG, SBP, PLAN):
        ctx.load_dialect(dialect)
    return ctx


def parse_text(ctx: Context, text: str | bytes, name: str, implicit_module: bool = True) -> ModuleOp:
    """Parses textual IR, turning the errors xDSL 0.74 lets escape its parser
    into a ParseError at the place they arose: an integer array element out
    of its type's range (`mesh [2, -9223372036854775809]`) fails in
    `struct.pack` after the array is read."""
    if isinstance(text, bytes):
        text = _utf8(text, name)
    parser = Parser(ctx, text, name)
    try:
        return parser.parse_module(implicit_module)
    except (struct.error, OverflowError):
        parser.raise_error(*_out_of_range(parser))
    except AssertionError as error:
        # xDSL 0.74 asserts on some literals instead of reporting them (a
        # float `dense<...>` of complex type); an assertion of our own code
        # stays a bug and keeps its traceback.
        if not _raised_in_xdsl_parser(error):
            raise
        parser.raise_error("xDSL cannot read the literal before this point for its type")
    except VerifyException as error:
        # An attribute or property checked while its op is parsed (an integer
        # beyond its type's range, an attribute of the wrong kind) fails with
        # no location; the parser is just past it.
        if getattr(error, "__notes__", None):
            raise
        parser.raise_error(str(error))


def _utf8(data: bytes, name: str) -> str:
    """`data` as text, or a ParseError at the first byte that is not UTF-8
    (a file with a flipped bit ended sbp-opt in a UnicodeDecodeError)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        shown = data.decode("utf-8", errors="replace")
        at = len(data[: error.start].decode("utf-8", errors="replace"))
        raise ParseError(Span(at, at + 1, Input(shown, name)),
                         f"the input is not UTF-8 text: byte 0x{data[error.start]:02x} ({error.reason})") from None


def _out_of_range(parser: Parser) -> tuple[str, Span]:
    """The message and place of the integer array element that failed to
    pack: the last integer literal before the parser's position that fits in
    no 64-bit integer."""
    text = parser.lexer.input.content
    end = parser.pos
    for m in reversed(list(_INTEGER.finditer(text, 0, end))):
        if not m.group()[0].isdigit() and m.group()[0] != "-":
            continue  # a comment or a string
        value = int(m.group())
        if not -(2**63) <= value < 2**64:
            return f"integer {value} is out of range for a 64-bit array element", Span(
                m.start(), m.end(), parser.lexer.input
            )
    return "an integer array holds a value out of range for its element type", Span(end, end, parser.lexer.input)


_INTEGER = re.compile(r'//[^\n]*|"(?:[^"\\]|\\.)*"|(?<![\w.])-?\d+(?![\w.])')


def _raised_in_xdsl_parser(error: BaseException) -> bool:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return "xdsl" in Path(frame.filename).parts and "parser" in Path(frame.filename).parts


def verify_module(module: Operation) -> None:
    """`module.verify()`, with every failure pointing at its op: xDSL raises
    the checks that belong to no op's verifier (an op other than a
    terminator ending a block, `Operation lg.add terminates block ...`)
    without marking the op in the printed IR, as it does for the others."""
    try:
        module.verify()
    except VerifyException as error:
        raise locate(module, error) from None


def locate(module: Operation, error: DiagnosticException) -> DiagnosticException:
    """`error` with the IR printed and its op marked, the form xDSL gives an
    op's own verifier failure, when it has no such notes yet: the op is the
    first whose checks alone (not its nested ops') fail."""
    if getattr(error, "__notes__", None):
        return error
    for op in module.walk():
        try:
            op.verify(verify_nested_ops=False)
        except VerifyException as found:
            try:
                op.emit_error(str(found), found)
            except DiagnosticException as located:
                return located
    return error


def parse_module(text: str, name: str = "<string>", verify: bool = True) -> ModuleOp:
    """Parses (and by default verifies) textual IR into a module."""
    module = parse_text(make_context(), text, name)
    if verify:
        verify_module(module)
    return module
