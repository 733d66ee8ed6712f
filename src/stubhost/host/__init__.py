"""The parent side: model repository, stub launcher, health monitor, model instances, in-process API.

Never imported by the stub.
"""
