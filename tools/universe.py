"""sbpc's dialects and passes for xDSL tools: published through the
`xdsl.universe` entry point (so stock `xdsl-opt` sees them) and registered
directly by `sbp-opt`."""

from xdsl.ir import Dialect
from xdsl.universe import Universe

from sbpc.lowering import PASSES


def _lg() -> Dialect:
    from sbpc.dialects.lg import LG

    return LG


def _sbp() -> Dialect:
    from sbpc.dialects.sbp import SBP

    return SBP


def _plan() -> Dialect:
    from sbpc.dialects.plan import PLAN

    return PLAN


def _dot():
    from sbpc.tools.visualize import DotTarget

    return DotTarget


def _memory_svg():
    from sbpc.tools.visualize import MemorySvgTarget

    return MemorySvgTarget


DIALECTS = {"lg": _lg, "sbp": _sbp, "plan": _plan}
TARGETS = {"dot": _dot, "memory-svg": _memory_svg}

SBPC_UNIVERSE = Universe(all_dialects=dict(DIALECTS), all_passes=dict(PASSES), all_targets=dict(TARGETS))
