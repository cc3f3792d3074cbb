"""Pure arithmetic, no torch and no I/O: shard partition and the planner's verdicts, epoch
lengths, the LR schedule and its advice, the mid-epoch resume position."""
