"""sbpc's IR levels, one dialect per file: `lg` (logical graph) and `sbp`
(distributed tensors, placements and collectives)."""
