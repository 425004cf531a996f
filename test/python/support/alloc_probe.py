"""Run by runtime/test_numpy_kernels.py under mpiexec -n 1 (and by
runtime/test_grouped_rows.py on 2 ranks): compiles the plan in argv[1],
warms the executor up, then measures with tracemalloc how far memory rises
during each kernel firing and each collective's issue of a steady-state
step and during a firing of the allocating path (local kernel, then a
copy), and prints rank 0's numbers as JSON, with the bytes its
communication actors' shared packing buffers hold after the step."""

import json
import sys
import tracemalloc

from mpi4py import MPI
from xdsl.context import Context

import sbpc
from sbpc.lowering.compile import CompilePass
from sbpc.runtime.executor import Executor
from sbpc.runtime.program import find_program
from sbpc.semantics.local_eval import local_kernel
from sbpc.semantics.plan_interpreter import actor_kernel
from sbpc.tools.sbp_run import generated_feeds


def rise(fn) -> int:
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    fn()
    return tracemalloc.get_traced_memory()[1] - before


def main() -> None:
    with open(sys.argv[1]) as f:
        module = sbpc.parse_module(f.read())
    CompilePass().apply(Context(), module)
    program = find_program(module)
    ex = Executor(module, program, MPI.COMM_WORLD, write_back=False)
    ex.initialize()
    ex.feed(generated_feeds(program, 0))
    ex.run(2)  # warm-up
    per_kernel: dict[str, int] = {}
    for actor, fire in list(ex.kernels.items()):
        def probe(xs, o, fire=fire, name=f"@{actor.sym_name.data} ({actor.kernel.data})"):
            per_kernel[name] = max(per_kernel.get(name, 0), rise(lambda: fire(xs, o)))

        ex.kernels[actor] = probe
    per_comm: dict[str, int] = {}
    for actor, comm in ex.comm_actors.items():
        # into or out of rows owned at run time: it reads the group ends or the index too
        grouped = " grouped" if actor.reads_group_ends() or actor.reads_index() else ""
        def probe_issue(slot_in, slot_out, issue=comm.issue,
                        name=f"@{actor.sym_name.data} ({actor.kind.data}{grouped})"):
            issued = []
            per_comm[name] = max(per_comm.get(name, 0), rise(lambda: issued.append(issue(slot_in, slot_out))))
            return issued[0]

        comm.issue = probe_issue
    tracemalloc.start()
    ex.run(1)
    # the allocating path, measured the same way, on the biggest output
    actor = max(ex.kernels, key=lambda a: ex.registers[a.outs.data[0].string_value()].bytes.value.data)
    op, local = actor_kernel(ex.ctx, actor, ex.registers, ex.piece_of)
    xs = [ex.view(r.string_value(), 0) for r in actor.ins.data]
    out = ex.view(actor.outs.data[0].string_value(), 0)

    def allocating():
        out[...] = local_kernel(op, local, *xs)

    allocating_kernel = rise(allocating)
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps({"per_kernel": per_kernel, "per_comm": per_comm, "allocating_kernel": allocating_kernel,
                          "biggest_output": out.nbytes, "staging_held": ex.staging.bytes_held}))


main()
