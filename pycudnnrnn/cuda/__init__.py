"""The CUDA backend: cuDNN on CuPy arrays.

``executor`` runs a plan (``staging`` moves data between the caller's layout and
cuDNN's, ``reserve`` keeps the reserve space); ``resources`` keeps handles, descriptors
and dropout states between calls; ``weight_space`` holds our params layout against
cuDNN's weight slots; ``graphs`` captures plan runs in CUDA graphs; ``foreign`` handles
other libraries' arrays (their stream, their lifetime); ``lifetime`` says when the
device memory handed to cuDNN (plans', dropout states', a foreign capture's
temporaries) may go, and ``waiter`` frees what waits for the GPU; ``building`` builds
plans and dropout states outside a capture. It imports ``core`` and the binding
``cudnn``: never the CPU backend.
"""
