"""CUDA access for stubhost, loaded lazily: importing stubhost never needs a GPU or CUDA libraries.

:mod:`stubhost.gpu.cuda` talks to the CUDA runtime through cupy when it is installed (the
``[gpu]`` extra) and otherwise through a cffi binding to ``libcudart``.
"""
