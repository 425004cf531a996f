"""The autoplan search: how to lay a training graph out on a cluster
(mesh, pipeline stages, micro-batches and schedule, memory mode,
recomputation), by predicting each candidate on the step-time simulator.

- candidates.py: the one model both searches share (Layout, Candidate) and the
  choice of the fastest that fits;
- whole.py: the whole-graph search (each layout lowered and simulated
  whole, by sbp-autoplan's `evaluate`);
- stages.py: cutting a forward graph into pipeline stages;
- layers.py, profiler.py, compose.py: the layer search (cut into layers,
  profile each class, compose candidates from the profiles).

sbp-autoplan (lowering/sbp_autoplan.py) runs them: it hands in the passes
(planning imports none) and writes the chosen plan back."""
