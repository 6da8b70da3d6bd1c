"""Swapping an existing model's Keras LSTM/GRU layers for pycudnnrnn's."""

from __future__ import annotations

import keras

from .layers import GRU, LSTM, Bidirectional


def _ours(layer):
    """Our layer for a Keras LSTM/GRU (same config, so the same name and weights), else None."""
    for keras_cls, our_cls in ((keras.layers.LSTM, LSTM), (keras.layers.GRU, GRU)):
        if type(layer) is keras_cls:
            return our_cls.from_config(layer.get_config())
    return None


def _clone(layer):
    ours = _ours(layer)
    if ours is not None:
        return ours
    if isinstance(layer, keras.layers.Bidirectional):
        forward, backward = _ours(layer.forward_layer), _ours(layer.backward_layer)
        if forward is not None and backward is not None:
            config = layer.get_config()
            return Bidirectional(
                forward, merge_mode=layer.merge_mode, backward_layer=backward,
                name=layer.name, dtype=config.get("dtype"), trainable=layer.trainable)
    return layer.__class__.from_config(layer.get_config())


def replace_layers(model):
    """A copy of `model` whose ``keras.layers.LSTM`` and ``GRU`` layers are ours.

    Each one, alone or inside ``keras.layers.Bidirectional`` (which becomes
    ``pycudnnrnn.keras.Bidirectional``), becomes ``pycudnnrnn.keras.LSTM`` / ``GRU``
    built from its config (same name, same arguments); every other layer is cloned as ``keras.models.clone_model`` clones it.
    The copy gets the model's weights, so it computes the same function.

    Parameters
    ----------
    model : keras.Sequential or functional keras.Model
        Built (it has weights). A subclassed model cannot be cloned by Keras: build its
        layers from ``pycudnnrnn.keras`` instead, and ``set_weights`` them.

    Returns
    -------
    keras.Model
        Not compiled (compile it as the original was).
    """
    if not model.built:
        raise ValueError("model: expected a built model (with weights), got an unbuilt one")
    clone = keras.models.clone_model(model, clone_function=_clone)
    clone.set_weights(model.get_weights())
    return clone
