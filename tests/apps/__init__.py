"""Applications (handler registries) the worker tests run, in-process and as subprocesses."""
