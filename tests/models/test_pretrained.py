"""``pretrained:efficientnet-lite0``: shipped photos placed among WordNet nouns without
training, and a folder of them searchable by nouns above the ImageNet classes
(through the index build and the REST layer, real parts throughout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models.checkpoint import CheckpointError
from models.images.decode import decode
from models.prototypes import nearest_rows
from models.vision.image_model import load_model
from tests.support.photos import PHOTOS
from tests.support.server import needs_data

pytestmark = [
    needs_data,  # WordNet (the label embedding)
    pytest.mark.usefixtures("torch_single_thread"),
]

SPEC = "pretrained:efficientnet-lite0"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pretrained-home")


@pytest.fixture(scope="module")
def model(home):
    return load_model(SPEC, cache_dir=home / "pretrained")


@pytest.fixture(scope="module")
def pixels():
    return {k: decode(p) for k, p in PHOTOS.items()}


def test_unknown_pretrained_name_is_one_line():
    with pytest.raises(CheckpointError, match="no such pretrained model .*efficientnet-lite0"):
        load_model("pretrained:resnet-9000")


def test_labels_cover_the_imagenet_nouns(model):
    tax = model.labels.taxonomy
    assert len(model.classes) == 1000 and len({n for _, n in model.classes}) == 1000
    assert 1000 < len(tax) < 2500
    for noun in ("feline.n.01", "dog.n.01", "vehicle.n.01", "beverage.n.01", "building.n.01"):
        assert noun in tax
    assert "feline.n.01" in tax.ancestors("egyptian_cat.n.01")
    assert model.labels.cone["family"] == "cap"
    assert model.geometry == "poincare" and model.dim == model.labels.dim
    assert model.version.startswith(SPEC + ":" + "579344248a93")


def test_cached_labels_give_the_same_model(model, home):
    again = load_model(SPEC, cache_dir=home / "pretrained")
    assert again.version == model.version
    torch.testing.assert_close(again.labels.embeddings, model.labels.embeddings)


def test_placement_lands_on_the_top_class_or_an_ancestor(model, pixels):
    names = list(pixels)
    p = model.probabilities([pixels[n] for n in names])
    z = model.embed([pixels[n] for n in names])
    torch.testing.assert_close(z, model.place(p))
    assert z.dtype == torch.float64 and z.shape == (len(names), model.dim)
    assert bool((z.norm(dim=-1) < 1).all())
    tax = model.labels.taxonomy
    near = nearest_rows(z.numpy(), model.labels.embeddings.double().numpy(), curvature=1.0)
    got = {}
    for j, name in enumerate(names):
        top = model.classes[int(p[j].argmax())][1]
        label = tax.names[near[j]]
        assert label == top or label in tax.ancestors(top), (name, top, label)
        got[name] = label
    assert "feline.n.01" in tax.ancestors(got["chelsea"])
    assert got["coffee"] == "espresso.n.01"
    assert "vehicle.n.01" in tax.ancestors(got["motorcycle"])


def test_other_placements_and_batches(model, pixels):
    ims = [pixels["chelsea"], pixels["coffee"]]
    p = model.probabilities(ims)
    for how in ("midpoint", "topk", "top1", "mass"):
        z = model.place(p, how)
        assert z.shape == (2, model.dim) and bool((z.norm(dim=-1) < 1).all()), how
    torch.testing.assert_close(model.embed(ims, batch_size=1), model.embed(ims))
    assert model.embed([]).shape == (0, model.dim)


def test_a_folder_of_photos_answers_noun_searches(model, home, tmp_path):
    """Index the shipped photos with the pretrained model (the CLI's build path), serve
    them, and search by nouns above the ImageNet classes: the right photo first."""
    from indexing.batches import open_index
    from models.taxonomy.graph import with_words
    from models.taxonomy.wordnet import WordResolver
    from service.ingest.build import build_index
    from service.ingest.plans import plan_path
    from service.runtime import open_runtime
    from service.settings import Settings
    from tests.support.server import app_client

    manifest = tmp_path / "photos.csv"
    manifest.write_text("id,path\n" + "".join(f"{k},{p}\n" for k, p in PHOTOS.items()))
    index_dir = tmp_path / "index"
    index = open_index(index_dir, dim=model.dim, curvature=model.curvature)
    plan = plan_path(str(manifest), taxonomy=WordResolver(with_words(model.labels.taxonomy, None)))
    report = build_index(model, index, plan, batch_size=8, workers=0, progress=False)
    assert report.indexed == len(PHOTOS)
    index.save()
    index.close()

    settings = Settings(model=SPEC, index=index_dir, home=home, log_json=False)
    rt = open_runtime(settings)
    try:
        assert rt.model.version == model.version
        with app_client(rt, batch_max_wait_ms=5) as client:
            for query, first in (
                ("feline", "chelsea"),
                ("cat.n.01", "chelsea"),
                ("beverage", "coffee"),
                ("vehicle", "motorcycle"),
                ("building", "china"),
            ):
                # the hierarchical answer (SPEC): items in the noun's cone first, by level
                body = {"label": query, "k": 3, "mode": "hierarchical"}
                r = client.post("/v1/search", json=body)
                assert r.status_code == 200, r.text
                hits = r.json()["results"]
                assert hits[0]["id"] == first, (query, hits)
                assert hits[0]["level"] == 0, (query, hits)
            with open(PHOTOS["chelsea"], "rb") as f:
                r = client.post("/v1/embed", files={"file": ("cat.png", f, "image/png")})
            assert r.status_code == 200, r.text
            labels = [lab["label"] for lab in r.json()["labels"]]
            tax = model.labels.taxonomy
            assert any("feline.n.01" in tax.ancestors(lab) for lab in labels), labels
    finally:
        rt.close()
    assert np.isfinite(report.seconds)
