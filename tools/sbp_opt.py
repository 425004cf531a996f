"""`sbp-opt`: xDSL's opt driver with sbpc's dialects and passes.

Every xdsl-opt flag works (`-p`, `--split-input-file`, `--verify-diagnostics`,
`--print-op-generic`, `--print-between-passes`, ...). Bad input is reported
as a diagnostic on stderr with exit code 1, never as a Python traceback.
"""

import sys
import warnings

from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    ParseError,
    PassFailedException,
    VerifyException,
)
from xdsl.xdsl_opt_main import xDSLOptMain

from sbpc.dialects import collector_paused, locate, parse_text
from sbpc.tools.universe import SBPC_UNIVERSE


class SbpOptMain(xDSLOptMain):
    def register_all_dialects(self):
        # The base class loads every `xdsl.universe` entry point, which already
        # holds sbpc when it is installed; add ours only where it is missing
        # (running from a source tree, or under another distribution name).
        super().register_all_dialects()
        known = set(self.ctx.registered_dialect_names)
        for name, factory in SBPC_UNIVERSE.all_dialects.items():
            if name not in known:
                self.ctx.register_dialect(name, factory)

    def register_all_frontends(self):
        super().register_all_frontends()

        def parse_mlir(io) -> ModuleOp:
            return parse_text(self.ctx, io.read(), self.get_input_name(), not self.args.no_implicit_module)

        self.available_frontends["mlir"] = parse_mlir

    def prepare_input(self):
        try:
            return super().prepare_input()
        except ValueError as error:  # an input file extension no frontend reads
            raise OSError(str(error)) from None

    def apply_passes(self, prog: ModuleOp):
        try:
            super().apply_passes(prog)
        except VerifyException as error:
            raise locate(prog, error) from None

    def register_all_targets(self):
        super().register_all_targets()
        for name, factory in SBPC_UNIVERSE.all_targets.items():
            self.available_targets.setdefault(name, factory)

    def register_all_passes(self):
        super().register_all_passes()
        for name, factory in SBPC_UNIVERSE.all_passes.items():
            self.available_passes.setdefault(name, factory)


def main(args: list[str] | None = None) -> int:
    # Show deprecations as xdsl-opt does, unless the caller chose a policy
    # (the test suite runs with PYTHONWARNINGS=error::DeprecationWarning).
    if not sys.warnoptions:
        warnings.filterwarnings("default", category=DeprecationWarning)
    try:
        opt = SbpOptMain(description="sbpc's modular optimizer driver", args=args)
    except (ValueError, PassFailedException, ArgSpecParseError) as error:
        # An unknown pass or option, an option value of the wrong kind, or a
        # pipeline that does not parse (`compile{a=1,b=2}`: options are
        # separated by spaces): xDSL raises these while it reads the pipeline.
        print(f"sbp-opt: error: {error}", file=sys.stderr)
        return 1
    try:
        with collector_paused():
            opt.run()
    except (ParseError, DiagnosticException) as error:
        # A verifier error carries the printed IR with the failing op marked
        # in its notes, as `--verify-diagnostics` shows it.
        print(error, file=sys.stderr)
        for note in getattr(error, "__notes__", ()):
            print(note, file=sys.stderr)
        return 1
    except OSError as error:
        # An unreadable input, output or device file: the message names it.
        print(f"sbp-opt: error: {error}", file=sys.stderr)
        return 1
    # Any other exception is a bug in sbpc and keeps its traceback.
    return 0


if __name__ == "__main__":
    sys.exit(main())
