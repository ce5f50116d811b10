"""The host agent (`mlx-fleet-host`): one per machine, it starts and stops the worker processes
the routers place on it (issue 42, "models load where there is room").

It speaks shared/placement/messages.py with every router of `[worker] router`: HostHello,
then StartWorker / StopWorker in, HostReport (every `report_interval_s`) and WorkerExited out.
It is the authority on its memory budget: a StartWorker its workers' estimates cannot fit is
refused at once. The workers it starts register with the routers themselves.

    memory.py     the machine's memory, the budget, a process's resident memory
    catalog.py    the [[models]] this host can serve (their files readable here)
    processes.py  one worker process: its command, log, stop and exit reason
    links.py      one DEALER socket per router
    agent.py      the loop: messages in, processes started, reports and exits out
    cli.py        `python -m fleet.host` / `mlx-fleet-host`
"""
