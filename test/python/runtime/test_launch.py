"""How the ranks are started (`runtime/launch.py`): ranks that outnumber
the usable cores are bound to them round robin."""


def test_ranks_that_outnumber_the_cores_are_bound_to_them(monkeypatch):
    from sbpc.runtime import launch

    monkeypatch.setattr(launch, "usable_cpus", lambda: [2, 5])  # as under `taskset -c 2,5`
    assert launch.launcher(2, None)[1:] == ["-n", "2"]
    assert launch.launcher(5, None)[1:] == ["-bind-to", "user:2,5,2,5,2", "-n", "5"]
