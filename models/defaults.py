"""The embedded default: Fashion-MNIST images under a WordNet taxonomy of clothing, footwear and bags.

``hypsearch demo`` (what ``make run`` runs) builds these artifacts under
``$HYPSEARCH_HOME`` once and reuses them afterwards.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .data import FASHION_MNIST_CLASSES
from .taxonomy import DEFAULT_WORDNET_DIR, Taxonomy

#: WordNet subtrees of the default taxonomy: everything worn (clothing and
#: footwear live under covering.n.02) and every container (bags), plus their
#: ancestors up to entity.n.01.
DEFAULT_ROOTS = ("covering.n.02", "container.n.01")


def default_taxonomy(wordnet_dir: str | os.PathLike = DEFAULT_WORDNET_DIR) -> Taxonomy:
    """The default taxonomy, with WordNet's words for name resolution."""
    full = Taxonomy.from_wordnet(wordnet_dir)
    keep: set[str] = set()
    for root in DEFAULT_ROOTS:
        keep.add(root)
        keep |= full.descendants(root)
        keep |= full.ancestors(root)
    for _, synset in FASHION_MNIST_CLASSES:
        keep.add(synset)
        keep |= full.ancestors(synset)
    return full.induced(keep)


def run_default_pipeline(home: str | os.PathLike, *, progress: bool = True) -> dict:
    """Build (or reuse) the default artifacts under ``home``; returns a summary."""
    from .labels import LabelEmbedding, LabelTrainConfig, evaluate_reconstruction, train_labels

    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    steps = []
    t0 = time.perf_counter()
    tax = default_taxonomy()
    tax_path = home / "taxonomy.tsv"
    if not tax_path.exists():
        tax.to_tsv(tax_path)
        steps.append(f"wrote the default taxonomy ({len(tax)} WordNet nouns) to {tax_path}")
    labels_path = home / "labels.safetensors"
    emb = None
    if labels_path.exists():
        emb = LabelEmbedding.load(labels_path)
        if emb.taxonomy != tax:
            emb = None
        else:
            steps.append(f"reused label embeddings {labels_path}")
    if emb is None:
        emb = train_labels(tax, LabelTrainConfig(), progress=progress)
        emb.metrics |= evaluate_reconstruction(emb)
        emb.save(labels_path)
        steps.append(
            f"trained label embeddings of {len(tax)} nodes in {emb.metrics['train_seconds']:.0f} s "
            f"(reconstruction MAP {emb.metrics['map']:.3f}, mean rank "
            f"{emb.metrics['mean_rank']:.2f}) -> {labels_path}"
        )
    summary = {
        "home": str(home),
        "taxonomy": str(tax_path),
        "labels": str(labels_path),
        "nodes": len(tax),
        "metrics": {k: emb.metrics.get(k) for k in ("map", "mean_rank")},
        "seconds": time.perf_counter() - t0,
        "steps": steps,
    }
    summary["message"] = "\n".join(
        steps
        + [
            "The image encoder, the index and the web service are not built yet "
            "(see the open issues); the label space they will live in is ready.",
        ]
    )
    return summary


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(run_default_pipeline(os.environ.get("HYPSEARCH_HOME", "var")), indent=1))
