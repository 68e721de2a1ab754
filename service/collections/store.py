"""One collection's store: what serves it (:class:`Served`, leased by requests;
the default collection's through its :class:`DefaultSlot`), its registry entry
(:class:`Entry`), and how a collection's record is opened (:class:`StoreMixin` of
:class:`service.collections.Collections`: its labels placed, its model loaded,
its index and runtime opened)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexing import HyperbolicIndex
from indexing.geometry import PoincareIndexSpace, make_index_space

from ..errors import ApiError
from ..ingest.roots import BuildInputError, OutsideRootsError, check_under_roots
from ..runtime import BallRuntime, ProductRuntime, Runtime
from .names import DEFAULT
from .spaces import cap_labels, check_space, inline_taxonomy, space_name

log = logging.getLogger("service")

LABELS_FILE = "labels.safetensors"
_SYNSET = re.compile(r"^.+\.n\.\d\d$")  # WordNet noun synsets: their words are looked up
#: how long a dropped or replaced collection waits for the requests still using it
DRAIN_SECONDS = 60.0
#: how long a request waits for an in-place restore of the default collection
SWAP_WAIT_SECONDS = 120.0
RESTORING = "collection: the default collection is being restored; retry shortly"
RETIRED = "collection: it was restored or dropped while this write waited; retry"


@dataclass(eq=False)
class Served:
    """What requests of one collection use: the runtime and its workers."""

    runtime: Runtime
    searcher: Any  # MicroBatcher (searches)
    batcher: Any | None = None  # MicroBatcher (image embeddings), with a model
    owned: bool = True  # closed by the registry (not the default collection)
    _leases: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def acquire(self) -> Served:
        with self._cond:
            self._leases += 1
        return self

    def release(self) -> None:
        with self._cond:
            self._leases -= 1
            if self._leases <= 0:
                self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request holds a lease (``False``: still used after ``timeout``)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._leases <= 0, timeout=timeout)

    def close_when_idle(self, then: Callable[[], None] | None = None) -> None:
        """In a thread: wait until no request uses it (at most :data:`DRAIN_SECONDS`),
        close the workers and the index, then call ``then`` (remove its folder)."""

        def run() -> None:
            self.wait_idle(DRAIN_SECONDS)
            self.runtime.retire(RETIRED)
            self.close()
            if then is not None:
                try:
                    then()
                except OSError as e:
                    log.warning("removing a replaced collection folder failed: %s", e)

        threading.Thread(target=run, name="collection-close", daemon=True).start()

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
        self.searcher.close()
        self.runtime.close()


class DefaultSlot:
    """The default collection's :class:`Served`, leased by every request that uses it
    (:func:`service.deps.get_services`, the search fast path), and swapped by an
    in-place restore: :meth:`begin_swap` makes new requests wait (:meth:`acquire`
    with ``wait``) until :meth:`end_swap` hands them the restored one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.served: Served | None = None
        self.swapping = False

    def set(self, served: Served | None) -> None:
        with self._cond:
            self.served = served
            self.swapping = False
            self._cond.notify_all()

    def try_acquire(self) -> Served | None:
        """A lease on the current one, or ``None`` (a swap runs, or none is loaded yet)."""
        with self._cond:
            if self.swapping or self.served is None:
                return None
            return self.served.acquire()

    def acquire(self, wait: float = 0.0) -> Served | None:
        """A lease, waiting up to ``wait`` seconds for a swap to end (503 after);
        ``None`` while nothing is loaded. Blocks: call it off the event loop."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self.swapping, timeout=wait):
                raise ApiError(503, RESTORING)
            return None if self.served is None else self.served.acquire()

    def begin_swap(self) -> Served:
        with self._cond:
            if self.swapping:
                raise ApiError(409, "collection: a restore of the default collection is running")
            if self.served is None:
                raise ApiError(503, "the default collection is not loaded")
            self.swapping = True
            return self.served

    def end_swap(self, served: Served | None) -> None:
        """Hand ``served`` (the restored one, or the old one when the swap was called
        off) to the requests waiting."""
        self.set(served)


@dataclass
class Entry:
    """A named collection: its record in the registry and what serves it."""

    name: str
    record: dict[str, Any]  # space, model, taxonomy, folder, index, created
    served: Served | None = None
    error: str | None = None  # why it could not be opened at start
    lock: threading.Lock = field(default_factory=threading.Lock)  # restores, snapshots

    @property
    def space(self) -> str:
        return self.record["space"]


class StoreMixin:
    """Opening collections: the part of :class:`service.collections.Collections`
    that turns a registry record into a :class:`Served`."""

    def _default_runtime(self) -> Runtime:
        """The default collection's runtime, for its model, labels and taxonomy (which
        an in-place restore keeps: no lease needed)."""
        served = self.slot.served
        if served is None:
            raise self._unloaded()
        return served.runtime

    def _place_labels(self, folder: Path, sp: PoincareIndexSpace, model, taxonomy) -> None:
        """Check the model, or write the collection's label points (``labels.safetensors``):
        a label checkpoint of that space as it is, else the taxonomy (given, or the
        default collection's) placed by the cap construction in that space."""
        from models.labels import LabelEmbedding

        if model is not None:
            if taxonomy is not None:
                raise ApiError(
                    422, "taxonomy: a model brings its own labels; give one or the other"
                )
            m = self._load_model(model)
            if m.dim != sp.dim or abs(float(m.curvature) - sp.c) > 1e-9:
                raise ApiError(
                    422,
                    f"space: the model {model!r} embeds in "
                    f"poincare:{m.dim}@{float(m.curvature):g}, not poincare:{sp.dim}@{sp.c:g}",
                )
            return
        labels = None
        if taxonomy is None:
            base = self._default_runtime()
            tax = base.labels.taxonomy
            if base.dim == sp.dim and abs(base.curvature - sp.c) < 1e-9:
                labels = base.labels
        elif isinstance(taxonomy, list):
            tax = inline_taxonomy(taxonomy)
        else:
            real = self._server_path(taxonomy, "taxonomy")
            if real.suffix == ".safetensors":
                try:
                    labels = LabelEmbedding.load(real)
                except Exception as e:  # noqa: BLE001 - a bad checkpoint of any kind
                    raise ApiError(
                        422, f"taxonomy: {taxonomy} is not a label checkpoint ({e})"
                    ) from None
                tax = labels.taxonomy
                if labels.dim != sp.dim or abs(float(labels.curvature) - sp.c) > 1e-9:
                    labels = None  # placed again in this space
            else:
                from models.taxonomy.graph import Taxonomy

                try:
                    tax = Taxonomy.from_tsv(real)
                except (ValueError, OSError) as e:
                    raise ApiError(422, f"taxonomy: {taxonomy}: {e}") from None
        if labels is None:
            work, most = len(tax) * sp.dim**2, self.settings.max_label_work
            if work > most:
                raise ApiError(
                    422,
                    f"space: placing {len(tax):,} labels in {sp.dim:,} dimensions is "
                    f"{work:,} (labels x dimension^2), at most {most:,} "
                    "(HYPSEARCH_MAX_LABEL_WORK); use a smaller dimension or taxonomy",
                )
            labels = cap_labels(tax, sp)
        labels.save(folder / LABELS_FILE)

    def _server_path(self, path: str, what: str) -> Path:
        try:
            real = check_under_roots(path, self.settings.data_roots, what)
        except OutsideRootsError as e:
            raise ApiError(403, str(e)) from None
        except (BuildInputError, ValueError) as e:
            raise ApiError(422, str(e)) from None
        if not real.is_file():
            raise ApiError(404, f"{what}: {path} is not a file")
        return real

    def _load_model(self, model: str):
        if model == DEFAULT:
            m = self._default_runtime().model
            if m is None:
                raise ApiError(422, "model: the default collection has no model")
            return m
        from models.checkpoint import CheckpointError
        from models.image_model import load_model

        real = self._server_path(model, "model")
        try:
            return load_model(str(real))
        except (CheckpointError, ValueError, OSError) as e:
            raise ApiError(422, f"model: {model}: {e}") from None

    def _open(self, rec: dict[str, Any], index_folder: str | None = None) -> Served:
        """The runtime of a collection record (its live index folder, or ``index_folder``)."""
        from models.labels import LabelEmbedding
        from models.taxonomy.graph import with_words

        folder = self.root / rec["folder"]
        model = labels = None
        sp = check_space(rec["space"])
        ball = isinstance(sp, PoincareIndexSpace)
        if rec.get("model") is not None:
            model = self._load_model(rec["model"])
            labels = model.labels
        elif ball:
            labels = LabelEmbedding.load(folder / LABELS_FILE)
        path = folder / (index_folder or rec["index"])
        if (path / "store.sqlite3").exists():
            index = HyperbolicIndex.load(path)
        elif ball:
            index = HyperbolicIndex(dim=sp.dim, curvature=sp.c, path=path)
        else:
            index = HyperbolicIndex(dim=sp.dim, space=sp.spec, path=path)
        try:
            got = make_index_space(index.dim, index.curvature, index.space)
            if space_name(got) != space_name(sp):
                raise ApiError(
                    422,
                    f"snapshot: its index is {space_name(got)}, "
                    f"the collection's space is {rec['space']}",
                )
            if not ball:
                return self._start(ProductRuntime(index, image_dir=folder / "images"))
            taxonomy = None
            try:
                base = self._default_runtime()
            except ApiError:
                base = None
            if base is not None and labels.taxonomy == base.labels.taxonomy:
                taxonomy = base.taxonomy  # with its words already
            if taxonomy is None and all(_SYNSET.match(n) for n in labels.taxonomy.names):
                taxonomy = with_words(labels.taxonomy, self.settings.wordnet_dir)
            rt = BallRuntime(
                index,
                labels,
                model,
                image_dir=folder / "images",
                data_dir=self.settings.data_dir,
                taxonomy=taxonomy,
                wordnet_dir=self.settings.wordnet_dir,
            )
        except BaseException:
            index.close()
            raise
        return self._start(rt)
