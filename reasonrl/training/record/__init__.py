"""What a run leaves and reads back: its directory, checkpoints, metrics, trackers, report, and its health."""
