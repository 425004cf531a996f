"""What the IR means, executed with numpy: the reference interpreter of `lg`
(global values), per-device SBP semantics (local kernels on pieces), the
multi-device simulator of sbp-level IR and the plan simulator. Every pass
and the runtime are tested against these."""
