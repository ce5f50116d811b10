"""OpenAI's Files and Batch APIs, the part that does no I/O: what a file and a batch object
are (`objects`), the interface of the stores that keep them (`Records`, kept by router/store/),
and how an input file is checked and its lines ordered (`inputs`). The HTTP handlers and the
runner that answers a batch's lines live in router/http/ (endpoints/files.py, batches.py)."""
