"""The params layout held against cuDNN's own: ``cudnnGetRNNWeightParams`` per weight slot.

Each RNN descriptor's weight space is compared once with ``pycudnnrnn.core.layout``, piece
by piece, in cuDNN's terms: (pseudo_layer, linLayerID, kind, offset, size).
"""

from __future__ import annotations

import numpy as np

from ..core import layout
from ..core.config import GATES, RNNConfig
from ..cudnn import rnn
from ..cudnn.descriptors import DropoutDescriptor, RNNDescriptor, TensorDescriptor


def weight_slot(config: RNNConfig, piece: layout.Piece) -> int:
    """cuDNN's linLayerID of a piece: input matrices of gates 0..G-1, recurrent ones
    G..2G-1 (gates in ``GATES`` order), the LSTM projection 2G."""
    G = config.num_gates
    if piece.role == "projection":
        return 2 * G
    return GATES[config.rnn_mode].index(piece.gate) + (G if piece.role == "recurrent" else 0)


def expected_table(config: RNNConfig):
    """Our layout as sorted (pseudo_layer, linLayerID, kind, offset, size) rows."""
    return sorted((p.pseudo_layer, weight_slot(config, p), p.kind, p.offset, p.size)
                  for p in layout.pieces(config))


def weight_params(cupy, handle, desc: RNNDescriptor):
    """cuDNN's weight space of `desc`: (bytes, rows as in ``expected_table``).

    Pieces cuDNN reports as absent (skip input's layer-0 matrices, the projection's
    bias) are left out. Sizes, not shapes, are compared: the dims cuDNN reports are
    metadata and may carry unit axes.
    """
    c, itemsize = desc.config, desc.dtype.itemsize
    nbytes = rnn.weight_space_size(handle, desc)
    # cudnnGetRNNWeightParams only adds offsets to the weight space's address and never
    # reads or writes it: a small real block gives it a base (a whole weight space would
    # cost 400 MB at 100M parameters, once per new descriptor, for arithmetic).
    space = cupy.empty(256, dtype=cupy.uint8)
    base = space.data.ptr
    slots = 2 * c.num_gates + (1 if c.num_proj else 0)
    table = []
    with TensorDescriptor() as m_desc, TensorDescriptor() as b_desc:
        for k in range(c.num_pseudo_layers):
            for lin in range(slots):
                m_addr, b_addr = rnn.weight_params(handle, desc, k, nbytes, base, lin,
                                                   m_desc, b_desc)
                for kind, addr, tensor in (("weight", m_addr, m_desc), ("bias", b_addr, b_desc)):
                    if addr:
                        count = int(np.prod(tensor.read()["dims"]))
                        table.append((k, lin, kind, (addr - base) // itemsize, count))
    return nbytes, table


def cudnn_weight_table(config: RNNConfig, dtype=np.float32):
    """cuDNN's weight space for `config` on the current GPU, as ``weight_params`` gives it.

    Builds a throwaway descriptor (no dropout); for the layout tests and diagnosis.
    """
    from ..core import gpu
    from . import resources
    cupy = gpu.cupy()
    handle = resources.handle(cupy)
    with DropoutDescriptor() as dropout:
        dropout.set(handle, 0.0, 0, 0, 0)
        with RNNDescriptor(config, np.dtype(dtype), dropout) as desc:
            return weight_params(cupy, handle, desc)


def check_layout(cupy, handle, desc: RNNDescriptor):
    """Raise if cuDNN's weight space disagrees with ``pycudnnrnn.core.layout`` (a bug there)."""
    nbytes, table = weight_params(cupy, handle, desc)
    expected_nbytes = layout.params_size(desc.config) * desc.dtype.itemsize
    problems = []
    if nbytes != expected_nbytes:
        problems.append(f"weight space is {nbytes} bytes, layout says {expected_nbytes}")
    expected = expected_table(desc.config)
    if sorted(table) != expected:
        diff = sorted(set(table) ^ set(expected))[:6]
        problems.append(f"pieces differ (pseudo_layer, linLayerID, kind, offset, size): {diff}")
    if problems:
        raise RuntimeError(f"pycudnnrnn's params layout disagrees with cuDNN for {desc.config} "
                           f"({desc.dtype}): " + "; ".join(problems) + ". Please report this.")
