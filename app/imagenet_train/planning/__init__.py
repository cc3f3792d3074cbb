"""Pure arithmetic, no torch and no I/O: shard partition and the planner's verdicts, epoch
lengths and the LR schedule, the mid-epoch resume position."""
