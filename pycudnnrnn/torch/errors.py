"""What ``pycudnnrnn.torch``'s modules raise for bad calls: the library's ValueError or
TypeError and, at once, the exception torch.nn raises there (other people's code catches
either)."""


class InputValueError(ValueError, RuntimeError):
    """A bad shape or value given to a module: torch.nn raises RuntimeError there, the
    library's contract says ValueError; this is both."""


class InputTypeError(TypeError, ValueError, RuntimeError):
    """A bad dtype, device or kind of argument: the library's TypeError, and what
    torch.nn raises for it (ValueError for the input's dtype, RuntimeError otherwise)."""
