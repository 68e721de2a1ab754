"""Image training: a short real run, checkpoints, resuming."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from models.images.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist
from models.labels import LabelTrainConfig, train_labels
from models.taxonomy.graph import Taxonomy
from models.training.run import TrainConfig, TrainError, get_lr, train
from models.vision.image_model import ImageModel
from tests.support.training import FMNIST, needs_fmnist, shapes_folder, small_labels, tiny_config


@pytest.fixture(scope="module")
def labels():
    torch.set_num_threads(1)
    return small_labels()


def test_get_lr_warmup_cosine_floor():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, warmup_iters=10)
    assert get_lr(0, cfg, 100) == pytest.approx(0.1)
    assert get_lr(9, cfg, 100) == pytest.approx(1.0)
    assert get_lr(10, cfg, 100) == pytest.approx(1.0)
    assert get_lr(55, cfg, 100) == pytest.approx(0.55)
    assert get_lr(100, cfg, 100) == pytest.approx(0.1)
    assert get_lr(500, cfg, 100) == pytest.approx(0.1)
    lrs = [get_lr(i, cfg, 100) for i in range(10, 101)]
    assert all(a >= b for a, b in zip(lrs[:-1], lrs[1:], strict=True))


@needs_fmnist
def test_one_epoch_lowers_loss_and_checkpoint_reloads_identically(labels, tmp_path):
    torch.set_num_threads(1)
    model = train(
        tiny_config(epochs=2), labels, progress=False, checkpoint_path=tmp_path / "run.partial"
    )
    hist = model.metrics["history"]
    assert len(hist) == 2 and hist[1]["loss"] < hist[0]["loss"]
    # within the first epoch too: its mean is below the loss of its first batch
    assert hist[0]["loss"] < 0.9 * model.metrics["first_loss"]
    assert hist[1]["val_acc"] > 0.35  # 10 classes: chance is 0.1

    test = load_fashion_mnist("test", FMNIST)
    images = test.images[:300]
    z = model.embed(images)
    assert z.dtype == torch.float64 and z.shape == (300, labels.dim)
    assert (z.norm(dim=1) < 1).all()
    path = tmp_path / "model.safetensors"
    version = model.save(path)
    loaded = ImageModel.load(path)
    assert loaded.version == version and len(version) == 64
    assert torch.equal(loaded.embed(images), z)
    assert loaded.curvature == labels.curvature and loaded.dim == labels.dim
    assert loaded.class_map == {name: syn for name, syn in FASHION_MNIST_CLASSES}
    assert loaded.preprocess.size == 28 and loaded.preprocess.channels == 1
    assert torch.equal(loaded.labels.embeddings, labels.embeddings)
    assert loaded.labels.taxonomy == labels.taxonomy
    assert loaded.metrics["epochs"] == 2 and loaded.config["epochs"] == 2
    # the auxiliary classifier is part of the run state (resumable), not of the model
    run_tensors, _, _ = load_checkpoint(tmp_path / "run.partial", kind="model")
    assert {"aux.weight", "aux.bias"} <= set(run_tensors)
    model_tensors, _, _ = load_checkpoint(path, kind="model")
    assert not any(k.startswith("aux.") for k in model_tensors)
    # any image size and RGB go through the same preprocessing
    rgb = np.repeat(images[:4, :, :, None], 3, axis=3)
    big = torch.nn.functional.interpolate(
        torch.from_numpy(rgb).permute(0, 3, 1, 2).float(), size=56
    )
    big = big.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    zb = loaded.embed(big)
    assert zb.shape == (4, labels.dim)
    assert torch.allclose(
        loaded.embed(rgb), z[:4], atol=1e-3
    )  # RGB gray == gray (luminance rounding)
    # a class from a handful of images: its Einstein midpoint
    proto = loaded.class_prototype(images[test.targets[:300] == 7][:5])
    assert proto.shape == (labels.dim,) and float(proto.norm()) < 1

    # resuming the finished 2-epoch run with 3 epochs trains only one more epoch
    more = train(
        tiny_config(epochs=3), labels, progress=False, checkpoint_path=tmp_path / "run.partial"
    )
    assert [h["epoch"] for h in more.metrics["history"]] == [1, 2, 3]
    assert more.metrics["history"][:2] == hist


@needs_fmnist
def test_interrupted_run_resumes_bit_for_bit(labels, tmp_path):
    """A run stopped after its first epoch and resumed ends with the uninterrupted run's weights."""
    torch.set_num_threads(1)
    from models.images.datasets import ImageSet

    real = load_fashion_mnist("train", FMNIST)
    data = ImageSet(real.images[:800], real.targets[:800], real.classes, real.ids[:800])
    cfg = dict(limit=None, epochs=2, widths=[4, 8, 8, 8], warmup_iters=3, time_budget=None)
    whole = train(tiny_config(**cfg), labels, progress=False, data=data)
    partial = tmp_path / "run.partial"
    first = train(
        tiny_config(**cfg),
        labels,
        progress=False,
        data=data,
        checkpoint_path=partial,
        max_seconds=0,
    )
    assert len(first.metrics["history"]) == 1
    resumed = train(tiny_config(**cfg), labels, progress=False, data=data, checkpoint_path=partial)
    for a, b in ((whole.encoder, resumed.encoder), (whole.head, resumed.head)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    strip = lambda h: [{k: v for k, v in e.items() if k != "seconds"} for e in h]  # noqa: E731
    assert strip(resumed.metrics["history"]) == strip(whole.metrics["history"])
    assert resumed.metrics["first_loss"] is None


def test_truncated_and_foreign_checkpoints(labels, tmp_path):
    torch.set_num_threads(1)
    from safetensors.torch import save_file

    from models.images.preprocess import Preprocess
    from models.vision.encoders import EncoderConfig
    from models.vision.heads import HeadConfig

    model = ImageModel(
        EncoderConfig("conv4", 1, 28, [4, 4, 8, 8]),
        HeadConfig(in_features=8, dim=labels.dim, clip_r=5.0),
        Preprocess(),
        labels,
        list(FASHION_MNIST_CLASSES),
    )
    path = tmp_path / "m.safetensors"
    model.save(path)
    data = path.read_bytes()
    # a checkpoint whose weights do not match its config
    tensors, meta, _ = load_checkpoint(path, kind="model")
    meta["encoder"]["widths"] = [4, 4, 8, 16]
    save_checkpoint(tmp_path / "mismatch.safetensors", "model", tensors, meta)
    save_file({"w": torch.zeros(3)}, tmp_path / "foreign.safetensors")
    labels.save(tmp_path / "labels.safetensors")
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF  # flipping a byte of the tensors breaks the checksum
    (tmp_path / "flip.safetensors").write_bytes(bytes(flipped))
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    for name, match in [
        ("cut", "cut.safetensors.*truncated"),
        ("foreign", "foreign.safetensors.*not a hypsearch checkpoint"),
        ("labels", "expected a 'model' checkpoint"),
        ("mismatch", "mismatch.safetensors: encoder weights do not match"),
        ("flip", "checksum"),
    ]:
        with pytest.raises(CheckpointError, match=match):
            ImageModel.load(tmp_path / f"{name}.safetensors")


@needs_fmnist
def test_bad_requests(labels):
    with pytest.raises(TrainError, match="--holdout hat.n.01: not a class"):
        train(tiny_config(holdout=["hat.n.01"]), labels, progress=False)
    with pytest.raises(TrainError, match="--dim 3"):
        train(tiny_config(dim=3), labels, progress=False)
    with pytest.raises(TrainError, match="unknown loss"):
        train(tiny_config(loss="hinge"), labels, progress=False)
    tax = Taxonomy.from_edges([("a", "b")])
    other = train_labels(tax, LabelTrainConfig(dim=6, epochs=1, burnin=0))
    with pytest.raises(TrainError, match="'jersey.n.03'.*does not contain"):
        train(tiny_config(), other, progress=False)


@needs_fmnist
def test_holdout_classes_never_seen(labels):
    torch.set_num_threads(1)
    from models.images.datasets import ImageSet

    real = load_fashion_mnist("train", FMNIST)
    # the held-out class's images are replaced by NaNs: training would fail if it saw one
    imgs = real.images[:3000].astype(np.float32) / 255
    imgs[real.targets[:3000] == 5] = np.nan
    data = ImageSet(imgs, real.targets[:3000], real.classes, real.ids[:3000])
    model = train(
        tiny_config(holdout=["sandal.n.01"], limit=None, epochs=1),
        labels,
        progress=False,
        data=data,
    )
    assert model.holdout == ["sandal.n.01"]
    assert "sandal.n.01" not in model.seen_classes and len(model.seen_classes) == 9
    assert model.metrics["train_images"] + model.metrics["val_images"] == int(
        (real.targets[:3000] != 5).sum()
    )


def test_user_folder_with_resnet_and_unlabelled_manifest(labels, tmp_path):
    pytest.importorskip("PIL", reason="Pillow is needed to read image files")
    torch.set_num_threads(1)
    shapes_folder(tmp_path / "imgs")
    cfg = TrainConfig(
        dataset=None,
        images=str(tmp_path / "imgs"),
        class_map={"boots": "boot.n.01", "sandals": "sandal.n.01"},
        encoder="resnet18",
        widths=[8],  # 4 channels: a oneDNN crash in channels-last backward on some CPUs
        input_size=32,
        # 4 epochs at 3e-3 left the vectors no better than an untrained network's
        epochs=12,
        batch_size=16,
        warmup_iters=2,
        lr=1e-2,
        val_fraction=0.0,
        time_budget=None,
    )
    model = train(cfg, labels, progress=False)
    hist = model.metrics["history"]
    assert hist[-1]["loss"] < hist[0]["loss"]
    assert model.preprocess.channels == 3 and model.preprocess.size == 32
    assert model.class_map == {"boots": "boot.n.01", "sandals": "sandal.n.01"}
    z = model.embed([np.zeros((50, 70, 3), np.uint8), np.zeros((20, 20), np.uint8)])
    assert z.shape == (2, labels.dim)
    # evaluation of a user's folder (ids, classes and metrics of the same data path)
    from models.images.datasets import load_folder
    from models.training.evaluate import evaluate_model

    data = load_folder(tmp_path / "imgs", model.class_map)
    m = evaluate_model(model, data, ood=False, delta=False)
    assert m["images"] == 48 and set(m["hop_map@50"]) == {"0", "2", "4"}
    # recall@1 against a brute force on the model's own vectors (each image's nearest other)
    zz = model.embed(data.images)
    d = model.space.pairwise(zz, zz)
    d.fill_diagonal_(float("inf"))
    t = torch.as_tensor(np.asarray(data.targets))
    assert m["recall@1"] == pytest.approx(float((t[d.argmin(1)] == t).double().mean()))
    # the two shapes are told apart and placed at their labels: an untrained network of
    # the same kind gives mAP@R 0.28-0.32, recall@1 0.48-0.75 and a nearest-label
    # accuracy of 0.5 here (seeds 0-2; recall@10 is 1.0 for any model on two balanced
    # classes); this run gave 1.0 for all three
    assert m["map@r"] > 0.75 and m["recall@1"] >= 0.9, m
    assert m["nearest_label_acc"] >= 0.8 and m["hier_hit@1"] >= 0.8, m

    # NT-Xent on an unlabelled manifest (no class map, no prototypes)
    rows = ["id,path"] + [f"u{i},imgs/boots/{i:03d}.png" for i in range(12)]
    rows += [f"v{i},imgs/sandals/{i:03d}.png" for i in range(12)]
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    cfg = TrainConfig(
        dataset=None,
        images=str(tmp_path / "m.csv"),
        loss="ntxent",
        tau=0.5,
        dim=4,
        widths=[4, 8, 8, 8],
        input_size=28,
        epochs=3,
        batch_size=12,
        warmup_iters=1,
        val_fraction=0.0,
        time_budget=None,
    )
    m2 = train(cfg, labels, progress=False)
    assert m2.dim == 4 and m2.head_cfg.clip_r == pytest.approx(2.3)
    assert all(np.isfinite(h["loss"]) for h in m2.metrics["history"])


@needs_fmnist
def test_time_budget_shrinks_the_schedule(labels):
    torch.set_num_threads(1)
    model = train(tiny_config(epochs=3, time_budget=1e-3), labels, progress=False)
    assert model.metrics["epochs"] == 1 and model.metrics["epochs_requested"] == 3
