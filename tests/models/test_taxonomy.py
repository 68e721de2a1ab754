"""Tests for models.taxonomy.graph and models.taxonomy.wordnet.

The WordNet tests read the real WordNet 3.0 database at /usr/share/wordnet
(Debian package wordnet-base) and skip cleanly when it is missing.  The noun
graph is loaded once per module.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from models.taxonomy.graph import DEFAULT_WORDNET_DIR, Taxonomy, TaxonomyError, UnknownLabelError
from models.taxonomy.wordnet import load_wordnet_nouns

HAVE_WORDNET = all(
    os.path.isfile(os.path.join(DEFAULT_WORDNET_DIR, f)) for f in ("data.noun", "index.noun")
)
needs_wordnet = pytest.mark.skipif(
    not HAVE_WORDNET,
    reason=f"WordNet 3.0 database not found at {DEFAULT_WORDNET_DIR} "
    "(install the Debian package wordnet-base)",
)

# A small hierarchy with multiple inheritance: robot_dog is both a toy and a dog.
#
#   root ── animal ── mammal ── dog ── robot_dog
#      │        │         └──── cat ── kitten
#      │        └──── bird ──── penguin
#      └─── object ── toy ───── robot_dog, ball
DIRECT = [
    ("animal", "root"),
    ("object", "root"),
    ("mammal", "animal"),
    ("bird", "animal"),
    ("dog", "mammal"),
    ("cat", "mammal"),
    ("kitten", "cat"),
    ("penguin", "bird"),
    ("toy", "object"),
    ("robot_dog", "toy"),
    ("robot_dog", "dog"),
    ("ball", "toy"),
]


def closure_of(direct):
    parents = {}
    for c, p in direct:
        parents.setdefault(c, set()).add(p)

    def up(n):
        out = set()
        for p in parents.get(n, ()):
            out.add(p)
            out |= up(p)
        return out

    return sorted({(c, a) for c in parents for a in up(c)})


def write_tsv(path, pairs, header=True):
    lines = []
    if header:
        lines += ["# a comment", ""]
    lines += [f"{c}\t{p}" for c, p in pairs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def small():
    return Taxonomy.from_edges(DIRECT)


# --------------------------------------------------------------- edge lists


def test_closure_and_direct_tsv_load_to_same_hierarchy(tmp_path):
    rng = random.Random(1234)
    closure = closure_of(DIRECT)
    assert len(closure) > len(DIRECT)
    direct = list(DIRECT)
    rng.shuffle(direct)
    rng.shuffle(closure)
    a = Taxonomy.from_tsv(write_tsv(tmp_path / "direct.tsv", direct))
    b = Taxonomy.from_tsv(write_tsv(tmp_path / "closure.tsv", closure))
    # a partial closure (direct edges + some shortcuts), with duplicates
    mixed = DIRECT + rng.sample(closure, 5) + DIRECT[:3]
    c = Taxonomy.from_edges(mixed)
    assert a == b == c
    assert a.names == b.names == sorted({n for e in DIRECT for n in e})
    assert np.array_equal(a.direct_edges(), b.direct_edges())
    assert np.array_equal(a.closure_edges(), b.closure_edges())
    got = {(a.names[i], a.names[j]) for i, j in a.direct_edges().tolist()}
    assert got == set(DIRECT)
    got = {(a.names[i], a.names[j]) for i, j in b.closure_edges().tolist()}
    assert got == set(closure)


def test_redundant_edge_is_reduced():
    t = Taxonomy.from_edges(DIRECT + [("robot_dog", "animal"), ("kitten", "root")])
    assert t.parents("robot_dog") == ["dog", "toy"]
    assert t.parents("kitten") == ["cat"]
    assert t == Taxonomy.from_edges(DIRECT)


def test_self_loop_errors(tmp_path):
    with pytest.raises(TaxonomyError, match=r"self-loop.*'x' -> 'x'"):
        Taxonomy.from_edges([("a", "b"), ("x", "x")])
    path = write_tsv(tmp_path / "loop.tsv", [("a", "b"), ("b", "c"), ("x", "x")])
    with pytest.raises(TaxonomyError) as ei:
        Taxonomy.from_tsv(path)
    msg = str(ei.value)
    # lines: comment, blank, a-b, b-c, x-x -> line 5
    assert f"{path}:5:" in msg and "'x' -> 'x'" in msg and "\n" not in msg


def test_cycle_errors_name_an_edge(tmp_path):
    edges = [("a", "b"), ("b", "c"), ("z", "a"), ("c", "a")]
    with pytest.raises(TaxonomyError) as ei:
        Taxonomy.from_edges(edges)
    assert "cycle" in str(ei.value)
    # the named edge is the edge of the cycle that comes last: c -> a
    assert "'c' -> 'a'" in str(ei.value)
    path = write_tsv(tmp_path / "cycle.tsv", edges, header=False)
    with pytest.raises(TaxonomyError) as ei:
        Taxonomy.from_tsv(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}:4:") and "'c' -> 'a'" in msg and "\n" not in msg
    # a cycle hidden in a closure-style file (two-node cycle)
    with pytest.raises(TaxonomyError, match="cycle"):
        Taxonomy.from_edges(closure_of(DIRECT) + [("root", "kitten")])


def test_malformed_lines(tmp_path):
    for bad, fields in [("a b", 1), ("a\tb\tc", 3), ("a\t", 2)]:
        path = tmp_path / "bad.tsv"
        path.write_text(f"# header\nx\ty\n{bad}\n", encoding="utf-8")
        with pytest.raises(TaxonomyError) as ei:
            Taxonomy.from_tsv(path)
        msg = str(ei.value)
        assert msg.startswith(f"{path}:3:") and "malformed" in msg, msg
        assert f"got {fields} field" in msg
    with pytest.raises(TaxonomyError, match="not found"):
        Taxonomy.from_tsv(tmp_path / "missing.tsv")
    empty = tmp_path / "empty.tsv"
    empty.write_text("# nothing\n\n", encoding="utf-8")
    with pytest.raises(TaxonomyError, match="no edges"):
        Taxonomy.from_tsv(empty)
    with pytest.raises(TaxonomyError, match="pair"):
        Taxonomy.from_edges([("a", "b", "c")])


def test_to_tsv_roundtrip_and_atomic(tmp_path, small, monkeypatch):
    for closure in (True, False):
        path = tmp_path / f"t{closure}.tsv"
        small.to_tsv(path, closure=closure)
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
        assert len(lines) == (len(closure_of(DIRECT)) if closure else len(DIRECT))
        assert Taxonomy.from_tsv(path) == small
    # a failing replace leaves the old file untouched and no temp file behind
    path = tmp_path / "tTrue.tsv"
    before = path.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        Taxonomy.from_edges([("a", "b")]).to_tsv(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tFalse.tsv", "tTrue.tsv"]


# -------------------------------------------------------- structure queries


def test_basic_structure(small):
    assert len(small) == 12
    assert small.roots() == ["root"]
    assert small.leaves() == ["ball", "kitten", "penguin", "robot_dog"]
    assert small.names[small.index("dog")] == "dog"
    assert "dog" in small and "wolf" not in small
    assert small.parents("robot_dog") == ["dog", "toy"]
    assert small.children("toy") == ["ball", "robot_dog"]
    assert small.ancestors("robot_dog") == {"dog", "mammal", "animal", "toy", "object", "root"}
    assert small.ancestors("root") == set()
    assert small.descendants("mammal") == {"dog", "cat", "kitten", "robot_dog"}
    assert small.descendants(small.index("object")) == {"toy", "ball", "robot_dog"}
    assert small.is_ancestor("mammal", "robot_dog")
    assert not small.is_ancestor("robot_dog", "mammal")
    with pytest.raises(UnknownLabelError):
        small.parents("wolf")


def test_depth_shortest_path(small):
    assert small.depth("root") == 0
    assert small.depth("dog") == 3
    # robot_dog: root-object-toy-robot_dog (3) is shorter than via dog (4)
    assert small.depth("robot_dog") == 3
    assert small.depth("kitten") == 4
    assert small.max_depth == 4
    assert small.depths.tolist() == [small.depth(n) for n in small.names]


def test_lca_and_hops(small):
    assert small.lca("cat", "robot_dog") == "mammal"
    assert small.lca("dog", "robot_dog") == "dog"
    assert small.lca("penguin", "toy") == "root"
    assert small.lca("kitten", "kitten") == "kitten"
    assert small.hops("kitten", "kitten") == 0
    assert small.hops("dog", "mammal") == 1
    assert small.hops("cat", "robot_dog") == 3  # via mammal
    # via animal (2 + 3) beats via root (3 + 3), although robot_dog's
    # shortest way to the root goes through toy
    assert small.hops("penguin", "robot_dog") == 5
    assert small.hops("ball", "kitten") == 7  # via root: 3 + 4
    forest = Taxonomy.from_edges([("a", "r1"), ("b", "r2")])
    assert forest.lca("a", "b") is None and forest.hops("a", "b") is None


def test_lca_tie_break_is_deterministic():
    # x and y both have parents p and q at the same depth: tie -> name order
    edges = [("p", "r"), ("q", "r"), ("x", "p"), ("x", "q"), ("y", "p"), ("y", "q")]
    t = Taxonomy.from_edges(edges)
    assert t.lca("x", "y") == "p"
    assert Taxonomy.from_edges(list(reversed(edges))).lca("y", "x") == "p"


def test_siblings_and_cousins(small):
    assert small.siblings("dog") == {"cat"}
    assert small.siblings("robot_dog") == {"ball"}
    assert small.siblings("root") == set()
    assert small.cousins("cat") == {"penguin"}
    assert small.cousins("robot_dog") == {"kitten"}
    assert small.cousins("kitten") == {"robot_dog"}
    assert small.cousins("animal") == set()


def test_edge_arrays(small):
    ce = small.closure_edges()
    de = small.direct_edges()
    assert ce.shape == (len(closure_of(DIRECT)), 2) and ce.dtype.kind == "i"
    assert de.shape == (len(DIRECT), 2)
    assert not np.any(ce[:, 0] == ce[:, 1])
    for d, a in ce.tolist():
        assert small.names[a] in small.ancestors(small.names[d])
    assert set(map(tuple, de.tolist())) <= set(map(tuple, ce.tolist()))


def test_subtree(small):
    sub = small.subtree("mammal")
    assert sorted(sub.names) == ["cat", "dog", "kitten", "mammal", "robot_dog"]
    assert sub.roots() == ["mammal"]
    assert sub.parents("robot_dog") == ["dog"]
    assert sub.depth("kitten") == 2


def test_words_from_names(tmp_path):
    path = write_tsv(
        tmp_path / "w.tsv",
        [("gym_shoe.n.01", "shoe.n.01"), ("sneakers", "shoe.n.01"), ("shoe.n.02", "horseshoe")],
    )
    t = Taxonomy.from_tsv(path)
    assert t.lemmas is None
    assert t.words("gym_shoe.n.01") == ["gym_shoe"]
    assert t.words("sneakers") == ["sneakers"]
    assert t.resolve("Gym Shoe") == "gym_shoe.n.01"
    assert t.resolve("SNEAKERS") == "sneakers"
    assert t.resolve("shoe") == "shoe.n.01"  # sense order from the name
    assert t.resolve("shoe", prefer=lambda n: n == "shoe.n.02") == "shoe.n.02"
    assert t.resolve("shoe.n.02") == "shoe.n.02"
    assert t.complete("sh") == ["shoe", "shoe.n.01", "shoe.n.02"]
    with pytest.raises(UnknownLabelError) as ei:
        t.resolve("sneaker")
    assert "sneakers" in ei.value.suggestions


# ------------------------------------------------------------------ WordNet


@pytest.fixture(scope="module")
def wn():
    if not HAVE_WORDNET:
        pytest.skip(f"WordNet 3.0 database not found at {DEFAULT_WORDNET_DIR}")
    return load_wordnet_nouns()


@pytest.fixture(scope="module")
def nouns():
    if not HAVE_WORDNET:
        pytest.skip(f"WordNet 3.0 database not found at {DEFAULT_WORDNET_DIR}")
    return Taxonomy.from_wordnet()


@needs_wordnet
def test_wordnet_loader_names_match_nltk(wn):
    assert len(wn.names) == 82115
    assert "sneaker" in wn.lemmas["gym_shoe.n.01"]
    assert wn.lemmas["gym_shoe.n.01"] == ["gym_shoe", "sneaker", "tennis_shoe"]
    assert "T-shirt" in wn.lemmas["jersey.n.03"]
    assert "shirt" in wn.gloss["jersey.n.03"]
    assert "handbag" in wn.lemmas["bag.n.04"]
    assert "footwear" in wn.gloss["boot.n.01"]
    assert wn.parents["dog.n.01"] == ["canine.n.02", "domestic_animal.n.01"]
    assert wn.parents["mammal.n.01"] == ["vertebrate.n.01"]
    assert wn.parents["entity.n.01"] == []
    assert wn.word_index["sneaker"] == ["gym_shoe.n.01", "fink.n.01"]
    assert wn.word_index["dog"][:3] == ["dog.n.01", "frump.n.01", "dog.n.03"]
    assert wn.offsets["dog.n.01"] == 2084071
    # instance hypernyms (@i) are parents too
    assert wn.parents["einstein.n.01"] == ["physicist.n.01"]


def test_wordnet_loader_missing_files(tmp_path):
    with pytest.raises(TaxonomyError, match=str(tmp_path / "nope")):
        load_wordnet_nouns(tmp_path / "nope")
    with pytest.raises(TaxonomyError, match=str(tmp_path / "index.noun")):
        load_wordnet_nouns(tmp_path)
    (tmp_path / "index.noun").write_text("dog n 1 0 1 0 02084071\n")
    with pytest.raises(TaxonomyError, match=str(tmp_path / "data.noun")):
        load_wordnet_nouns(tmp_path)
    with pytest.raises(TaxonomyError, match="not found"):
        Taxonomy.from_wordnet(tmp_path / "nope")


@needs_wordnet
def test_noun_closure_counts(nouns):
    # 82,115 nouns and 743,241 closure pairs, as in Nickel & Kiela (2017),
    # "Poincaré Embeddings for Learning Hierarchical Representations", sec. 4.1,
    # with hypernym (@) and instance hypernym (@i) pointers both followed at
    # every step.  Note: the reference script (facebookresearch/
    # poincare-embeddings wordnet/transitive_closure.py) yields 743,086 pairs:
    # it never follows an @i pointer reached after an @ pointer (e.g.
    # megaera.n.01 @ fury.n.04 @i ...), which drops 155 pairs.
    assert len(nouns) == 82115
    assert len(nouns.closure_edges()) == 743241
    assert nouns.roots() == ["entity.n.01"]
    # WordNet lists 84,427 hypernym + instance-hypernym pointers; 61 are
    # implied by another path and removed by the transitive reduction.
    assert len(nouns.direct_edges()) == 84366
    assert nouns.parents("dog.n.01") == ["canine.n.02", "domestic_animal.n.01"]
    assert nouns.parents("helium.n.01") == ["noble_gas.n.01"]  # chemical_element is implied
    assert nouns.depth("entity.n.01") == 0
    assert nouns.lemmas["gym_shoe.n.01"] == ["gym_shoe", "sneaker", "tennis_shoe"]


@needs_wordnet
def test_mammal_closure_counts(nouns):
    mammals = Taxonomy.from_wordnet(root="mammal.n.01")
    assert mammals == nouns.subtree("mammal.n.01")
    assert mammals.roots() == ["mammal.n.01"]
    # 1,182 nodes / 6,542 closure pairs.  The published mammal closure
    # (1,180 / 6,540) additionally drops tusker.n.01 and female_mammal.n.01
    # (the '^tusker.n.01' and '^female_mammal.n.01' lines of poincare-embeddings
    # wordnet/mammals_filter.txt), two leaves with one closure pair each.
    assert len(mammals) == 1182
    assert len(mammals.closure_edges()) == 6542
    keep = [n for n in mammals.names if n not in ("tusker.n.01", "female_mammal.n.01")]
    assert len(keep) == 1180
    kept = set(keep)
    pairs = [
        (d, a)
        for d, a in mammals.closure_edges().tolist()
        if mammals.names[d] in kept and mammals.names[a] in kept
    ]
    assert len(pairs) == 6540
    # domestic_animal.n.01 is not a mammal: dog keeps one parent here
    assert mammals.parents("dog.n.01") == ["canine.n.02"]


@needs_wordnet
def test_unknown_root(nouns):
    with pytest.raises(TaxonomyError) as ei:
        Taxonomy.from_wordnet(root="mamal.n.01")
    assert "mammal.n.01" in str(ei.value) and "'mamal.n.01'" in str(ei.value)
    assert "mammal.n.01" in ei.value.suggestions
    with pytest.raises(TaxonomyError) as ei:
        Taxonomy.from_wordnet(root="sneaker")  # a word, not a synset name
    assert ei.value.suggestions[0] == "gym_shoe.n.01"


@needs_wordnet
def test_wordnet_queries(nouns):
    assert nouns.lca("dog.n.01", "cat.n.01") == "carnivore.n.01"
    assert nouns.hops("dog.n.01", "cat.n.01") == 4
    assert "domestic_cat.n.01" in nouns.descendants("cat.n.01")
    assert "mammal.n.01" in nouns.ancestors("dog.n.01")
    assert "domestic_animal.n.01" in nouns.ancestors("dog.n.01")
    assert "wolf.n.01" in nouns.siblings("dog.n.01")
    assert nouns.depth("mammal.n.01") == len(nouns.ancestors("mammal.n.01"))  # single chain


@needs_wordnet
def test_resolve(nouns):
    assert nouns.resolve("sneaker") == "gym_shoe.n.01"
    assert nouns.resolve("Sneaker") == "gym_shoe.n.01"
    assert nouns.resolve("running shoe") == "running_shoe.n.01"
    assert nouns.resolve("footwear") == "footwear.n.01"
    assert nouns.resolve("jersey.n.03") == "jersey.n.03"
    assert nouns.resolve("T-shirt") == "jersey.n.03"
    assert nouns.resolve("Dog.N.01") == "dog.n.01"
    # prefer picks a non-first sense; ties fall back to sense order
    items = {"jersey.n.03": 7, "jersey.n.02": 2}
    # index.noun order for "jersey": New Jersey first (NLTK: wn.synsets("jersey"))
    assert nouns.senses("jersey") == [
        "new_jersey.n.01",
        "jersey.n.02",
        "jersey.n.03",
        "jersey.n.04",
        "jersey.n.05",
    ]
    assert nouns.resolve("jersey") == "new_jersey.n.01"
    assert nouns.resolve("jersey", prefer=lambda n: items.get(n, 0)) == "jersey.n.03"
    assert nouns.resolve("jersey", prefer=lambda n: 1.0) == "new_jersey.n.01"
    # only synsets present in the taxonomy compete
    mammals = nouns.subtree("mammal.n.01")
    assert nouns.resolve("dog", prefer=lambda n: -1 if n == "dog.n.01" else 0) != "dog.n.01"
    assert mammals.resolve("dog", prefer=lambda n: -1 if n == "dog.n.01" else 0) == "dog.n.01"
    with pytest.raises(UnknownLabelError):
        mammals.resolve("sneaker")


@needs_wordnet
def test_unknown_label_suggestions(nouns):
    with pytest.raises(UnknownLabelError) as ei:
        nouns.resolve("sneekers")
    err = ei.value
    assert isinstance(err, TaxonomyError) and isinstance(err, ValueError)
    assert "sneaker" in err.suggestions
    assert "'sneekers'" in str(err) and "\n" not in str(err)
    with pytest.raises(UnknownLabelError) as ei:
        nouns.resolve("qqqqzzzz")
    assert ei.value.suggestions == []


@needs_wordnet
def test_complete(nouns):
    got = nouns.complete("sneak", limit=50)
    assert "sneaker" in got and "sneak.n.01" in got  # words and node names
    assert all(g.lower().startswith("sneak") for g in got)
    assert got == sorted(got, key=len)
    assert nouns.complete("Running Sh")[:1] == ["running_shoe"]
    assert "dog.n.01" in nouns.complete("dog.n", limit=100)
    assert len(nouns.complete("a", limit=7)) == 7
    assert nouns.complete("qqqqzzzz") == []
    assert nouns.words("dog.n.01") == ["dog", "domestic_dog", "Canis_familiaris"]
    assert nouns.resolve("canis familiaris") == "dog.n.01"


@needs_wordnet
@pytest.mark.slow
def test_noun_closure_tsv_roundtrip(nouns, tmp_path):
    path = tmp_path / "nouns.tsv"
    nouns.to_tsv(path)  # what `hypsearch taxonomy wordnet --out FILE` writes
    with open(path) as f:
        assert f.readline().startswith("#")
        assert sum(1 for _ in f) == 743241
    back = Taxonomy.from_tsv(path)
    assert back == nouns
    assert np.array_equal(back.closure_edges(), nouns.closure_edges())
    # words come from names in a plain TSV
    assert back.resolve("gym shoe") == "gym_shoe.n.01"


def test_random_dags_match_brute_force():
    rng = random.Random(20240607)
    for _ in range(25):
        n = rng.randint(2, 25)
        names = [f"n{i:02d}" for i in range(n)]
        # child i -> parent j < i: acyclic by construction
        given = [(names[i], names[j]) for i in range(1, n) for j in range(i) if rng.random() < 0.2]
        anc = {x: set() for x in names}
        for i in range(n):  # parents have smaller index: already complete
            for c, p in given:
                if c == names[i]:
                    anc[c] |= {p} | anc[p]
        closure = {(c, a) for c in names for a in anc[c]}
        direct = {(c, p) for c, p in closure if not any(p in anc[m] for m in anc[c])}
        extra = rng.sample(sorted(closure), len(closure) // 2)
        t = Taxonomy.from_edges(given + extra, nodes=names)
        assert t == Taxonomy.from_edges(sorted(direct), nodes=names)
        assert {(t.names[c], t.names[p]) for c, p in t.direct_edges().tolist()} == direct
        assert {(t.names[c], t.names[p]) for c, p in t.closure_edges().tolist()} == closure
        for x in names:
            assert t.ancestors(x) == anc[x]
            assert t.descendants(x) == {c for c in names if x in anc[c]}
            up_x = up_levels(t, x)
            # depth: shortest upward path to a root
            assert t.depth(x) == min(d for m, d in up_x.items() if not t.parents(m))
            y = rng.choice(names)
            up_y = up_levels(t, y)
            common = set(up_x) & set(up_y)
            assert t.hops(x, y) == (min(up_x[m] + up_y[m] for m in common) if common else None)
            lca = t.lca(x, y)
            if common:
                assert lca in common and t.depth(lca) == max(t.depth(m) for m in common)
            else:
                assert lca is None


def up_levels(t, x):
    """BFS over parents: ancestor-or-self -> shortest upward distance."""
    seen, cur, level = {x: 0}, [x], 0
    while cur:
        level += 1
        nxt = []
        for f in cur:
            for p in t.parents(f):
                if p not in seen:
                    seen[p] = level
                    nxt.append(p)
        cur = nxt
    return seen


def test_pickle_roundtrip(small):
    import pickle

    again = pickle.loads(pickle.dumps(small))
    assert again == small and again.hops("penguin", "robot_dog") == 5


def test_word_resolver_plurals_through_wordnet_morphology(tmp_path):
    from models.taxonomy.wordnet import WordResolver

    t = Taxonomy.from_edges(
        [
            ("sneaker.n.01", "shoe.n.01"),
            ("trouser.n.01", "garment.n.01"),
            ("box.n.01", "garment.n.01"),
        ]
    )
    (tmp_path / "noun.exc").write_text("geese goose\nmice mouse\n")
    words = WordResolver(t, tmp_path)
    assert words.resolve("sneakers") == "sneaker.n.01"  # suffix rule s -> ""
    assert words.resolve("Trousers") == "trouser.n.01"
    assert words.resolve("boxes") == "box.n.01"  # xes -> x
    assert words.base_forms("running geese") == ["running goose"]  # noun.exc
    assert words.base_forms("x" * 201) == []
    with pytest.raises(UnknownLabelError) as ei:
        words.resolve("hats")
    assert ei.value.text == "hats"  # the error of the text asked for, not of a base form


def test_with_words_keeps_a_taxonomy_that_is_not_wordnet(tmp_path):
    from models.taxonomy.graph import with_words

    t = Taxonomy.from_edges([("a", "b")])
    assert with_words(t, None) is t
    assert with_words(t, tmp_path) is t  # no data.noun there


@needs_wordnet
def test_with_words_adds_wordnet_words_to_synsets():
    from models.taxonomy.graph import with_words

    shoes = Taxonomy.from_wordnet(root="shoe.n.01")
    bare = Taxonomy.from_edges(((c, p) for c in shoes.names for p in shoes.parents(c)), shoes.names)
    assert bare.lemmas is None and bare == shoes
    with pytest.raises(UnknownLabelError):
        bare.resolve("sneaker")
    rich = with_words(bare, DEFAULT_WORDNET_DIR)
    assert rich == bare and rich.lemmas is not None
    assert rich.resolve("sneaker") == "gym_shoe.n.01"
    # the same nodes with other edges are not WordNet's: kept as they are
    flat = Taxonomy.from_edges([(n, "shoe.n.01") for n in shoes.names if n != "shoe.n.01"])
    assert with_words(flat, DEFAULT_WORDNET_DIR) is flat


def test_tsv_errors_name_the_file(tmp_path):
    with pytest.raises(TaxonomyError, match="is a directory"):
        Taxonomy.from_tsv(tmp_path)
    bad = tmp_path / "latin1.tsv"
    bad.write_bytes(b"a\tb\nc\xe9\tb\n")
    with pytest.raises(TaxonomyError, match=r"latin1\.tsv: not UTF-8 text"):
        Taxonomy.from_tsv(bad)
    crlf = tmp_path / "crlf.tsv"
    crlf.write_bytes(b"# header\r\na\tb\r\nb\tc\r\nc\ta\r\n")
    with pytest.raises(TaxonomyError, match=r"crlf\.tsv:4: cycle"):
        Taxonomy.from_tsv(crlf)
