"""Collections: several named indexes in one server, aliases, and snapshots over REST.

Every collection is an entry of the registry, served by the same code: a
:class:`service.runtime.Runtime` with its own space (``poincare:D[@c]`` or a
product), labels and optionally a model. The collection ``default`` is the index
the service was started with (``HYPSEARCH_INDEX``: its entry has no record in
the registry file); the others are kept under ``$HYPSEARCH_HOME/collections/``::

    collections/registry.json          collections and aliases (written atomically)
    collections/<name>-<rnd>/labels.safetensors   its label points (unless a model gives them)
    collections/<name>-<rnd>/index-<rnd>/         its index (the registry names the live one)
    collections/<name>-<rnd>/images/              pictures uploaded into it
    collections/<name>-<rnd>/snapshots/<id>.tar   its snapshots (and <id>.json)
    collections/_default/snapshots/               the default collection's snapshots

The registry file is the commit point of every change: a collection exists once
the registry names it, is dropped once the registry no longer does, and a
restore swaps the index folder the registry names (a crash leaves the old or
the new folder in use, never a half-written one; folders the registry does not
name are removed at the next start).

Requests reach a collection through its :class:`Slot` (by
:func:`service.deps.get_services`; aliases resolved): the slot leases its
:class:`Served` (runtime, search worker, embedding worker) until the request is
answered, so a dropped or restored collection is closed only once the requests
still using it are done: concurrent searches see the old or the new state, never
an error. The slot is also the one place requests wait: while the default
collection loads (503), and while it is restored in place
(:meth:`Collections._restore_default`: its index folder is the one
``HYPSEARCH_INDEX`` names, swapped by :func:`indexing.swap.swap_in`; requests
wait for the restored one).

The package, by job:

* :mod:`.registry`: :class:`Collections`, the registry file, lookups, create and drop;
* :mod:`.store`: one collection's :class:`Served` (leases), its :class:`Slot`
  (loading, serving, swapping) and :class:`Entry`, and opening a collection's
  record (labels, model, index);
* :mod:`.aliases`: aliases;
* :mod:`.snapshots`: snapshots taken, listed and restored into a named collection;
  :mod:`.restore_default`: the default collection restored in place;
  :mod:`.archive`: the snapshot tar format and its checks;
* :mod:`.spaces`: a collection's space, inline taxonomies, cap-placed labels;
* :mod:`.names`: names and time stamps.
"""

from .archive import SNAPSHOT_PATTERN
from .names import DEFAULT, NAME_PATTERN, check_name
from .registry import Collections
from .restore_default import CRASH_ENV, RESTORE_STEPS
from .store import (
    DRAIN_SECONDS,
    RESTORING,
    RETIRED,
    SEE_THE_LOG,
    SWAP_POLL_SECONDS,
    SWAP_WAIT_SECONDS,
    Served,
    Slot,
)

__all__ = [
    "CRASH_ENV",
    "DEFAULT",
    "DRAIN_SECONDS",
    "NAME_PATTERN",
    "RESTORE_STEPS",
    "RESTORING",
    "RETIRED",
    "SNAPSHOT_PATTERN",
    "SEE_THE_LOG",
    "SWAP_POLL_SECONDS",
    "SWAP_WAIT_SECONDS",
    "Collections",
    "Served",
    "Slot",
    "check_name",
]
