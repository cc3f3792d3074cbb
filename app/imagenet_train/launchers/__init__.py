"""Ways to start the same training: launcher environments to torchrun, the chart's deployment
file, Slurm, SSH, Ray Train, Lightning."""
