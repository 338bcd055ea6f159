"""Worker side of the INA testbed: the agent (INA, ring and Rina all-reduce), data allocation, training, the torch hook."""
