"""The cuDNN 9 binding: loading the library, the C-mirror prototype table, descriptors.

This package knows nothing of CuPy: it deals in ctypes, integers and device pointers.
"""
