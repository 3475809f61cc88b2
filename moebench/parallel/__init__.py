"""Beyond one GPU: shards of a sweep (a flag or a Slurm array), one worker process per GPU of a node,
and merging shard results back into one results file. None of it needs NCCL or any collective.

- ``shards``: ``--shard I/N`` (or the Slurm environment) runs a deterministic, cost-balanced part of
  the cases.
- ``workers``: ``--devices all|0,1,..`` runs one worker process per GPU of this node.
- ``merge``: ``moebench merge`` joins shard files and checks they are shards of one run.

Both at once: a Slurm array over nodes, every GPU of each node. Every module here is torch-free at
import.
"""
