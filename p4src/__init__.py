"""The data plane: ``ina.p4`` (P4_16, v1model), its P4Info, and the program's one model in Python.

- ``ina_model``: ``InaPipeline``, the executable model of ``ina.p4``, control by control and name for name
  (the embedded switch runs it, and so does a Rina host member's copy of a chain);
- ``tables``: the program's tables, actions, counters and registers by P4Info name;
- ``v1model``: what BMv2's ``simple_switch`` does around the program (drop port, replication order, the
  P4Runtime port);
- ``p4info``: the committed P4Info (``load_p4info``); ``p4source``: the same derived from ``ina.p4`` without p4c.
"""
