"""What one rank runs as the launcher started it, torchvision main()-style: `train` builds what the training
loop is handed and runs it; `evaluate` scores a weights file."""
