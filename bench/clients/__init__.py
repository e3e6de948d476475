"""The benchmarks' clients: the HTTP load generator, the lean HTTP/1.1 client, the direct worker client."""
