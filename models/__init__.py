"""hypsearch models: geometry, taxonomies, label embeddings and image encoders.

Everything learned and every formula lives here; ``indexing`` and ``service``
call into it.
"""
