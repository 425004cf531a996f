"""What the IR means, executed with numpy: the reference interpreter of `lg`
(global values), per-device SBP semantics (local kernels on pieces), the
multi-device interpreter of sbp-level IR (`sbp_interpreter`) and the plan
interpreter (`plan_interpreter`). Every pass and the runtime are tested
against these. (Simulation, in sbpc, is timing: `perf/`.)"""
