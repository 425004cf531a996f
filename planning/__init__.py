"""Planning: the searches behind the passes, apart from the passes that
run them. The SBP choice problem and its exact cost (sbp_problem.py,
priced by cost_model.py from the cluster's rates), its searches
(sbp_search.py; the integer program, sbp_ilp.py), writing an answer back
(sbp_solution.py), the cheapest boxing paths between two distributions
(boxing_planner.py), and the autoplan search (autoplan/). The passes in
lowering/ (sbp-infer, sbp-insert-boxing, sbp-autoplan, ...) build the
problem from IR, call the search and write its answer back; planning runs
no pass (where a search must lower a candidate, the pass hands it a
callback)."""
