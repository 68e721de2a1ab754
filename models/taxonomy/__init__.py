"""Label hierarchies: the taxonomy DAG, its files, its words, WordNet.

* :mod:`.graph` -- :class:`~models.taxonomy.graph.Taxonomy`: a DAG of string
  node names with integer ids (built from edges, a TSV file or WordNet);
* :mod:`.base` -- what the taxonomy modules share: errors, the word key, a GC pause;
* :mod:`.tsv` -- ``child<TAB>parent`` edge lists, read and written;
* :mod:`.words` -- word -> node resolution, autocompletion, suggestions;
* :mod:`.wordnet` -- the WordNet 3.0 noun database reader;
* :mod:`.defaults` -- the embedded default taxonomy (Fashion-MNIST's classes in WordNet).
"""
