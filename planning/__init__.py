"""Planning: the searches behind the passes, apart from the passes that
run them. The SBP choice problem and its cost (sbp_problem.py, priced by
cost_model.py from the cluster's rates), its exact form as an integer
program (sbp_ilp.py), and the cheapest boxing paths between two
distributions (boxing_planner.py). The passes in lowering/ (sbp-infer,
sbp-insert-boxing, sbp-autoplan, ...) build the problem from IR, call the
search and write its answer back."""
