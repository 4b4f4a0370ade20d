"""Where a run's processes and threads are: the data-parallel group, the CPU threads."""
