"""sbp-opt and the installed package: bad input ends in a diagnostic, not
a traceback; every registered pass and dialect loads (`tools/universe.py`);
the package imports from outside the checkout."""

import os
import subprocess
import sys

from sbpc.tools.sbp_opt import main as sbp_opt_main


def test_sbp_opt_reports_bad_input_without_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.mlir"
    bad.write_text('lg.graph @g {\n  %x = lg.input "x" : tensor<4xi8>\n  lg.output []\n}\n')
    assert sbp_opt_main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert "'lg.input': element type i8 is not supported" in err and "Traceback" not in err
    good = tmp_path / "good.mlir"
    good.write_text('lg.graph @g {\n  %x = lg.input "x" : tensor<4xi64>\n  lg.output ["x"] %x : tensor<4xi64>\n}\n')
    assert sbp_opt_main([str(good)]) == 0
    assert 'lg.input "x" : tensor<4xi64>' in capsys.readouterr().out


def test_package_imports_from_outside_the_checkout(tmp_path):
    code = "import sbpc, sbpc.dialects.lg, sbpc.lowering, sbpc.runtime, sbpc.tools.sbp_opt; print(sbpc.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_every_registered_pass_loads():
    from sbpc.tools.universe import SBPC_UNIVERSE

    for name, factory in SBPC_UNIVERSE.all_passes.items():
        assert factory().name == name
    assert set(SBPC_UNIVERSE.all_dialects) == {"lg", "sbp", "plan"}
    for name, factory in SBPC_UNIVERSE.all_dialects.items():
        assert factory().name == name


def test_sbp_opt_reads_and_verifies_ir_without_importing_numpy(tmp_path):
    """Loading the dialects and verifying IR imports no numpy (0.15 s of
    every sbp-opt run: the lit suite runs it ~140 times); what computes
    values imports it where it is used (`dialects/dtypes.py`)."""
    ir = tmp_path / "g.mlir"
    ir.write_text('lg.graph @g {\n  %x = lg.input "x" : tensor<4xf32>\n  %y = lg.relu %x : tensor<4xf32>\n'
                  '  lg.output ["y"] %y : tensor<4xf32>\n}\n')
    code = ("import sys; from sbpc.tools.sbp_opt import main\n"
            f"assert main([{str(ir)!r}]) == 0\n"
            "assert 'numpy' not in sys.modules, 'numpy was imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
