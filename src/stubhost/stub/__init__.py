"""The stub: the process that runs one model instance (``python -m stubhost.stub SPEC``).

It never imports the parent side (``stubhost.host``); it knows the pool, the protocol and pb_utils.
"""
