"""The command line and what stands behind it: ``cli`` (``pycudnnrnn info|check|bench``),
``environment`` (versions and devices), ``selfcheck`` and ``bench``.

Nothing in the package imports ``tools`` but ``__main__``.
"""
