"""`sbp-opt`: xDSL's opt driver with sbpc's dialects and passes.

Every xdsl-opt flag works (`-p`, `--split-input-file`, `--verify-diagnostics`,
`--print-op-generic`, `--print-between-passes`, ...). Bad input is reported
as a diagnostic on stderr with exit code 1, never as a Python traceback.
"""

import sys
import warnings

from xdsl.utils.exceptions import DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

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
        SbpOptMain(description="sbpc's modular optimizer driver", args=args).run()
    except (ParseError, DiagnosticException) as error:
        # A verifier error carries the printed IR with the failing op marked
        # in its notes, as `--verify-diagnostics` shows it.
        print(error, file=sys.stderr)
        for note in getattr(error, "__notes__", ()):
            print(note, file=sys.stderr)
        return 1
    except (ValueError, OSError) as error:
        # Unknown passes or options, unreadable files: xDSL raises these as
        # plain exceptions; the message is what a user needs.
        print(f"sbp-opt: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
