"""Integrations of rsar with other projects, each an optional extra, on the public API only.

- ``rsar_core.integrations.transformers`` (``pip install "rsar[transformers]"``): shard a
  Hugging Face model by its ``base_model_tp_plan`` and run its row-parallel layers through
  rsar's all-reduce op.
"""
