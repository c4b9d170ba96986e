"""hcoll: hierarchical all-reduce. (Placeholder until the binding lands:
the ctypes binding and its Comm come from the `py` work; this package
currently carries the torch.distributed backend only, in hcoll.torch.)"""
