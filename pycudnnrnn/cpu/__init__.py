"""The CPU backend: cuDNN's RNN math in NumPy (``rnn``), run by a plan's ``executor``.

It is the oracle every GPU test is held against, and a real CPU fallback. It imports
``core`` only: never the CUDA backend.
"""
