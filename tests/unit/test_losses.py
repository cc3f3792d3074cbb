"""--loss bce: timm's BinaryCrossEntropy (ResNet Strikes Back), on hard labels with --label-smoothing and on the soft
targets MixUp/CutMix make; --sync-bn: torch's SyncBatchNorm across ranks, refused on CPU."""

import pytest
import torch
import torch.nn.functional as F

from imagenet_train.config import Config, OptimConfig
from imagenet_train.config_checks import checked
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.training.step import TrainStep, batch_mixing, build_criterion, sync_batchnorm

pytestmark = pytest.mark.unit


def test_bce_on_hard_labels_is_binary_cross_entropy_against_smoothed_one_hot_targets():
    criterion = build_criterion(OptimConfig(loss="bce", label_smoothing=0.1))
    logits, labels = torch.randn(4, 5), torch.tensor([0, 4, 2, 2])
    targets = torch.full((4, 5), 0.1 / 5)
    targets[torch.arange(4), labels] = 1 - 0.1 + 0.1 / 5
    assert criterion(logits, labels).item() == pytest.approx(F.binary_cross_entropy_with_logits(logits, targets).item())
    assert not isinstance(build_criterion(OptimConfig()), type(criterion))  # ce stays CrossEntropyLoss


def test_bce_trains_on_mixups_soft_targets_and_the_threshold_binarises_them():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 5))
    seen: list[torch.Tensor] = []
    criterion = build_criterion(OptimConfig(loss="bce", bce_target_threshold=0.2))
    recording = lambda logits, targets: seen.append(targets) or criterion(logits, targets)  # noqa: E731
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = TrainStep(model, model, optimizer, recording, None, False, batch_transform=batch_mixing(0.5, 0.0, 5))
    before = model[1].weight.detach().clone()
    loss = step(torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8), torch.tensor([0, 1, 2, 3, 4, 0]))
    assert seen[0].shape == (6, 5) and torch.allclose(seen[0].sum(1), torch.ones(6))  # soft targets
    assert torch.isfinite(loss) and not torch.equal(before, model[1].weight)
    thresholded = criterion.forward(torch.zeros(6, 5), seen[0])
    binary = F.binary_cross_entropy_with_logits(torch.zeros(6, 5), (seen[0] > 0.2).float())
    assert thresholded.item() == pytest.approx(binary.item())


def test_bce_target_threshold_without_bce_is_refused_in_one_line():
    cfg = Config()
    cfg.data.shards, cfg.optim.bce_target_threshold = "shards.json", 0.2
    with pytest.raises(ImagenetTrainError, match=r"^--bce-target-threshold: applies to --loss bce only"):
        checked(cfg)


def _bn_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Sequential(torch.nn.BatchNorm2d(4))
    )


def test_sync_bn_converts_every_batchnorm_when_distributed_on_cuda():
    # The conversion itself runs anywhere; SyncBatchNorm's forward needs CUDA (see the next test).
    converted = sync_batchnorm(_bn_model(), torch.device("cuda", 0), distributed=True)
    norms = [m for m in converted.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert len(norms) == 2 and all(isinstance(m, torch.nn.SyncBatchNorm) for m in norms)
    alone = sync_batchnorm(_bn_model(), torch.device("cuda", 0), distributed=False)  # one process: its own batch
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in alone.modules())


def test_sync_bn_on_cpu_is_refused_in_one_line():
    with pytest.raises(ImagenetTrainError) as error:
        sync_batchnorm(_bn_model(), torch.device("cpu"), distributed=True)
    assert str(error.value).startswith("--sync-bn: needs CUDA") and "\n" not in str(error.value)
