"""The host options that sbp-run and sbp-calibrate share: where their ranks run."""

from __future__ import annotations

import argparse

from sbpc.runtime.hosts import LAUNCHERS, Hosts


def add_host_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ranks on several hosts (default: every rank on this machine)")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="HOST[:N],...",
                       help="hosts in rank order, each with its rank count (default: an even share); "
                            "the first must be this machine")
    where.add_argument("--hostfile", metavar="FILE", help="the same, a HOST[:N] per line")
    group.add_argument("--launcher", choices=LAUNCHERS,
                       help="how mpiexec starts ranks on the hosts (default: ssh, or srun inside a Slurm "
                            "allocation; fork: all on this machine, to try a host list)")


def hosts_from(options: argparse.Namespace) -> Hosts | None:
    """The Hosts the options name (HostsError, a ValueError, on a bad list)."""
    if options.hostfile:
        return Hosts.from_file(options.hostfile, options.launcher)
    if options.hosts:
        return Hosts.parse(options.hosts, options.launcher)
    if options.launcher:
        raise ValueError("--launcher needs --hosts or --hostfile")
    return None
