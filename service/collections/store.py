"""One collection's store: what serves it (:class:`Served`, leased by requests
through the collection's :class:`Slot`), its registry entry (:class:`Entry`),
and how a collection's record is opened (:class:`StoreMixin` of
:class:`service.collections.Collections`: its labels placed, its model loaded,
its index and runtime opened)."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexing.batches import open_index
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
#: how often a request waiting for an in-place restore looks again
SWAP_POLL_SECONDS = 0.01
#: HTTP answers say only this of why loading failed: the error names artifact
#: paths, so it goes to the log (and to ``hypsearch serve``'s exit message) only
SEE_THE_LOG = "the service log says why"
RESTORING = "collection: the default collection is being restored; retry shortly"
RETIRED = "collection: it was restored or dropped while this write waited; retry"


@dataclass(eq=False)
class Served:
    """What requests of one collection use: the runtime and its workers."""

    runtime: Runtime
    searcher: Any  # MicroBatcher (searches)
    batcher: Any | None = None  # MicroBatcher (image embeddings), with a model
    #: :meth:`close` closes the runtime too (not a runtime a test handed the app)
    owned: bool = True
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
        if self.owned:
            self.runtime.close()


class Slot:
    """What serves one collection, and the one place its requests wait.

    A slot is loading (nothing yet: the default collection while the service
    starts), failed (:attr:`error`, for the log), serving a :class:`Served`, or
    swapping (an in-place restore: new leases wait until :meth:`end_swap` hands
    them the restored one). Every request leases the :class:`Served` through it:
    :meth:`lease` on the event loop (:func:`service.deps.get_services`),
    :meth:`try_acquire` without waiting (the search fast path), :meth:`acquire`
    off it (snapshots); each lease is released when the request is answered."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self.served: Served | None = None
        self.error: str | None = None  # why it could not be opened, in full (paths too)
        self.swapping = False

    # -- state ------------------------------------------------------------------------
    def set(self, served: Served | None) -> None:
        """Serve ``served`` (``None``: nothing, e.g. a failed reopen); ends a swap."""
        with self._cond:
            self.served = served
            self.swapping = False
            if served is not None:
                self.error = None
            self._cond.notify_all()

    def fail(self, error: str) -> None:
        """Opening it failed (``error`` is logged, never answered)."""
        with self._cond:
            self.error = error
            self._cond.notify_all()

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until it serves or failed (``False``: still loading after ``timeout``)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self.served is not None or self.error is not None, timeout=timeout
            )

    def unavailable(self) -> ApiError:
        """The 503 while it serves nothing: still loading, or it could not be opened
        (why goes to the log only: it names artifact paths)."""
        if self.name != DEFAULT:
            return ApiError(
                503, f"collection {self.name!r} could not be opened (the service log says why)"
            )
        if self.error is not None:
            return ApiError(503, f"the service could not load its artifacts ({SEE_THE_LOG})")
        return ApiError(503, "the model and the index are still loading; retry shortly")

    def runtime(self) -> Runtime:
        """The runtime served now, without a lease (its model, labels and taxonomy,
        which an in-place restore keeps); :meth:`unavailable` while there is none."""
        served = self.served
        if served is None:
            raise self.unavailable()
        return served.runtime

    # -- leases -----------------------------------------------------------------------
    def try_acquire(self) -> Served | None:
        """A lease on the current one, or ``None`` (a swap runs, or none is loaded)."""
        with self._cond:
            if self.swapping or self.served is None:
                return None
            return self.served.acquire()

    def acquire(self, wait: float = 0.0) -> Served:
        """A lease, waiting up to ``wait`` seconds for a swap to end (then 503);
        :meth:`unavailable` while it serves nothing. Blocks: call it off the event loop."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self.swapping, timeout=wait):
                raise ApiError(503, RESTORING)
            if self.served is None:
                raise self.unavailable()
            return self.served.acquire()

    async def lease(self, wait: float = SWAP_WAIT_SECONDS) -> Served:
        """:meth:`acquire` on the event loop: during a swap, looks again every
        :data:`SWAP_POLL_SECONDS` (never blocking the loop), at most ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            served = self.try_acquire()
            if served is not None:
                return served
            if not self.swapping:
                raise self.unavailable()
            if time.monotonic() > deadline:
                raise ApiError(503, RESTORING)
            await asyncio.sleep(SWAP_POLL_SECONDS)

    def begin_swap(self) -> Served:
        with self._cond:
            if self.swapping:
                raise ApiError(409, "collection: a restore of the default collection is running")
            if self.served is None:
                raise self.unavailable()
            self.swapping = True
            return self.served

    def end_swap(self, served: Served | None) -> None:
        """Hand ``served`` (the restored one, or the old one when the swap was called
        off) to the requests waiting."""
        self.set(served)


@dataclass
class Entry:
    """A collection: its record in the registry (``None`` for the default
    collection, whose index is the service's own, ``HYPSEARCH_INDEX``) and the
    :class:`Slot` that serves it."""

    name: str
    record: dict[str, Any] | None  # space, model, taxonomy, folder, index, created
    slot: Slot | None = None  # made for the name when not given
    lock: threading.Lock = field(default_factory=threading.Lock)  # restores, snapshots

    def __post_init__(self) -> None:
        if self.slot is None:
            self.slot = Slot(self.name)

    @property
    def served(self) -> Served | None:
        return self.slot.served

    @property
    def space(self) -> str:
        return self.record["space"]


class StoreMixin:
    """Opening collections: the part of :class:`service.collections.Collections`
    that turns a registry record into a :class:`Served`."""

    def _default_runtime(self) -> Runtime:
        """The default collection's runtime, for its model, labels and taxonomy (which
        an in-place restore keeps: no lease needed)."""
        return self._entries[DEFAULT].slot.runtime()

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
        from models.vision.image_model import load_model

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
        # the stored index (its own space: compared below), or a new one of the space
        space = {} if ball else {"space": sp.spec}
        index = open_index(path, dim=sp.dim, curvature=sp.c if ball else 1.0, **space)
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
