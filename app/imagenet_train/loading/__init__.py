"""The input pipeline: shard stages and loaders (resampled, split, queue), transforms and
decoders (simplejpeg, fused, DALI), device prefetch, the planner's simulation."""
