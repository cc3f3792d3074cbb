"""The input pipeline: shard stages and loaders (resampled, split, queue), transforms and
decoders (simplejpeg, fused, DALI), batches on the device, the planner's simulation."""
