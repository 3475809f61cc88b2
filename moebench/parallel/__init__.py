"""Beyond one GPU (docs/scale-out.md): ``shards`` (``--shard I/N`` or a Slurm array), ``workers``
(``--devices``: one worker process per GPU of a node) and ``merge`` (``moebench merge``). None of it
needs NCCL or any collective; every module here is torch-free at import."""
