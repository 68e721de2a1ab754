"""One APIRouter per resource: ops (health, stats, metrics), search, labels, items, jobs, page."""
