"""Runs spread over a cluster's machines. Every process of such a run is a worker of one run in a shared store
(runner/engine/workers.py: chunk leases, request claims, the ledger), so the guarantees of one process hold across
all of them.

    ray_workers  ``--ray``: the run's workers started as Ray actors (:class:`RunWorker`), which Ray places and
                 starts again when one dies; the command waits for them and shows the run's progress.
    watch        the live view's counters filled from the store, for a process that is not a worker itself.

Slurm and Kubernetes need no code here: every task of an array job (or pod of an Indexed Job) runs the same
``runner submit JOB --run-id NAME`` (runner/service.py: ``open_shared_run``, ``named_run``, ``join``); the scripts
are in deploy/. Ray is an optional extra (``pip install 'llm-job-runner[ray]'``): nothing imports it but
:mod:`runner.cluster.ray_workers`, and only when ``--ray`` is given.
"""
