"""Performance models: the cluster a plan runs on and the step time a plan takes there."""
