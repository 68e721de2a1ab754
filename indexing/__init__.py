"""hypsearch indexing: the durable store and hyperbolic nearest-neighbour search."""
