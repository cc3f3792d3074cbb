"""--mixup-alpha/--cutmix-alpha: soft targets that sum to 1 and match the mix of the images, applied by the
training step to the batch the model sees; --val-tta: the logits of an image and its mirror averaged."""

from __future__ import annotations

import pytest
import torch

from imagenet_train.training.evaluation import logits_of
from imagenet_train.training.step import TrainStep, batch_mixing

pytestmark = pytest.mark.unit

CLASSES = 10


def _batch(n: int = 8, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample i is the constant image i + 1 with label i: every pixel says which sample it came from."""
    images = torch.arange(1, n + 1, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, size, size).contiguous()
    return images, torch.arange(n) % CLASSES


def test_mixup_targets_sum_to_one_and_match_the_mixed_images():
    torch.manual_seed(0)
    mix = batch_mixing(0.4, 0.0, CLASSES)
    for _ in range(5):
        images, labels = _batch()
        mixed, targets = mix(images, labels)
        assert targets.shape == (8, CLASSES) and torch.allclose(targets.sum(1), torch.ones(8))
        partner = labels.roll(1)  # MixUp mixes each sample with the one before it
        own = targets[torch.arange(8), labels]
        # pixel = lam * (i + 1) + (1 - lam) * i  (the partner of sample i is i - 1; sample 0's is 7)
        lam = (mixed[1:, 0, 0, 0] - torch.arange(1, 8)) / 1.0
        assert torch.allclose(own[1:], lam, atol=1e-5)
        assert torch.allclose(targets[torch.arange(8), partner], 1 - own, atol=1e-6)
        assert (mixed == mixed[:, :1, :1, :1]).all()  # MixUp blends whole images


def test_cutmix_targets_match_the_pasted_box_area():
    torch.manual_seed(0)
    mix = batch_mixing(0.0, 1.0, CLASSES)
    boxes = set()
    for _ in range(8):
        images, labels = _batch()
        mixed, targets = mix(images, labels)
        assert torch.allclose(targets.sum(1), torch.ones(8))
        for i in range(8):
            pasted = (mixed[i, 0] == images[i - 1, 0, 0, 0]).float().mean()  # pixels of the partner (i - 1)
            assert targets[i, labels[i]].item() == pytest.approx(1 - pasted.item(), abs=1e-6)
            assert targets[i, labels[i - 1]].item() == pytest.approx(pasted.item(), abs=1e-6)
        boxes.add(round(float((mixed[1, 0] == 1.0).float().mean()), 4))
    assert len(boxes) > 1  # the box changes from batch to batch


def test_both_on_gives_each_batch_one_of_the_two():
    torch.manual_seed(0)
    mix = batch_mixing(0.4, 1.0, CLASSES)
    kinds = set()
    for _ in range(20):
        images, labels = _batch()
        mixed, _ = mix(images, labels)
        whole = bool((mixed == mixed[:, :1, :1, :1]).all())  # MixUp: every image uniform; CutMix: a box
        kinds.add("mixup" if whole else "cutmix")
    assert kinds == {"mixup", "cutmix"}
    assert batch_mixing(0.0, 0.0, CLASSES) is None


def test_the_training_step_trains_on_the_mixed_batch_with_soft_targets():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, CLASSES))
    seen: list[torch.Tensor] = []
    model.register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0].detach().clone()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay: the loss can be recomputed
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    step = TrainStep(model, model, optimizer, criterion, None, False, batch_transform=batch_mixing(0.0, 1.0, CLASSES))
    images, labels = _batch()
    images = images.to(torch.uint8) * 20
    loss = step(images, labels)
    from imagenet_train.training.batch_input import normalize

    clean = normalize(images.clone())
    assert not torch.equal(seen[0], clean)  # the model saw the CutMix batch
    cut = seen[0] != clean
    assert cut.any() and (~cut).any()
    # the loss is the cross-entropy (with smoothing) against soft targets: recompute it from what the model saw
    with torch.no_grad():
        logits = model(seen[0])
    pasted = cut[:, 0].flatten(1).float().mean(1)
    targets = torch.zeros(8, CLASSES)
    targets[torch.arange(8), labels] += 1 - pasted
    targets[torch.arange(8), labels.roll(1)] += pasted
    assert loss.item() == pytest.approx(criterion(logits, targets).item(), rel=1e-5)


class FirstColumn(torch.nn.Module):
    """Logits read from the image's left pixel column (class 0) and right column (class 1)."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.stack([images[:, 0, :, 0].mean(1), 2 * images[:, 0, :, -1].mean(1)], dim=1)


def test_tta_averages_the_logits_of_the_image_and_its_mirror():
    images = torch.zeros(2, 3, 4, 5)
    images[:, :, :, 0] = torch.tensor([1.0, 3.0]).view(2, 1, 1)  # left column
    images[:, :, :, -1] = torch.tensor([5.0, 7.0]).view(2, 1, 1)  # right column
    plain = logits_of(FirstColumn(), images)
    assert plain.tolist() == [[1.0, 10.0], [3.0, 14.0]]
    flipped = logits_of(FirstColumn(), images, tta=True)
    # class 0: (left + right) / 2; class 1: 2 x (right + left) / 2
    assert flipped.tolist() == [[3.0, 6.0], [5.0, 10.0]]
