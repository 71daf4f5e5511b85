"""Each framework's storage rules, one module per framework, as ``backends/`` has one per device family.

What a rank holds for a parameter, its gradient and its optimizer state depends on who laid the
memory out. The ledger (``tracking/ledger.py``) counts rows; these modules say what to count:

- ``plain``: torch's own tensors: a tensor's own bytes, or the whole storage a saved view keeps alive;
- ``dtensor``: FSDP2 and tensor parallelism: a DTensor holds its local shard;
- ``deepspeed``: DeepSpeed ZeRO: a stage-3 parameter holds its partition (``ds_tensor``); its engine's
  steps; the version check and the log of why rows are absent;
- ``zero``: DeepSpeed ZeRO's flat partitions (fp32 master weights, optimizer state, gradients)
  mapped back to the parameters by DeepSpeed's own fragment offsets, counted at its optimizer steps.

No module here imports a framework: each reads the attributes the framework put on torch's tensors
and optimizers, so importing memexporter never imports DeepSpeed.
"""
