"""The MPI runtime that executes `plan` IR (comes with the runtime work)."""
