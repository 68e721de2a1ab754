"""Request and response shapes of the REST API (pydantic), with OpenAPI examples:
shared types and errors (:mod:`.common`), searches and labels (:mod:`.search`),
items and jobs (:mod:`.items`), batches, scroll and count (:mod:`.points`); every
public name of each is importable from here."""

from . import common, items, points, search
from .common import *  # noqa: F403
from .items import *  # noqa: F403
from .points import *  # noqa: F403
from .search import *  # noqa: F403

__all__ = [*common.__all__, *search.__all__, *items.__all__, *points.__all__]
