"""indexing.table.ItemTable: the id column a search answers with."""

import numpy as np

from indexing.table import ItemTable


def _vectors(n):
    return np.full((n, 2), 0.1)


def test_ids_at_follows_upserts_and_removals():
    t = ItemTable(2)
    t.upsert(["a", "bb", "c"], _vectors(3), [None] * 3, [None] * 3)
    np.testing.assert_array_equal(t.ids_at(np.array([[2, 0], [1, 1]])), [["c", "a"], ["bb", "bb"]])
    t.remove(["bb"])
    assert t.id_array()[1] == ""  # a hole
    # a longer id widens the answer's dtype; a re-added id gets a new slot
    t.upsert(["a-much-longer-id", "bb"], _vectors(2), [None] * 2, [None] * 2)
    got = t.ids_at(np.array([3, 4, 2]))
    assert got.dtype.kind == "U"
    assert got.tolist() == ["a-much-longer-id", "bb", "c"]
    # a replaced id (upsert of an existing one) moves to its new slot
    t.upsert(["c"], _vectors(1), [None], [None])
    assert t.id_array()[2] == ""
    assert t.ids_at(np.array([t.slot_of["c"]])).tolist() == ["c"]


def test_ids_at_of_a_table_made_from_slots():
    t = ItemTable(2)
    t.upsert(["x", "y", "z"], _vectors(3), [None] * 3, [None] * 3)
    t.remove(["y"])
    c = t.compacted()
    assert c.ids_at(np.array([0, 1])).tolist() == ["x", "z"]
    f = ItemTable.from_slots(5, np.array([4, 1]), t.batch(np.array([0, 2])))
    assert f.ids_at(np.array([1, 4])).tolist() == ["z", "x"]
