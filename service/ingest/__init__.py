"""Ingest: pictures -> vectors -> an index, above both ``models`` and ``indexing``.

The one pipeline of ``hypsearch index build`` and ``hypsearch embed``, the
index jobs (``POST /v1/index/jobs``, :mod:`service.jobs`), the demo and the
Ray build:

* :mod:`.roots` -- the data roots: the one check of the paths a request names;
* :mod:`.plans` -- what a build reads (a built-in split, a folder, a manifest);
* :mod:`.build` -- decoding and embedding in batches (:func:`~service.ingest.build.embed_plan`)
  and the local build (:func:`~service.ingest.build.build_index`);
* :mod:`.ray_build` -- the same build with the embedding on Ray Data.

The vectors go into the index through :mod:`indexing.batches` (durable batch
by batch, resumable), which knows vectors and payloads, not images.
"""
