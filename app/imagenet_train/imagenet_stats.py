"""ImageNet's per-channel mean and std (of pixels scaled to [0, 1]): the training step's normalisation
(training/batch_input.py) and the DALI pipeline's both use them."""

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
