"""The runtime: executes `plan` IR, one MPI rank per device. `executor`
runs a device's actors on its arenas with non-blocking collectives
(`collectives`), numpy kernels (`numpy_kernels`) or CUDA ones (`cuda_backend`,
`cuda`); `worker` is the rank program of `sbp-run`, `pool` the rank pool of
the Python API, `launch` builds mpiexec command lines, `trace_stats` reads
Chrome traces."""
