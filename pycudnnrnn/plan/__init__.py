"""Plans: everything one RNN call needs that the data does not, built once and reused.

``RNNPlan`` (``.rnn_plan``) checks a run's arrays and hands them to its backend's
executor, whose contract ``.backend`` writes down; ``.buffers`` checks the buffers a
caller hands a run; ``.cache`` keeps the plans the functional API and the framework
adapters reuse. This face keeps the names callers use: ``plan.for_call``,
``plan.RNNPlan``, ``plan.ForwardAddresses`` (what ``RNNPlan.forward_at`` takes), ...
"""

from ..core.arrays import BackpropAddresses, ForwardAddresses
from .cache import (_adapter_plans, _buffer_sizes, _dropout_plans, _plans, buffer_nbytes,
                    clear_caches, for_adapter, for_call, lengths_key, reserve_nbytes)
from .rnn_plan import RNNPlan

__all__ = ["BackpropAddresses", "ForwardAddresses", "RNNPlan", "buffer_nbytes", "clear_caches",
           "for_adapter", "for_call", "lengths_key", "reserve_nbytes"]
