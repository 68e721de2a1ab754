"""hypsearch service: the ``hypsearch`` CLI and the REST API."""
