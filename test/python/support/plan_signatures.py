"""What a compiled plan's text says about how each kernel runs."""

import re


def signatures_of(plan_text: str, kernel: str) -> set[tuple[str, str]]:
    """(first operand, result) dtensor types of every actor running `kernel`."""
    registers = {m[1]: m[2] for m in re.finditer(r"plan.register @(\S+) .* of (!sbp.dtensor<.*>)$", plan_text, re.M)}
    return {(registers[m[1]], registers[m[2]])
            for m in re.finditer(rf'"{kernel}" \[@([^,\]]+)[^\]]*\] -> \[@([^\]]+)\]', plan_text)}
